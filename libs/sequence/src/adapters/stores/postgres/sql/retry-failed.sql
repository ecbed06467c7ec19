-- retry-failed: puts FAILED records back to PENDING, due at `now`, with 0 attempts (the last
-- error is kept for the record), and wakes up watchers when it changed any. Ids that are not
-- FAILED (or not there) are left alone.
--
-- $1 text[]  ids      $2 float8  now (ms)      $3 text  notify channel      $4 text  box name
--
-- Returns one row: retried bigint.
WITH retried AS (
  UPDATE {{table}}
  SET status = 'PENDING', attempts = 0, next_attempt_at = to_timestamp($2::float8 / 1000)
  WHERE id = ANY($1::text[]) AND status = 'FAILED'
  RETURNING 1
)
SELECT
  (SELECT count(*) FROM retried) AS retried,
  (SELECT count(*) FROM (SELECT pg_notify($3, $4) FROM retried LIMIT 1) AS woken) AS woken
