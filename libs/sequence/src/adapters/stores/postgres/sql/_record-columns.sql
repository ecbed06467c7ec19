-- _record-columns: the select list of one record, included by statements with
-- `-- @include _record-columns`. Times come back as float8 milliseconds since the epoch
-- (whole: timestamptz keeps microseconds, the store writes milliseconds); seq as bigint text.
seq, id, kind, type, partition_key, body, headers, status, attempts,
round(extract(epoch FROM next_attempt_at) * 1000)::float8 AS next_attempt_at,
last_error,
round(extract(epoch FROM created_at) * 1000)::float8 AS created_at,
round(extract(epoch FROM completed_at) * 1000)::float8 AS completed_at
