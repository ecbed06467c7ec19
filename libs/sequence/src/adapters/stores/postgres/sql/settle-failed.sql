-- settle-failed: records of a claim whose outcome is `failed`: FAILED, with the error, until
-- retry-failed puts them back.
--
-- $1 bigint[]  seqs       $2 text[]  errors, one per seq
--
-- Returns nothing (rowCount: records updated).
UPDATE {{table}} AS record
SET status = 'FAILED',
    attempts = record.attempts + 1,
    last_error = outcome.error
FROM unnest($1::bigint[], $2::text[]) AS outcome(seq, error)
WHERE record.seq = outcome.seq
