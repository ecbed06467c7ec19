-- Migration 1: one box table ({{table}} = <tablePrefix><box>) and its partial indexes.
-- Run once per box with exec (several statements), inside the migrating IMMEDIATE transaction.
-- Parameters: none. Returns: nothing.
-- Times are INTEGER milliseconds since the epoch. seq is AUTOINCREMENT so that a seq is never
-- reused, even after the newest rows were purged. Fresh rows have next_attempt_at = 0: due
-- whatever the clocks of the processes that claim them say.
CREATE TABLE IF NOT EXISTS {{table}} (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  kind TEXT NOT NULL CHECK (kind IN ('event', 'command')),
  type TEXT NOT NULL,
  partition_key TEXT,
  body TEXT NOT NULL,
  headers TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('PENDING', 'COMPLETED', 'FAILED')),
  attempts INTEGER NOT NULL,
  next_attempt_at INTEGER NOT NULL,
  last_error TEXT,
  created_at INTEGER NOT NULL,
  completed_at INTEGER
) STRICT;

-- Claims read PENDING rows in seq order and filter on next_attempt_at: seq first, so that a
-- claim stops after `limit` rows instead of sorting every due row (nearly all PENDING rows are
-- due: fresh ones have next_attempt_at = 0).
CREATE INDEX IF NOT EXISTS {{table}}_due ON {{table}} (seq, next_attempt_at)
  WHERE status = 'PENDING';

-- Ordered claims: is there an earlier unfinished row in this partition?
CREATE INDEX IF NOT EXISTS {{table}}_open_partitions ON {{table}} (partition_key, seq)
  WHERE status <> 'COMPLETED';

-- Purge: completed rows by age.
CREATE INDEX IF NOT EXISTS {{table}}_completed ON {{table}} (completed_at)
  WHERE status = 'COMPLETED';

-- listFailed and stats: few rows, found without a table scan.
CREATE INDEX IF NOT EXISTS {{table}}_failed ON {{table}} (seq)
  WHERE status = 'FAILED';
