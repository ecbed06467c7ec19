-- Appends one record to a box ({{table}}) unless the box already holds its id.
-- Parameters: @id, @kind, @type, @partitionKey (NULL for none), @body, @headers (JSON object
-- text), @createdAt (ms).
-- Returns: changes = 1 when added, 0 when the id was there (the stored record stays as it is).
INSERT INTO {{table}}
  (id, kind, type, partition_key, body, headers, status, attempts, next_attempt_at, created_at)
VALUES
  (@id, @kind, @type, @partitionKey, @body, @headers, 'PENDING', 0, 0, @createdAt)
ON CONFLICT (id) DO NOTHING
