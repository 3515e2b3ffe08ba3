-- +goose Up
-- Kagzi's schema. Everything lives in the kagzi schema so it never collides with the
-- application's tables; goose's version table for it (migrations.VersionTable) lives
-- there too. kagzi.Migrate creates the schema before goose runs, since goose creates
-- its version table first; the statement below serves the goose CLI. It looks before it
-- creates: PostgreSQL checks the CREATE privilege on the database before it sees that
-- an IF NOT EXISTS has nothing to do, and a role without it must still be able to
-- migrate a database whose schema an administrator created for it.
-- +goose StatementBegin
DO $$
BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'kagzi') THEN
		CREATE SCHEMA kagzi;
	END IF;
END
$$;
-- +goose StatementEnd

-- Runs: one row per execution of a workflow. Columns are in the order earlier
-- development builds added them, so that a database built by this file is the one
-- they built, column for column.
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
    -- Runs fired by a schedule name it and the tick that fired them. Both stay NULL for runs
    -- started by Start.
    schedule_id      text,
    schedule_tick    timestamptz,
    -- A child run names its parent run and the step that started it.
    parent_run_id    uuid,
    parent_step_key  text,
    -- The signal name a SLEEPING run waits for: a signal of that name wakes it at once.
    waiting_signal   text,
    -- The trace context captured when the run started (a W3C traceparent, say), so that
    -- every execution of the run, on any worker, after any sleep, joins the trace of the
    -- request that started it. Set by Config.Hooks (see kagziotel); NULL without them.
    -- It is not a payload: the payload codec does not apply to it.
    trace_carrier    jsonb,
    -- The version of the workflow definition the run started with. NULL: whichever version
    -- the first worker to claim it registered (it is pinned then).
    version          text,
    -- A fork names the run and step it was copied from.
    forked_from_run_id uuid,
    forked_from_step text,
    -- A signal for the run, or the end of a child of it, sets wake_pending in the same row
    -- update that wakes the run if it sleeps. A run suspending to wait reads the flag in its
    -- own UPDATE of the row, so whichever commits first, the waiter is never left asleep
    -- with what it waits for already there.
    wake_pending     boolean     NOT NULL DEFAULT false,
    -- The claims that took the run over from a worker whose lease had passed (it died,
    -- froze or lost its database). Past the worker's MaxTakeovers the run fails
    -- RECOVERY_EXHAUSTED instead of being taken over again: a run whose step kills its
    -- process would otherwise loop for ever.
    takeovers        integer     NOT NULL DEFAULT 0,
    CONSTRAINT runs_status_valid CHECK (status IN ('PENDING', 'RUNNING', 'SLEEPING', 'COMPLETED', 'FAILED', 'CANCELLED')),
    CONSTRAINT runs_workflow_id_valid CHECK (workflow_id <> '' AND length(workflow_id) <= 255),
    CONSTRAINT runs_namespace_valid CHECK (namespace <> '' AND length(namespace) <= 255)
);

-- Every index on all runs gets a new entry whenever a run's row is rewritten and the
-- update cannot be HOT (a claim, an end, a heartbeat, a sleep): the indexes below are
-- partial wherever they can be, so the hot path pays for as few of them as possible.

-- One active run per workflow id and namespace: the idempotency key of Start. The lookup
-- of a workflow id's active run reads it.
CREATE UNIQUE INDEX runs_one_active_per_workflow_id ON kagzi.runs (namespace, workflow_id)
    WHERE status IN ('PENDING', 'RUNNING', 'SLEEPING');

-- The claim reads only this index: it holds unfinished runs alone, so its size does not grow
-- with the number of finished runs. It covers the same rows as runs_one_active_per_workflow_id,
-- and on a table not yet analyzed the planner could pick it for the lookup of a workflow id's
-- active run and scan every unfinished run of the namespace: its predicate also names
-- available_at (never NULL), so only queries that constrain available_at, as the claim does,
-- or say available_at IS NOT NULL can use it.
CREATE INDEX runs_claimable ON kagzi.runs (namespace, workflow_type, available_at)
    WHERE status IN ('PENDING', 'RUNNING', 'SLEEPING') AND available_at IS NOT NULL;

