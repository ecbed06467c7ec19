-- Outcome `retry` of a claimed record of a box ({{table}}): stays PENDING, due again at
-- @nextAttemptAt.
-- Parameters: @id, @nextAttemptAt (ms), @error. Returns: changes = 1 (0 if no longer PENDING).
UPDATE {{table}}
SET attempts = attempts + 1, next_attempt_at = @nextAttemptAt, last_error = @error
WHERE id = @id AND status = 'PENDING'
