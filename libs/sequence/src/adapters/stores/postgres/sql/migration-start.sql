-- migration-start: run right after BEGIN (READ COMMITTED) by each migration step, as one
-- multi-statement query (no parameters: the table prefix is validated before it is put here).
-- The advisory lock, held until the transaction ends, makes concurrent migrations of one table
-- prefix (several processes starting at once) run one after the other; each later statement
-- takes a fresh snapshot, so a process that waited sees what the one before it applied.
--
-- Returns, as its last result, the names of the migrations already applied (name text).
SELECT pg_advisory_xact_lock(hashtext('nest-sequence outbox {{prefix}}'));

CREATE TABLE IF NOT EXISTS {{prefix}}outbox_migrations (
  name TEXT PRIMARY KEY,
  applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

SELECT name FROM {{prefix}}outbox_migrations ORDER BY name;
