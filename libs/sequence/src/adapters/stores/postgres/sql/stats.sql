-- stats: counts of a box for metrics and health checks (each count reads its partial index).
--
-- No parameters.
--
-- Returns one row: pending bigint, failed bigint, oldest_pending_at float8 ms (NULL when none).
SELECT
  (SELECT count(*) FROM {{table}} WHERE status = 'PENDING') AS pending,
  (SELECT count(*) FROM {{table}} WHERE status = 'FAILED') AS failed,
  (
    SELECT round(extract(epoch FROM min(created_at)) * 1000)::float8
    FROM {{table}} WHERE status = 'PENDING'
  ) AS oldest_pending_at
