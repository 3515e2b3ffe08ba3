-- +goose Up
-- The lookup of a workflow id's runs indexes finished runs only. Active runs are in
-- runs_one_active_per_workflow_id already, and leaving them out of this index spares
-- every start and every claim (a claim rewrites the run's row, and each index on all
-- runs gets a new entry for it) one index insertion on the hot path.
DROP INDEX kagzi.runs_by_workflow_id;
CREATE INDEX runs_finished_by_workflow_id ON kagzi.runs (namespace, workflow_id, created_at DESC)
    WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED');

-- +goose Down
DROP INDEX kagzi.runs_finished_by_workflow_id;
CREATE INDEX runs_by_workflow_id ON kagzi.runs (namespace, workflow_id, created_at DESC);
