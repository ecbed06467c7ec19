-- claim-due: locks the first due PENDING records of a box, in seq order, skipping rows another
-- claim holds (unordered claims).
--
-- $1 float8  now (ms)       $2 integer  limit
--
-- Returns the records (_record-columns), seq ascending.
SELECT
  -- @include _record-columns
FROM {{table}}
WHERE status = 'PENDING' AND next_attempt_at <= to_timestamp($1::float8 / 1000)
ORDER BY seq
LIMIT $2
FOR UPDATE SKIP LOCKED
