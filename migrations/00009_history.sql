-- +goose Up
-- History: finished runs move out of the live tables into tables partitioned by the
-- day (UTC) the run finished, so that retention drops a day's partitions instead of
-- deleting rows, and the live tables hold only the runs that are running, waiting or
-- finished a short while ago (Config.ArchiveAfter). A run's steps, step attempts,
-- signals, events and listing entry move with it, in the same statement, into the
-- history table of each, partitioned by the same day (run_finished_at: the run's
-- finished_at). Kagzi creates and drops the partitions itself (internal/store
-- history.go): there is no default partition, a partition holds the runs that finished
-- on its day, and it is named <table>_pYYYYMMDD.
--
-- Reads that may meet a finished run read the *_all views: each is the live table
-- UNION ALL its history, column for column the live table. A migration that adds a
-- column to a live table adds it to its history table and recreates its view.
CREATE TABLE kagzi.runs_history (LIKE kagzi.runs INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (finished_at);
ALTER TABLE kagzi.runs_history ALTER COLUMN finished_at SET NOT NULL;
ALTER TABLE kagzi.runs_history ADD PRIMARY KEY (run_id, finished_at);
-- The lookups of a workflow id's finished runs (idempotency of IDReuseNever, the
-- newest run of an id), of a schedule's and a parent's runs, by attributes, and the
-- retention of a namespace whose Retention is shorter than the others'.
CREATE INDEX runs_history_by_workflow_id ON kagzi.runs_history (namespace, workflow_id, created_at DESC);
CREATE INDEX runs_history_by_schedule ON kagzi.runs_history (namespace, schedule_id, created_at DESC, run_id DESC)
    WHERE schedule_id IS NOT NULL;
CREATE INDEX runs_history_by_parent ON kagzi.runs_history (parent_run_id, created_at DESC, run_id DESC)
    WHERE parent_run_id IS NOT NULL;
CREATE INDEX runs_history_by_attributes ON kagzi.runs_history USING gin (attributes jsonb_path_ops)
    WHERE attributes IS NOT NULL;
CREATE INDEX runs_history_finished ON kagzi.runs_history (namespace, finished_at);

CREATE TABLE kagzi.steps_history (LIKE kagzi.steps INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    run_finished_at timestamptz NOT NULL,
    PRIMARY KEY (run_id, step_key, run_finished_at)
) PARTITION BY RANGE (run_finished_at);

CREATE TABLE kagzi.step_attempts_history (LIKE kagzi.step_attempts INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    run_finished_at timestamptz NOT NULL,
    PRIMARY KEY (run_id, step_key, attempt, run_finished_at)
) PARTITION BY RANGE (run_finished_at);

CREATE TABLE kagzi.signals_history (LIKE kagzi.signals INCLUDING CONSTRAINTS,
    run_finished_at timestamptz NOT NULL,
    PRIMARY KEY (run_id, id, run_finished_at)
) PARTITION BY RANGE (run_finished_at);

CREATE TABLE kagzi.events_history (LIKE kagzi.events INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    run_finished_at timestamptz NOT NULL,
    PRIMARY KEY (run_id, key, run_finished_at)
) PARTITION BY RANGE (run_finished_at);

CREATE TABLE kagzi.runs_created_history (LIKE kagzi.runs_created,
    run_finished_at timestamptz NOT NULL,
    PRIMARY KEY (namespace, created_at, run_id, run_finished_at)
) PARTITION BY RANGE (run_finished_at);
CREATE INDEX runs_created_history_by_type ON kagzi.runs_created_history (namespace, workflow_type, created_at, run_id);

CREATE VIEW kagzi.runs_all AS
    SELECT * FROM kagzi.runs UNION ALL SELECT * FROM kagzi.runs_history;
CREATE VIEW kagzi.steps_all AS
    SELECT * FROM kagzi.steps UNION ALL
    SELECT run_id, step_key, name, kind, status, output, error, attempts, wake_at, created_at, updated_at,
        position, started_at, finished_at FROM kagzi.steps_history;
CREATE VIEW kagzi.step_attempts_all AS
    SELECT * FROM kagzi.step_attempts UNION ALL
    SELECT run_id, step_key, attempt, status, error, started_at, finished_at FROM kagzi.step_attempts_history;
CREATE VIEW kagzi.signals_all AS
    SELECT * FROM kagzi.signals UNION ALL
    SELECT id, run_id, name, payload, created_at, consumed_by, key FROM kagzi.signals_history;
CREATE VIEW kagzi.events_all AS
    SELECT * FROM kagzi.events UNION ALL
    SELECT run_id, key, value, updated_at FROM kagzi.events_history;
-- runs_created_all also says where each entry's run is: run_finished_at is NULL for
-- a live run, and the partition key of its history row for an archived one, so that a
-- listing looks each run up in one place (one partition) rather than in every one.
CREATE VIEW kagzi.runs_created_all AS
    SELECT namespace, created_at, run_id, workflow_type, NULL::timestamptz AS run_finished_at FROM kagzi.runs_created
    UNION ALL
    SELECT namespace, created_at, run_id, workflow_type, run_finished_at FROM kagzi.runs_created_history;

-- The retention each namespace's workers last applied (keep_ms; -1: keep for ever). A
-- history partition is dropped once its day is past the longest retention of the
-- namespaces heard from in the last week; a namespace with a shorter one deletes its
-- own older history rows.
CREATE TABLE kagzi.history_retention (
    namespace  text        PRIMARY KEY,
    keep_ms    bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Dropping partitions is one process's job at a time: it takes this lease (a row that
-- says until when) instead of a session lock, which PgBouncer's transaction pooling
-- would not keep.
CREATE TABLE kagzi.history_drops (
    id     boolean     PRIMARY KEY DEFAULT true CHECK (id),
    holder text        NOT NULL,
    until  timestamptz NOT NULL
);

-- +goose Down
-- Moves every archived run back into the live tables, then drops the history.
INSERT INTO kagzi.runs SELECT * FROM kagzi.runs_history;
INSERT INTO kagzi.steps SELECT run_id, step_key, name, kind, status, output, error, attempts, wake_at,
    created_at, updated_at, position, started_at, finished_at FROM kagzi.steps_history;
INSERT INTO kagzi.step_attempts SELECT run_id, step_key, attempt, status, error, started_at, finished_at
    FROM kagzi.step_attempts_history;
INSERT INTO kagzi.signals SELECT id, run_id, name, payload, created_at, consumed_by, key FROM kagzi.signals_history;
INSERT INTO kagzi.events SELECT run_id, key, value, updated_at FROM kagzi.events_history;
INSERT INTO kagzi.runs_created SELECT namespace, created_at, run_id, workflow_type FROM kagzi.runs_created_history;
DROP VIEW kagzi.runs_all, kagzi.steps_all, kagzi.step_attempts_all, kagzi.signals_all, kagzi.events_all,
    kagzi.runs_created_all;
DROP TABLE kagzi.history_drops, kagzi.history_retention, kagzi.runs_history, kagzi.steps_history, kagzi.step_attempts_history,
    kagzi.signals_history, kagzi.events_history, kagzi.runs_created_history;