-- The lookup of a workflow id's finished runs, newest first. Active runs are in
-- runs_one_active_per_workflow_id already, and leaving them out of this index spares every
-- start and every claim one index insertion on the hot path.
CREATE INDEX runs_finished_by_workflow_id ON kagzi.runs (namespace, workflow_id, created_at DESC)
    WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED');

-- Retention prunes finished runs oldest first, a small batch at a time.
CREATE INDEX runs_finished ON kagzi.runs (namespace, finished_at)
    WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED');

-- ListRuns filtered by schedule: keyset pagination, newest first.
CREATE INDEX runs_by_schedule ON kagzi.runs (namespace, schedule_id, created_at DESC, run_id DESC)
    WHERE schedule_id IS NOT NULL;

-- Overlap policies ask "is a run of this schedule still active?"; finished runs are not
-- in this index, so the answer costs the same after a year of ticks.
CREATE INDEX runs_active_by_schedule ON kagzi.runs (namespace, schedule_id)
    WHERE schedule_id IS NOT NULL AND status IN ('PENDING', 'RUNNING', 'SLEEPING');

-- The children of a run.
CREATE INDEX runs_by_parent ON kagzi.runs (parent_run_id, created_at DESC) WHERE parent_run_id IS NOT NULL;

-- The deadlines of unfinished runs, so that a worker can fail the waiting runs
-- (PENDING, SLEEPING, or RUNNING past their lease) whose deadline passed while no
-- slot was free to claim them, and knows when the next one passes. Runs without a
-- deadline have no entry: the index costs nothing to them.
CREATE INDEX runs_deadlines ON kagzi.runs (namespace, deadline_at)
    WHERE deadline_at IS NOT NULL AND status IN ('PENDING', 'RUNNING', 'SLEEPING');

-- ListRuns' order (newest first) lives in a table written once per run rather than in an
-- index on runs: such an index would get an entry for every rewrite of a run that cannot
-- be HOT, about a quarter of such an update's cost, and 8-12% of a 1-step burn-down's
-- throughput. A row here is written with its run, deleted with it, and never updated.
CREATE TABLE kagzi.runs_created (
    namespace  text        NOT NULL,
    created_at timestamptz NOT NULL,
    run_id     uuid        NOT NULL,
    PRIMARY KEY (namespace, created_at, run_id)
);

