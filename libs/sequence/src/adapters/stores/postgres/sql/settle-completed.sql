-- settle-completed: records of a claim whose outcome is `completed`, in the claim's transaction.
--
-- $1 bigint[]  seqs       $2 float8  now (ms): completedAt
--
-- Returns nothing (rowCount: records updated).
UPDATE {{table}}
SET status = 'COMPLETED',
    attempts = attempts + 1,
    completed_at = to_timestamp($2::float8 / 1000)
WHERE seq = ANY($1::bigint[])
