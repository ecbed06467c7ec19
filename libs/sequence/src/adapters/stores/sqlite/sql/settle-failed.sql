-- Outcome `failed` of a claimed record of a box ({{table}}): FAILED until retried.
-- Parameters: @id, @error. Returns: changes = 1 (0 if the record is no longer PENDING).
UPDATE {{table}}
SET status = 'FAILED', attempts = attempts + 1, last_error = @error
WHERE id = @id AND status = 'PENDING'
