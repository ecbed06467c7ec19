-- discard-failed: deletes FAILED records by id, for good (an operator gave up on them), and wakes
-- up watchers when it deleted any (in an ordered box, the records held back behind a discarded one
-- are due now). Records that are not FAILED (pending, completed) and unknown ids are left alone.
--
-- $1 text[]  ids      $2 text  notify channel      $3 text  box name
--
-- Returns one row: discarded bigint.
WITH discarded AS (
  DELETE FROM {{table}}
  WHERE id = ANY($1::text[]) AND status = 'FAILED'
  RETURNING 1
)
SELECT
  (SELECT count(*) FROM discarded) AS discarded,
  (SELECT count(*) FROM (SELECT pg_notify($2, $3) FROM discarded LIMIT 1) AS woken) AS woken
