-- FAILED records of a box ({{table}}), oldest (lowest seq) first.
-- Parameters: @limit. Returns: up to @limit record rows.
SELECT seq, id, kind, type, partition_key, body, headers, status, attempts, next_attempt_at,
  last_error, created_at, completed_at
FROM {{table}}
WHERE status = 'FAILED'
ORDER BY seq
LIMIT @limit
