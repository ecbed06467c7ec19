-- Gives up on FAILED records of a box ({{table}}) by id (an operator's decision): each is marked
-- COMPLETED as of @now, never handed out again and purged with the completed records after the
-- box's retention. Its id stays known meanwhile: a copy received or appended again is a duplicate.
-- Records that are not FAILED (pending, completed) and unknown ids are left alone.
-- Parameters: @ids (a JSON array of ids), @now (ms). Returns: changes = records discarded.
UPDATE {{table}}
SET status = 'COMPLETED', completed_at = @now
WHERE status = 'FAILED' AND id IN (SELECT value FROM json_each(@ids))
