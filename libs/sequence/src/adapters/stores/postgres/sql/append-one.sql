-- append-one: append.sql for a single record, its columns as plain parameters rather than
-- one-element arrays: the common case (one event per transaction) spares both sides the array
-- literal (its escaping in the client, its parsing and unnest on the server). Same answer.
--
-- $1 text     id                  $2 text     kind ('event' | 'command')
-- $3 text     type                $4 text     partition key (NULL for none)
-- $5 text     body                $6 text     headers, a JSON object text
-- $7 float8   createdAt (ms)      $8 text     notify channel (NULL: none)   $9 text   box name
--
-- Returns one row: added text[] (the id when added; NULL when the box held it already).
WITH added AS (
  INSERT INTO {{table}} (id, kind, type, partition_key, body, headers, created_at)
  VALUES ($1::text, $2::text, $3::text, $4::text, $5::text, $6::jsonb, to_timestamp($7::float8 / 1000))
  ON CONFLICT (id) DO NOTHING
  RETURNING id
)
-- @include _append-answer
