-- Deletes FAILED records of a box ({{table}}) by id, for good (an operator gave up on them).
-- Records that are not FAILED (pending, completed) and unknown ids are left alone.
-- Parameters: @ids (a JSON array of ids). Returns: changes = records deleted.
DELETE FROM {{table}}
WHERE status = 'FAILED' AND id IN (SELECT value FROM json_each(@ids))
