-- Records an applied migration ({{table}} = <tablePrefix>outbox_migrations).
-- Parameters: @version, @name, @appliedAt (ms). Returns: changes = 1.
INSERT INTO {{table}} (version, name, applied_at) VALUES (@version, @name, @appliedAt)
