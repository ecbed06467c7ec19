-- receive: append-one.sql for an inbox's receive, a statement in a transaction of its own. A
-- record of a partition first takes the partition's lock (as lock-partitions.sql does), before
-- its seq is drawn: receives of one partition then commit in seq order, which ordered claims rely
-- on. Without it, a receive slow to commit could be handed out after a later record of its
-- partition, or beside it. Released at the statement's commit. Same parameters and answer.
WITH locked AS (
  SELECT count(pg_advisory_xact_lock(hashtextextended('{{table}}:' || $4::text, 0))) AS locks
  WHERE $4::text IS NOT NULL
), added AS (
  INSERT INTO {{table}} (id, kind, type, partition_key, body, headers, created_at)
  SELECT $1::text, $2::text, $3::text, $4::text, $5::text, $6::jsonb, to_timestamp($7::float8 / 1000)
  FROM locked
  ON CONFLICT (id) DO NOTHING
  RETURNING id
)
-- @include _append-answer