-- The memoized steps of a run. A step that completes at its first attempt keeps that
-- attempt in its own row (started_at, finished_at: those of its latest attempt), and
-- step_attempts holds only the history of steps that failed at least once. Steps do not
-- check their run through a foreign key: every step write is fenced by a lock on its
-- running run already, and pruning deletes a run's steps with the run.
CREATE TABLE kagzi.steps (
    run_id      uuid        NOT NULL,
    -- name#occurrence: the 3rd call of "send" in a run is "send#3".
    step_key    text        NOT NULL,
    name        text        NOT NULL,
    kind        text        NOT NULL,
    status      text        NOT NULL,
    output      jsonb,
    error       jsonb,
    attempts    integer     NOT NULL DEFAULT 0,
    -- Sleeps: the wake time, fixed when the sleep first ran. Signal waits: the timeout.
    wake_at     timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    -- The position of the step among the calls of its scope (the workflow function, or one
    -- branch), so a replay that asks for another step at a recorded position is caught.
    position    integer,
    started_at  timestamptz,
    finished_at timestamptz,
    PRIMARY KEY (run_id, step_key),
    CONSTRAINT steps_kind_valid CHECK (kind IN ('STEP', 'SLEEP', 'CHILD', 'SIGNAL', 'EVENT', 'PATCH')),
    -- COMPLETED: output recorded, replayed forever. RETRYING: the last attempt failed and
    -- another will run. FAILED: failed for good; a replay returns the recorded error.
    -- WAITING: a signal wait that has not received its signal yet.
    CONSTRAINT steps_status_valid CHECK (status IN ('COMPLETED', 'RETRYING', 'FAILED', 'WAITING'))
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

-- Cron schedules. Every worker process runs the scheduler: it claims due schedules with
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

-- The worker registry: every Worker registers on start, heartbeats, is DRAINING while it
-- shuts down and OFFLINE after. A worker that stops heartbeating is marked OFFLINE by the
-- others after three of its own heartbeat intervals, and its row is pruned a day later.
CREATE TABLE kagzi.workers (
    namespace          text        NOT NULL,
    worker_id          text        NOT NULL,
    hostname           text        NOT NULL,
    pid                integer     NOT NULL,
    version            text        NOT NULL,
    labels             jsonb       NOT NULL DEFAULT '{}',
    workflow_types     text[]      NOT NULL,
    max_concurrent     integer     NOT NULL,
    heartbeat_interval_ms bigint   NOT NULL,
    status             text        NOT NULL,
    active_runs        integer     NOT NULL DEFAULT 0,
    completed_total    bigint      NOT NULL DEFAULT 0,
    failed_total       bigint      NOT NULL DEFAULT 0,
    started_at         timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    stopped_at         timestamptz,
    -- The version of each of the worker's workflow types (same order as workflow_types).
    workflow_versions  text[]      NOT NULL DEFAULT '{}',
    PRIMARY KEY (namespace, worker_id),
    CONSTRAINT workers_status_valid CHECK (status IN ('ONLINE', 'DRAINING', 'OFFLINE'))
);

-- Expiry of silent workers and the "pending types with no live worker" health check.
CREATE INDEX workers_live ON kagzi.workers (namespace, last_heartbeat_at) WHERE status <> 'OFFLINE';

-- Signals sent to a run, delivered once each, in the order they were sent.
CREATE TABLE kagzi.signals (
    id          bigserial   PRIMARY KEY,
    run_id      uuid        NOT NULL REFERENCES kagzi.runs (run_id) ON DELETE CASCADE,
    name        text        NOT NULL,
    payload     jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- The key of the WaitSignal step that received it.
    consumed_by text
);
CREATE INDEX signals_pending ON kagzi.signals (run_id, name, id) WHERE consumed_by IS NULL;

-- Events: key/value state a running workflow publishes for callers to read.
CREATE TABLE kagzi.events (
    run_id     uuid        NOT NULL REFERENCES kagzi.runs (run_id) ON DELETE CASCADE,
    key        text        NOT NULL,
    value      jsonb       NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, key)
);

