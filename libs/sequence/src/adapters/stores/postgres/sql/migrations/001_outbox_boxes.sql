-- 001_outbox_boxes: the four box tables and their indexes.
--
-- Applied once per box, in one transaction, with {{table}} = <tablePrefix><box> (outbox_events,
-- outbox_commands, inbox_events, inbox_commands). Index names end in short suffixes so that the
-- longest prefix (41 characters) plus the longest box name stays within PostgreSQL's 63.
--
-- next_attempt_at of a fresh row is the epoch: due whatever the clocks of the processes say.
-- body is TEXT, kept byte for byte; headers are string values (JSONB: key order is not kept).

CREATE TABLE {{table}} (
  seq BIGSERIAL PRIMARY KEY,
  id TEXT NOT NULL UNIQUE CHECK (char_length(id) BETWEEN 1 AND 200),
  kind TEXT NOT NULL CHECK (kind IN ('event', 'command')),
  type TEXT NOT NULL,
  partition_key TEXT NULL,
  body TEXT NOT NULL,
  headers JSONB NOT NULL DEFAULT '{}'::jsonb,
  status TEXT NOT NULL DEFAULT 'PENDING' CHECK (status IN ('PENDING', 'COMPLETED', 'FAILED')),
  attempts INTEGER NOT NULL DEFAULT 0,
  next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT 'epoch',
  last_error TEXT NULL,
  created_at TIMESTAMPTZ NOT NULL,
  completed_at TIMESTAMPTZ NULL
);

-- Claims: PENDING rows in seq order, filtered on next_attempt_at inside the index, so that
-- `ORDER BY seq LIMIT n` stops after n due rows however long the backlog.
CREATE INDEX {{table}}_due ON {{table}} (seq, next_attempt_at) WHERE status = 'PENDING';

-- Ordered claims: "is there an earlier unfinished row in this partition?"
CREATE INDEX {{table}}_open ON {{table}} (partition_key, seq) WHERE status <> 'COMPLETED';

-- Purge: completed rows by completion time.
CREATE INDEX {{table}}_done ON {{table}} (completed_at) WHERE status = 'COMPLETED';

-- listFailed and stats: failed rows are few; this keeps reading them cheap.
CREATE INDEX {{table}}_failed ON {{table}} (seq) WHERE status = 'FAILED';
