-- claim-due: locks the first due PENDING records of a box, in seq order, skipping rows another
-- claim holds (unordered claims). Due: next_attempt_at at or before now, or after the horizon
-- (a retry time written on a clock ahead of the caller's; NULL: none).
--
-- $1 float8  now (ms)       $2 integer  limit       $3 float8  horizon (ms) or NULL
--
-- Returns the records (_record-columns), seq ascending.
SELECT
  -- @include _record-columns
FROM {{table}}
WHERE status = 'PENDING'
  AND (
    next_attempt_at <= to_timestamp($1::float8 / 1000)
    OR next_attempt_at > coalesce(to_timestamp($3::float8 / 1000), next_attempt_at)
  )
ORDER BY seq
LIMIT $2
FOR UPDATE SKIP LOCKED
