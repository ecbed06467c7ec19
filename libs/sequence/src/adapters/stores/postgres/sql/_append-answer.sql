-- _append-answer: the answer of append.sql and append-one.sql, included after their `added` CTE
-- with `-- @include _append-answer`: the ids added (NULL when none), and the NOTIFY to channel
-- $8 (box name $9) when any was added and a channel is given.
SELECT
  (SELECT array_agg(id) FROM added) AS added,
  (SELECT count(*) FROM (
    SELECT pg_notify($8, $9) FROM added WHERE $8::text IS NOT NULL LIMIT 1
  ) AS woken) AS woken
