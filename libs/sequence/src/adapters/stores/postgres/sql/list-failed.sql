-- list-failed: FAILED records, oldest (lowest seq) first.
--
-- $1 integer  limit
--
-- Returns the records (_record-columns).
SELECT
  -- @include _record-columns
FROM {{table}}
WHERE status = 'FAILED'
ORDER BY seq
LIMIT $1
