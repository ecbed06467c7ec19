-- get: one record by id.
--
-- $1 text  id
--
-- Returns the record (_record-columns), or no row.
SELECT
  -- @include _record-columns
FROM {{table}}
WHERE id = $1
