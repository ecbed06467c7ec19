-- discard-failed: deletes FAILED records by id, for good (an operator gave up on them). Records
-- that are not FAILED (pending, completed) and unknown ids are left alone.
--
-- $1 text[]  ids
--
-- Returns one row: discarded bigint.
WITH discarded AS (
  DELETE FROM {{table}}
  WHERE id = ANY($1::text[]) AND status = 'FAILED'
  RETURNING 1
)
SELECT count(*) AS discarded FROM discarded
