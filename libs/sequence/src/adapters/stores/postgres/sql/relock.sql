-- relock: takes again the row locks of records whose claim's transaction was lost (its
-- connection broke during the handler), waiting for that transaction's server process to let go
-- of them, and returns each record's state now: another claim may have handled it meanwhile.
--
-- $1 bigint[]  seqs
--
-- Returns seq, status, attempts for the records still there.
SELECT seq, status, attempts
FROM {{table}}
WHERE seq = ANY($1::bigint[])
FOR UPDATE
