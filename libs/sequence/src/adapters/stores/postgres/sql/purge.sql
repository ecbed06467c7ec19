-- purge: deletes one batch of COMPLETED records completed before a time, oldest first,
-- skipping rows another purge holds (so that concurrent purges do not wait on each other).
--
-- $1 float8  completedBefore (ms)       $2 integer  batch size
--
-- Returns nothing (rowCount: records deleted).
DELETE FROM {{table}}
WHERE seq IN (
  SELECT seq FROM {{table}}
  WHERE status = 'COMPLETED' AND completed_at < to_timestamp($1::float8 / 1000)
  ORDER BY completed_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED
)
