-- settle-retry: records of a claim whose outcome is `retry`: they stay PENDING, not due before
-- their own next attempt time, and keep the error.
--
-- $1 bigint[]  seqs       $2 float8[]  nextAttemptAt (ms), one per seq       $3 text[]  errors
--
-- Returns nothing (rowCount: records updated).
UPDATE {{table}} AS record
SET attempts = record.attempts + 1,
    next_attempt_at = to_timestamp(outcome.next_attempt_at / 1000),
    last_error = outcome.error
FROM unnest($1::bigint[], $2::float8[], $3::text[]) AS outcome(seq, next_attempt_at, error)
WHERE record.seq = outcome.seq
