-- +goose Up
-- Cron schedules, and the link from a run to the schedule tick that fired it.
-- Every worker process runs the scheduler: it claims due schedules with
-- FOR UPDATE SKIP LOCKED, inserts their runs and advances next_fire_at in one transaction,
-- so a tick fires once however many processes take part.
CREATE TABLE kagzi.schedules (
    namespace       text        NOT NULL,
    schedule_id     text        NOT NULL,
    workflow_type   text        NOT NULL,
    cron            text        NOT NULL,
    -- The cron expression has a leading seconds field (6 fields).
    cron_seconds    boolean     NOT NULL DEFAULT false,
    -- IANA name; the cron expression is read in this zone.
    time_zone       text        NOT NULL,
    input           jsonb       NOT NULL,
    paused          boolean     NOT NULL DEFAULT false,
    -- A scheduler pass fires at most this many due ticks (the most recent ones); 0 means 1.
    max_catchup     integer     NOT NULL,
    overlap         text        NOT NULL,
    -- The next tick to fire; NULL while paused. The transaction that fires a tick moves it on.
    next_fire_at    timestamptz,
    -- The tick time of the newest fire (a trigger's is the time it was asked for), and its run.
    last_fired_at   timestamptz,
    last_run_id     uuid,
    -- BUFFER_ONE: a tick that came due while a run of the schedule was active; it fires
    -- once none is.
    buffered_tick   timestamptz,
    -- Due ticks older than the most recent max_catchup, never fired.
    catchup_skipped bigint      NOT NULL DEFAULT 0,
    -- Ticks not fired because a run of the schedule was active (SKIP, or BUFFER_ONE with a
    -- tick already buffered).
    overlap_skipped bigint      NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, schedule_id),
    CONSTRAINT schedules_id_valid CHECK (schedule_id <> '' AND length(schedule_id) <= 200),
    CONSTRAINT schedules_overlap_valid CHECK (overlap IN ('ALLOW', 'SKIP', 'BUFFER_ONE')),
    CONSTRAINT schedules_max_catchup_valid CHECK (max_catchup BETWEEN 0 AND 1000),
    CONSTRAINT schedules_paused_has_no_next CHECK (paused = (next_fire_at IS NULL))
);

-- The scheduler's claim and its "when is the next tick" query read only active schedules.
CREATE INDEX schedules_due ON kagzi.schedules (namespace, next_fire_at) WHERE NOT paused;

-- Runs fired by a schedule name it and the tick that fired them. Both stay NULL for runs
-- started by Start.
ALTER TABLE kagzi.runs
    ADD COLUMN schedule_id   text,
    ADD COLUMN schedule_tick timestamptz;

-- ListRuns filtered by schedule: keyset pagination, newest first.
CREATE INDEX runs_by_schedule ON kagzi.runs (namespace, schedule_id, created_at DESC, run_id DESC)
    WHERE schedule_id IS NOT NULL;

-- Overlap policies ask "is a run of this schedule still active?"; finished runs are not
-- in this index, so the answer costs the same after a year of ticks.
CREATE INDEX runs_active_by_schedule ON kagzi.runs (namespace, schedule_id)
    WHERE schedule_id IS NOT NULL AND status IN ('PENDING', 'RUNNING', 'SLEEPING');

-- +goose Down
DROP INDEX kagzi.runs_active_by_schedule;
DROP INDEX kagzi.runs_by_schedule;
ALTER TABLE kagzi.runs DROP COLUMN schedule_tick, DROP COLUMN schedule_id;
DROP TABLE kagzi.schedules;
