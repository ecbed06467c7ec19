-- migration-record: records a migration as applied, in the transaction that applied it.
--
-- $1 text  migration name (`001_outbox_boxes`)
--
-- Returns nothing.
INSERT INTO {{prefix}}outbox_migrations (name) VALUES ($1)
