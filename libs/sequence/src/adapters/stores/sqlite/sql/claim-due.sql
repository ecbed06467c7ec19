-- Due PENDING records of a box ({{table}}), in seq order, for an unordered claim. Due:
-- next_attempt_at at or before @now, or after @horizon (a retry time written on a clock ahead of
-- the caller's; NULL: none).
-- Parameters: @now (ms), @horizon (ms or NULL), @limit. Returns: up to @limit record rows.
SELECT seq, id, kind, type, partition_key, body, headers, status, attempts, next_attempt_at,
  last_error, created_at, completed_at
FROM {{table}}
WHERE status = 'PENDING'
  AND (next_attempt_at <= @now OR next_attempt_at > coalesce(@horizon, next_attempt_at))
ORDER BY seq
LIMIT @limit
