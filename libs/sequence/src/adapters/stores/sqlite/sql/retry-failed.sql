-- Puts FAILED records of a box ({{table}}) back to PENDING, due at @now, with 0 attempts
-- (last_error is kept for the record's history). Ids that are not FAILED are left alone.
-- Parameters: @ids (a JSON array of ids), @now (ms). Returns: changes = records put back.
UPDATE {{table}}
SET status = 'PENDING', attempts = 0, next_attempt_at = @now
WHERE status = 'FAILED' AND id IN (SELECT value FROM json_each(@ids))
