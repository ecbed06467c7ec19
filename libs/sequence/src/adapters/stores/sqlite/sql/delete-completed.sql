-- Outcome `completed` of a claimed record of a box ({{table}}) whose completed records are not
-- kept (ClaimOptions.deleteCompleted): the record is deleted.
-- Parameters: @id. Returns: changes = 1 (0 if the record is no longer PENDING).
DELETE FROM {{table}}
WHERE id = @id AND status = 'PENDING'
