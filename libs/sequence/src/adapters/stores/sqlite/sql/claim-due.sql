-- Due PENDING records of a box ({{table}}), in seq order, for an unordered claim.
-- Parameters: @now (ms), @limit. Returns: up to @limit record rows.
SELECT seq, id, kind, type, partition_key, body, headers, status, attempts, next_attempt_at,
  last_error, created_at, completed_at
FROM {{table}}
WHERE status = 'PENDING' AND next_attempt_at <= @now
ORDER BY seq
LIMIT @limit
