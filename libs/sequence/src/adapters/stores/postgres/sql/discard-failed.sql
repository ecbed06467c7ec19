-- discard-failed: gives up on FAILED records by id (an operator's decision): each is marked
-- COMPLETED as of now, never handed out again and purged with the completed records after the
-- box's retention. Its next_attempt_at is set one millisecond before the epoch, which no other
-- row has: the store reads such a record DISCARDED, not COMPLETED (it was never handled; the
-- schema's status check has no DISCARDED, and claims and indexes take COMPLETED as finished).
-- last_error, the failure's, is kept. Its id stays known meanwhile, so that a copy received or
-- appended again is a duplicate rather than a new record. Wakes up watchers when it discarded any
-- (in an ordered box, the records held back behind a discarded one are due now). Records that
-- are not FAILED (pending, completed) and unknown ids are left alone.
--
-- $1 text[]  ids      $2 text  notify channel      $3 text  box name      $4 float8  now (ms)
--
-- Returns one row: discarded bigint.
WITH discarded AS (
  UPDATE {{table}}
  SET status = 'COMPLETED',
      completed_at = to_timestamp($4::float8 / 1000),
      next_attempt_at = to_timestamp(-0.001)
  WHERE id = ANY($1::text[]) AND status = 'FAILED'
  RETURNING 1
)
SELECT
  (SELECT count(*) FROM discarded) AS discarded,
  (SELECT count(*) FROM (SELECT pg_notify($2, $3) FROM discarded LIMIT 1) AS woken) AS woken
