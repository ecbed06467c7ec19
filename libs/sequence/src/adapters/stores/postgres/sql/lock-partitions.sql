-- lock-partitions: takes a transaction-level advisory lock per partition key of this box, in key
-- order (so that two transactions taking several never deadlock). A second transaction appending
-- to the same partition waits here until the first commits or rolls back: appends of a partition
-- then commit in seq order, which ordered claims rely on. Released at the end of the transaction.
--
-- $1 text[]   partition keys
--
-- Returns one row: locked bigint (how many keys).
SELECT count(pg_advisory_xact_lock(hashtextextended('{{table}}:' || key, 0))) AS locked
FROM (SELECT DISTINCT unnest($1::text[]) AS key ORDER BY 1) AS keys
