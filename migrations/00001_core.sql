-- +goose Up
-- The durable core: runs, their memoized steps, and every step attempt.
-- Everything lives in the kagzi schema so it never collides with the application's tables.
CREATE SCHEMA IF NOT EXISTS kagzi;

CREATE TABLE kagzi.runs (
    run_id           uuid        PRIMARY KEY,
    namespace        text        NOT NULL,
    workflow_id      text        NOT NULL,
    workflow_type    text        NOT NULL,
    status           text        NOT NULL,
    input            jsonb       NOT NULL,
    output           jsonb,
    error            jsonb,
    attempt          integer     NOT NULL DEFAULT 1,
    -- When the run may next be claimed. PENDING: its start time (a delayed start is in the future).
    -- SLEEPING: its wake time. RUNNING: the end of the current lease; a worker that stops
    -- heartbeating lets it pass, and the run becomes claimable again.
    available_at     timestamptz NOT NULL,
    locked_by        text,
    -- Bumped by every claim. Every write a worker makes for a run names the epoch it claimed
    -- with, so a worker whose lease was taken over can record nothing more.
    lease_epoch      bigint      NOT NULL DEFAULT 0,
    cancel_requested boolean     NOT NULL DEFAULT false,
    -- Past it the run ends FAILED (deadline exceeded), whatever its status. While the run
    -- waits, available_at is never later than it, so a claim finds the run at its deadline.
    deadline_at      timestamptz,
    -- true when the workflow id was chosen by the library (never reused) or the caller asked
    -- for the id to stay an idempotency key after the run finishes.
    id_reuse_never   boolean     NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT runs_status_valid CHECK (status IN ('PENDING', 'RUNNING', 'SLEEPING', 'COMPLETED', 'FAILED', 'CANCELLED')),
    CONSTRAINT runs_workflow_id_valid CHECK (workflow_id <> '' AND length(workflow_id) <= 255),
    CONSTRAINT runs_namespace_valid CHECK (namespace <> '' AND length(namespace) <= 255)
);

-- One active run per workflow id and namespace: the idempotency key of Start.
CREATE UNIQUE INDEX runs_one_active_per_workflow_id ON kagzi.runs (namespace, workflow_id)
    WHERE status IN ('PENDING', 'RUNNING', 'SLEEPING');

-- The claim reads only this index: it holds unfinished runs alone, so its size does not grow
-- with the number of finished runs.
CREATE INDEX runs_claimable ON kagzi.runs (namespace, workflow_type, available_at)
    WHERE status IN ('PENDING', 'RUNNING', 'SLEEPING');

-- Lookups of every run (finished ones too) of a workflow id, newest first.
CREATE INDEX runs_by_workflow_id ON kagzi.runs (namespace, workflow_id, created_at DESC);

-- ListRuns: keyset pagination, newest first.
CREATE INDEX runs_by_created ON kagzi.runs (namespace, created_at DESC, run_id DESC);

CREATE TABLE kagzi.steps (
    run_id     uuid        NOT NULL REFERENCES kagzi.runs (run_id) ON DELETE CASCADE,
    -- name#occurrence: the 3rd call of "send" in a run is "send#3".
    step_key   text        NOT NULL,
    name       text        NOT NULL,
    kind       text        NOT NULL,
    status     text        NOT NULL,
    output     jsonb,
    error      jsonb,
    attempts   integer     NOT NULL DEFAULT 0,
    -- Sleeps: the wake time, fixed when the sleep first ran.
    wake_at    timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, step_key),
    CONSTRAINT steps_kind_valid CHECK (kind IN ('STEP', 'SLEEP')),
    -- COMPLETED: output recorded, replayed forever. RETRYING: the last attempt failed and
    -- another will run. FAILED: failed for good; a replay returns the recorded error.
    CONSTRAINT steps_status_valid CHECK (status IN ('COMPLETED', 'RETRYING', 'FAILED'))
);

CREATE TABLE kagzi.step_attempts (
    run_id      uuid        NOT NULL,
    step_key    text        NOT NULL,
    attempt     integer     NOT NULL,
    status      text        NOT NULL,
    error       jsonb,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    PRIMARY KEY (run_id, step_key, attempt),
    FOREIGN KEY (run_id, step_key) REFERENCES kagzi.steps (run_id, step_key) ON DELETE CASCADE,
    CONSTRAINT step_attempts_status_valid CHECK (status IN ('COMPLETED', 'FAILED', 'TIMED_OUT'))
);

-- +goose Down
DROP SCHEMA kagzi CASCADE;
