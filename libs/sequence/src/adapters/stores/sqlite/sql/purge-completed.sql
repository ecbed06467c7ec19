-- Deletes up to @limit COMPLETED records of a box ({{table}}) completed before @before.
-- PENDING and FAILED records are never deleted.
-- Parameters: @before (ms), @limit. Returns: changes = records deleted.
DELETE FROM {{table}}
WHERE seq IN (
  SELECT seq FROM {{table}}
  WHERE status = 'COMPLETED' AND completed_at < @before
  LIMIT @limit
)
