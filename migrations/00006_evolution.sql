-- +goose Up
-- Evolving workflows: versions, the determinism check, forks, and retention.

-- The version of the workflow definition a run started with. NULL: whichever version the
-- first worker to claim it registered (it is pinned then).
ALTER TABLE kagzi.runs
    ADD COLUMN version           text,
    -- A fork names the run and step it was copied from.
    ADD COLUMN forked_from_run_id uuid,
    ADD COLUMN forked_from_step   text;

-- Workers register the version of each of their workflow types (same order as the types).
ALTER TABLE kagzi.workers ADD COLUMN workflow_versions text[] NOT NULL DEFAULT '{}';

-- The position of a step among the calls of its scope (the workflow function, or one
-- branch), so a replay that asks for another step at a recorded position is caught.
ALTER TABLE kagzi.steps ADD COLUMN position integer;

ALTER TABLE kagzi.steps DROP CONSTRAINT steps_kind_valid;
ALTER TABLE kagzi.steps ADD CONSTRAINT steps_kind_valid
    CHECK (kind IN ('STEP', 'SLEEP', 'CHILD', 'SIGNAL', 'EVENT', 'PATCH'));

-- Retention prunes finished runs oldest first, a small batch at a time.
CREATE INDEX runs_finished ON kagzi.runs (namespace, finished_at)
    WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED');

-- A signal for a run, or the end of a child of it, sets wake_pending on the run in the
-- same row update that wakes it if it sleeps. A run suspending to wait reads the flag in
-- its own UPDATE of the row, so whichever commits first, the waiter is never left
-- asleep with what it waits for already there.
ALTER TABLE kagzi.runs ADD COLUMN wake_pending boolean NOT NULL DEFAULT false;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION kagzi.run_changed() RETURNS trigger LANGUAGE plpgsql AS $$
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

-- +goose Down
-- +goose StatementBegin
-- One place for what follows a run's change of status or cancel flag, whichever
-- statement made it:
--   * a child that ends wakes its parent if the parent sleeps (it may be waiting for it);
--   * a run that is cancelled, or fails on its deadline, cancels its active children
--     (which cascades down, since their change fires this trigger too).
CREATE OR REPLACE FUNCTION kagzi.run_changed() RETURNS trigger LANGUAGE plpgsql AS $$
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
ALTER TABLE kagzi.runs DROP COLUMN wake_pending;
DROP INDEX kagzi.runs_finished;
ALTER TABLE kagzi.steps DROP CONSTRAINT steps_kind_valid;
ALTER TABLE kagzi.steps ADD CONSTRAINT steps_kind_valid
    CHECK (kind IN ('STEP', 'SLEEP', 'CHILD', 'SIGNAL', 'EVENT'));
ALTER TABLE kagzi.steps DROP COLUMN position;
ALTER TABLE kagzi.workers DROP COLUMN workflow_versions;
ALTER TABLE kagzi.runs DROP COLUMN forked_from_step, DROP COLUMN forked_from_run_id, DROP COLUMN version;
