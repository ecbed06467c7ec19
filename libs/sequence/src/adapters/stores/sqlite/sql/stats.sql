-- Counts of a box ({{table}}).
-- Parameters: none.
-- Returns: one row { pending, failed, oldest_pending_at (ms, NULL when nothing is PENDING) }.
SELECT
  (SELECT count(*) FROM {{table}} WHERE status = 'PENDING') AS pending,
  (SELECT count(*) FROM {{table}} WHERE status = 'FAILED') AS failed,
  (SELECT min(created_at) FROM {{table}} WHERE status = 'PENDING') AS oldest_pending_at
