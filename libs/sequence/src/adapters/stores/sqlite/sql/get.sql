-- The record of a box ({{table}}) with this id.
-- Parameters: @id. Returns: one record row, or none.
SELECT seq, id, kind, type, partition_key, body, headers, status, attempts, next_attempt_at,
  last_error, created_at, completed_at
FROM {{table}}
WHERE id = @id
