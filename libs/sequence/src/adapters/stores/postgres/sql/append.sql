-- append: adds records to a box, in the order given, skipping ids the box already holds (also
-- an id repeated within the same call: the first one wins), and, when it added any and a notify
-- channel is given, wakes up watchers: pg_notify is delivered when the transaction commits, and
-- never if it rolls back. The channel is given only for a caller's own transaction (whose commit
-- the store does not see): a NOTIFY makes PostgreSQL serialize commits, so the store's own
-- transactions announce themselves after their commit instead (a single, debounced NOTIFY).
--
-- $1 text[]   ids                 $2 text[]   kinds ('event' | 'command')
-- $3 text[]   types               $4 text[]   partition keys (NULL for none)
-- $5 text[]   bodies              $6 text[]   headers, each a JSON object text
-- $7 float8   createdAt (ms)      $8 text     notify channel (NULL: none)   $9 text   box name
--
-- Returns one row: added text[] (the ids added; NULL when none).
WITH incoming AS (
  SELECT *
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::jsonb[])
    WITH ORDINALITY AS record(id, kind, type, partition_key, body, headers, position)
), added AS (
  INSERT INTO {{table}} (id, kind, type, partition_key, body, headers, created_at)
  SELECT id, kind, type, partition_key, body, headers, to_timestamp($7::float8 / 1000)
  FROM incoming
  ORDER BY position
  ON CONFLICT (id) DO NOTHING
  RETURNING id
)
-- @include _append-answer
