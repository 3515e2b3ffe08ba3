-- +goose Up
-- takeovers counts the claims that took a run over from a worker whose lease had
-- passed (it died, froze or lost its database). Past the worker's MaxTakeovers the
-- run fails RECOVERY_EXHAUSTED instead of being taken over again: a run whose step
-- kills its process would otherwise loop for ever.
ALTER TABLE kagzi.runs ADD COLUMN takeovers integer NOT NULL DEFAULT 0;

-- The deadlines of unfinished runs, so that a worker can fail the waiting runs
-- (PENDING, SLEEPING, or RUNNING past their lease) whose deadline passed while no
-- slot was free to claim them, and knows when the next one passes. Runs without a
-- deadline have no entry: the index costs nothing to them.
CREATE INDEX runs_deadlines ON kagzi.runs (namespace, deadline_at)
    WHERE deadline_at IS NOT NULL AND status IN ('PENDING', 'RUNNING', 'SLEEPING');

-- +goose Down
DROP INDEX kagzi.runs_deadlines;
ALTER TABLE kagzi.runs DROP COLUMN takeovers;
