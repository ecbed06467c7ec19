-- claim-followers: the second step of an ordered claim. Locks the due PENDING records that
-- follow the heads just claimed in their partitions, when nothing between them holds them back
-- (no earlier record of the partition that is FAILED or not due yet). The caller keeps a
-- follower only when open_before equals the number of its partition's records already in the
-- batch: a skipped row (locked by someone else) would otherwise leave a hole in the order.
--
-- $1 float8    now (ms)                 $2 text[]   partition keys of the heads
-- $3 bigint[]  seqs already in the batch    $4 integer  most records to add
-- $5 float8    horizon (ms) or NULL: due as in claim-due
--
-- Returns the records (_record-columns) and open_before (bigint: earlier unfinished records of
-- the partition), seq ascending.
SELECT
  -- @include _record-columns
  ,
  (
    SELECT count(*) FROM {{table}} AS earlier
    WHERE earlier.partition_key = record.partition_key
      AND earlier.seq < record.seq
      AND earlier.status <> 'COMPLETED'
  ) AS open_before
FROM {{table}} AS record
WHERE record.partition_key = ANY($2::text[])
  AND record.status = 'PENDING'
  AND (
    record.next_attempt_at <= to_timestamp($1::float8 / 1000)
    OR record.next_attempt_at > coalesce(to_timestamp($5::float8 / 1000), record.next_attempt_at)
  )
  AND record.seq <> ALL($3::bigint[])
  AND NOT EXISTS (
    SELECT 1 FROM {{table}} AS blocking
    WHERE blocking.partition_key = record.partition_key
      AND blocking.seq < record.seq
      AND blocking.status <> 'COMPLETED'
      AND NOT (
        blocking.status = 'PENDING'
        AND (
          blocking.next_attempt_at <= to_timestamp($1::float8 / 1000)
          OR blocking.next_attempt_at
            > coalesce(to_timestamp($5::float8 / 1000), blocking.next_attempt_at)
        )
      )
  )
ORDER BY record.seq
LIMIT $4
FOR UPDATE OF record SKIP LOCKED
