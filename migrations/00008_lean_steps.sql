-- +goose Up
-- Lean step records, for the hot path: a step that completes at its first attempt
-- keeps that attempt in its own row (started_at, finished_at: those of its latest
-- attempt), and step_attempts holds only the history of steps that failed at least
-- once. And steps no longer check their run through a foreign key: every step write
-- is fenced by a lock on its running run already, and pruning deletes a run's steps
-- with the run.
ALTER TABLE kagzi.steps
    ADD COLUMN started_at  timestamptz,
    ADD COLUMN finished_at timestamptz;
ALTER TABLE kagzi.steps DROP CONSTRAINT steps_run_id_fkey;

-- +goose Down
INSERT INTO kagzi.step_attempts (run_id, step_key, attempt, status, started_at, finished_at)
SELECT s.run_id, s.step_key, 1, 'COMPLETED', s.started_at, s.finished_at
FROM kagzi.steps s
WHERE s.kind = 'STEP' AND s.status = 'COMPLETED' AND s.attempts = 1 AND s.started_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM kagzi.step_attempts a WHERE a.run_id = s.run_id AND a.step_key = s.step_key);
DELETE FROM kagzi.steps s WHERE NOT EXISTS (SELECT 1 FROM kagzi.runs r WHERE r.run_id = s.run_id);
ALTER TABLE kagzi.steps ADD CONSTRAINT steps_run_id_fkey
    FOREIGN KEY (run_id) REFERENCES kagzi.runs (run_id) ON DELETE CASCADE;
ALTER TABLE kagzi.steps DROP COLUMN finished_at, DROP COLUMN started_at;