-- Clients waiting for run ends (Run.Wait, a schedule's overlap policy) register here,
-- for a minute at a time, while they wait. A run's end notifies only when a client
-- other than the ending worker's own waits in its namespace: the ending worker tells
-- its own client's waiters in process. A transaction that notifies holds a server-wide
-- lock through its commit, so notifying on every run end would serialise the commits
-- of all of them.
CREATE TABLE kagzi.waiters (
    namespace  text        NOT NULL,
    client_id  uuid        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (namespace, client_id)
);

-- +goose StatementBegin
-- The trigger runs_changed and its function run_changed are invisible from Go: no Go
-- code calls them, yet every UPDATE of a run's status or cancel flag may fire them. They are the one place for what follows such a change, whichever
-- statement made it:
--   * a child that ends sets wake_pending on its unfinished parent and, if the parent
--     sleeps, wakes it (it may be waiting for the child) and notifies the parent's
--     workflow type;
--   * a run that is cancelled, or fails on its deadline, cancels its active children
--     (which cascades down, since their change fires this trigger too), notifying each
--     child's end (PENDING and SLEEPING children end CANCELLED at once) or its cancel
--     request (RUNNING children, which their worker ends).
-- Its notifications on the channel 'kagzi' are "topic|extra" (internal/notifier), with
-- the topics of internal/store: WakeTopic "w|<length>:<namespace>|<type>" (the extra is
-- the wake time in Unix milliseconds), DoneTopic "d|<run_id>" (the extra is the status
-- the run ended with) and CancelTopic "c|<namespace>" (the extra is the run id).
CREATE FUNCTION kagzi.run_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    parent_type text;
    parent_status text;
    child record;
BEGIN
    IF NEW.parent_run_id IS NOT NULL
       AND NEW.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
       AND OLD.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED') THEN
        UPDATE kagzi.runs p SET wake_pending = true,
            available_at = CASE WHEN p.status = 'SLEEPING' AND p.available_at > now() THEN now() ELSE p.available_at END
        WHERE p.run_id = NEW.parent_run_id AND p.status IN ('PENDING', 'RUNNING', 'SLEEPING')
        RETURNING p.workflow_type, p.status INTO parent_type, parent_status;
        IF parent_status = 'SLEEPING' THEN
            PERFORM pg_notify('kagzi', 'w|' || octet_length(NEW.namespace) || ':' || NEW.namespace || '|' || parent_type || '|'
                || (extract(epoch FROM now()) * 1000)::bigint);
        END IF;
    END IF;
    IF (NEW.cancel_requested AND NOT OLD.cancel_requested)
       OR (NEW.status = 'CANCELLED' AND OLD.status <> 'CANCELLED')
       OR (NEW.status = 'FAILED' AND OLD.status <> 'FAILED' AND NEW.error->>'code' = 'DEADLINE_EXCEEDED') THEN
        FOR child IN
            UPDATE kagzi.runs c SET
                cancel_requested = true,
                status = CASE WHEN c.status IN ('PENDING', 'SLEEPING') THEN 'CANCELLED' ELSE c.status END,
                finished_at = CASE WHEN c.status IN ('PENDING', 'SLEEPING') THEN now() ELSE c.finished_at END,
                updated_at = now()
            WHERE c.parent_run_id = NEW.run_id AND c.status IN ('PENDING', 'RUNNING', 'SLEEPING')
              AND NOT c.cancel_requested
            RETURNING c.run_id, c.namespace, c.status
        LOOP
            IF child.status = 'CANCELLED' THEN
                PERFORM pg_notify('kagzi', 'd|' || child.run_id || '|CANCELLED');
            ELSE
                PERFORM pg_notify('kagzi', 'c|' || child.namespace || '|' || child.run_id);
            END IF;
        END LOOP;
    END IF;
    RETURN NEW;
END $$;
-- +goose StatementEnd

-- The WHEN clause skips the plpgsql call for the common case, a run without a parent
-- that completes: the function only has work for children that end and for runs that
-- are cancelled or fail (their children may need cancelling).
CREATE TRIGGER runs_changed AFTER UPDATE OF status, cancel_requested ON kagzi.runs
    FOR EACH ROW
    WHEN ((OLD.status IS DISTINCT FROM NEW.status
           AND (NEW.parent_run_id IS NOT NULL OR NEW.status IN ('CANCELLED', 'FAILED')))
          OR OLD.cancel_requested IS DISTINCT FROM NEW.cancel_requested)
    EXECUTE FUNCTION kagzi.run_changed();

-- +goose Down
-- Everything but the schema itself and goose's version table in it: goose records the
-- down migration in that table, in the same transaction, after this runs. Drop the
-- schema by hand (DROP SCHEMA kagzi CASCADE) to remove every trace of Kagzi.
DROP TABLE kagzi.waiters, kagzi.events, kagzi.signals, kagzi.workers, kagzi.schedules,
    kagzi.step_attempts, kagzi.steps, kagzi.runs_created, kagzi.runs;
DROP FUNCTION kagzi.run_changed();
