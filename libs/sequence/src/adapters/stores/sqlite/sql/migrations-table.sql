-- The migrations applied to the boxes of one table prefix ({{table}} = <tablePrefix>outbox_migrations).
-- Parameters: none. Returns: nothing.
CREATE TABLE IF NOT EXISTS {{table}} (
  version INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  applied_at INTEGER NOT NULL
) STRICT
