-- Whether a migration was applied ({{table}} = <tablePrefix>outbox_migrations).
-- Parameters: @version. Returns: one row { version } when applied, none otherwise.
SELECT version FROM {{table}} WHERE version = @version
