-- Due PENDING records of a box ({{table}}), in seq order, for an ordered claim: a record with a
-- partition key is taken only when every earlier unfinished record of its partition is itself
-- due and PENDING. Those earlier ones have lower seqs and qualify too, so a batch (a prefix of
-- this order) holds them before it: a record is handed out after its whole partition's past.
-- A PENDING record not yet due, or a FAILED one, holds back the rest of its partition only.
-- Due as in claim-due.sql.
-- Parameters: @now (ms), @horizon (ms or NULL), @limit. Returns: up to @limit record rows.
SELECT seq, id, kind, type, partition_key, body, headers, status, attempts, next_attempt_at,
  last_error, created_at, completed_at
FROM {{table}} AS candidate
WHERE candidate.status = 'PENDING'
  AND (
    candidate.next_attempt_at <= @now
    OR candidate.next_attempt_at > coalesce(@horizon, candidate.next_attempt_at)
  )
  AND (
    candidate.partition_key IS NULL
    OR NOT EXISTS (
      SELECT 1
      FROM {{table}} AS earlier
      WHERE earlier.partition_key = candidate.partition_key
        AND earlier.seq < candidate.seq
        AND earlier.status <> 'COMPLETED'
        AND NOT (
          earlier.status = 'PENDING'
          AND (
            earlier.next_attempt_at <= @now
            OR earlier.next_attempt_at > coalesce(@horizon, earlier.next_attempt_at)
          )
        )
    )
  )
ORDER BY candidate.seq
LIMIT @limit
