-- delete-completed: records of a claim whose outcome is `completed`, deleted in the claim's
-- transaction instead of marked COMPLETED (a box with no retention: `retentionMs: 0`). A delete
-- writes no new version of the row and no index entries, where the UPDATE to COMPLETED writes
-- both.
--
-- $1 bigint[]  seqs
--
-- Returns nothing (rowCount: records deleted).
DELETE FROM {{table}}
WHERE seq = ANY($1::bigint[])
