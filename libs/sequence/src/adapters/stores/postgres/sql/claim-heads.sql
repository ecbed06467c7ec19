-- claim-heads: the first step of an ordered claim. Locks due PENDING records that have no
-- earlier unfinished (PENDING or FAILED) record in their partition, in seq order, skipping rows
-- another claim holds. A record another claim holds is still PENDING, so the records after it
-- in its partition are not heads: two claims never hand out one partition's records at once.
-- Records appended by transactions that have not committed yet are invisible here: appends to
-- one partition that commit out of seq order may be handed out in commit order.
--
-- Due as in claim-due.
--
-- $1 float8  now (ms)       $2 integer  limit       $3 float8  horizon (ms) or NULL
--
-- Returns the records (_record-columns), seq ascending.
SELECT
  -- @include _record-columns
FROM {{table}} AS record
WHERE record.status = 'PENDING'
  AND (
    record.next_attempt_at <= to_timestamp($1::float8 / 1000)
    OR record.next_attempt_at > coalesce(to_timestamp($3::float8 / 1000), record.next_attempt_at)
  )
  AND (
    record.partition_key IS NULL
    OR NOT EXISTS (
      SELECT 1 FROM {{table}} AS earlier
      WHERE earlier.partition_key = record.partition_key
        AND earlier.seq < record.seq
        AND earlier.status <> 'COMPLETED'
    )
  )
ORDER BY record.seq
LIMIT $2
FOR UPDATE OF record SKIP LOCKED
