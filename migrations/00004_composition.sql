-- +goose Up
-- Composition: child workflows, signals and events.

-- A child run names its parent run and the step that started it.
ALTER TABLE kagzi.runs
    ADD COLUMN parent_run_id   uuid,
    ADD COLUMN parent_step_key text,
    -- The signal name a SLEEPING run waits for: a signal of that name wakes it at once.
    ADD COLUMN waiting_signal  text;

CREATE INDEX runs_by_parent ON kagzi.runs (parent_run_id, created_at DESC) WHERE parent_run_id IS NOT NULL;

ALTER TABLE kagzi.steps DROP CONSTRAINT steps_kind_valid;
ALTER TABLE kagzi.steps ADD CONSTRAINT steps_kind_valid
    CHECK (kind IN ('STEP', 'SLEEP', 'CHILD', 'SIGNAL', 'EVENT'));
-- WAITING: a signal wait that has not received its signal yet (wake_at is its timeout).
ALTER TABLE kagzi.steps DROP CONSTRAINT steps_status_valid;
ALTER TABLE kagzi.steps ADD CONSTRAINT steps_status_valid
    CHECK (status IN ('COMPLETED', 'RETRYING', 'FAILED', 'WAITING'));

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

-- +goose StatementBegin
-- One place for what follows a run's change of status or cancel flag, whichever
-- statement made it:
--   * a child that ends wakes its parent if the parent sleeps (it may be waiting for it);
--   * a run that is cancelled, or fails on its deadline, cancels its active children
--     (which cascades down, since their change fires this trigger too).
CREATE FUNCTION kagzi.run_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    parent_type text;
    child record;
BEGIN
    IF NEW.parent_run_id IS NOT NULL
       AND NEW.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
       AND OLD.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED') THEN
        UPDATE kagzi.runs p SET available_at = now()
        WHERE p.run_id = NEW.parent_run_id AND p.status = 'SLEEPING' AND p.available_at > now()
        RETURNING p.workflow_type INTO parent_type;
        IF parent_type IS NOT NULL THEN
            PERFORM pg_notify('kagzi', 'w|' || NEW.namespace || '|' || parent_type || '|'
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

CREATE TRIGGER runs_changed AFTER UPDATE OF status, cancel_requested ON kagzi.runs
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.cancel_requested IS DISTINCT FROM NEW.cancel_requested)
    EXECUTE FUNCTION kagzi.run_changed();

-- +goose Down
DROP TRIGGER runs_changed ON kagzi.runs;
DROP FUNCTION kagzi.run_changed();
DROP TABLE kagzi.events;
DROP TABLE kagzi.signals;
ALTER TABLE kagzi.steps DROP CONSTRAINT steps_status_valid;
ALTER TABLE kagzi.steps ADD CONSTRAINT steps_status_valid CHECK (status IN ('COMPLETED', 'RETRYING', 'FAILED'));
ALTER TABLE kagzi.steps DROP CONSTRAINT steps_kind_valid;
ALTER TABLE kagzi.steps ADD CONSTRAINT steps_kind_valid CHECK (kind IN ('STEP', 'SLEEP'));
DROP INDEX kagzi.runs_by_parent;
ALTER TABLE kagzi.runs DROP COLUMN waiting_signal, DROP COLUMN parent_step_key, DROP COLUMN parent_run_id;
