-- +goose Up
-- The lookup of a workflow id's runs indexes finished runs only. Active runs are in
-- runs_one_active_per_workflow_id already, and leaving them out of this index spares
-- every start and every claim (a claim rewrites the run's row, and each index on all
-- runs gets a new entry for it) one index insertion on the hot path.
DROP INDEX kagzi.runs_by_workflow_id;
CREATE INDEX runs_finished_by_workflow_id ON kagzi.runs (namespace, workflow_id, created_at DESC)
    WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED');

-- The lookup of a workflow id's active run must read runs_one_active_per_workflow_id.
-- runs_claimable covered the same rows, and on a table not yet analyzed the planner
-- could pick it for that lookup and scan every unfinished run of the namespace. Its
-- predicate now also names available_at (never NULL), so only queries that constrain
-- available_at, as the claim does, or say available_at IS NOT NULL can use it.
DROP INDEX kagzi.runs_claimable;
CREATE INDEX runs_claimable ON kagzi.runs (namespace, workflow_type, available_at)
    WHERE status IN ('PENDING', 'RUNNING', 'SLEEPING') AND available_at IS NOT NULL;

-- +goose Down
DROP INDEX kagzi.runs_claimable;
CREATE INDEX runs_claimable ON kagzi.runs (namespace, workflow_type, available_at)
    WHERE status IN ('PENDING', 'RUNNING', 'SLEEPING');
DROP INDEX kagzi.runs_finished_by_workflow_id;
CREATE INDEX runs_by_workflow_id ON kagzi.runs (namespace, workflow_id, created_at DESC);
