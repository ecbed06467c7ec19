-- Gives up on FAILED records of a box ({{table}}) by id (an operator's decision): each is marked
-- COMPLETED as of @now, never handed out again and purged with the completed records after the
-- box's retention. Its next_attempt_at is set to -1 (ms), which no other row has: the store reads
-- such a record DISCARDED, not COMPLETED (it was never handled; the schema's status check has no
-- DISCARDED, and claims and indexes take COMPLETED as finished). last_error is kept. Its id
-- stays known meanwhile: a copy received or appended again is a duplicate.
-- Records that are not FAILED (pending, completed) and unknown ids are left alone.
-- Parameters: @ids (a JSON array of ids), @now (ms). Returns: changes = records discarded.
UPDATE {{table}}
SET status = 'COMPLETED', completed_at = @now, next_attempt_at = -1
WHERE status = 'FAILED' AND id IN (SELECT value FROM json_each(@ids))
