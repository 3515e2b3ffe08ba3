-- +goose Up
-- ListRuns of one workflow type reads its page in order from runs_created by type,
-- instead of walking the namespace's runs and skipping the other types' (a type with
-- few runs among a million read them all). runs_created is written once per run and
-- never updated, so the index costs one entry per run, not one per rewrite of it.
ALTER TABLE kagzi.runs_created ADD COLUMN workflow_type text;
UPDATE kagzi.runs_created c SET workflow_type = r.workflow_type FROM kagzi.runs r WHERE r.run_id = c.run_id;
CREATE INDEX runs_created_by_type ON kagzi.runs_created (namespace, workflow_type, created_at, run_id);

-- +goose Down
DROP INDEX kagzi.runs_created_by_type;
ALTER TABLE kagzi.runs_created DROP COLUMN workflow_type;
