-- Outcome `completed` of a claimed record of a box ({{table}}).
-- Parameters: @id, @now (ms). Returns: changes = 1 (0 if the record is no longer PENDING).
UPDATE {{table}}
SET status = 'COMPLETED', attempts = attempts + 1, completed_at = @now
WHERE id = @id AND status = 'PENDING'
