-- +goose Up
-- A run of a concurrency key holds its key's place from its first claim until it ends,
-- sleeping and waiting included. The run_changed trigger notified the type's workers
-- when such a run stopped RUNNING, so the end of a holder that was SLEEPING or PENDING
-- (a cancel, a passed deadline) told no worker that its key had room again: the key's
-- next run waited for a worker's poll (PollInterval, 5 s by default). It now notifies
-- when a keyed run that started ends, from whatever status, and no longer when a keyed
-- run merely goes to sleep, which frees no place (a type slot still notifies: a
-- sleeping run holds none).
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
    -- A run that held a slot of its type's concurrency limit and stops running, or a
    -- run that held a place of its concurrency key and ends (from RUNNING, or from
    -- SLEEPING or PENDING: a cancel, a deadline): the workers of its type may claim
    -- another. A worker's end of a run that held a slot clears holds_type_slot and
    -- notifies once for the ends of its statement (store.FinishRun), so not here.
    IF OLD.status IS DISTINCT FROM NEW.status
       AND ((OLD.status = 'RUNNING' AND OLD.holds_type_slot AND NEW.holds_type_slot)
            OR (NEW.flow_key IS NOT NULL AND NEW.started_at IS NOT NULL
                AND NEW.status IN ('COMPLETED', 'FAILED', 'CANCELLED'))) THEN
        PERFORM pg_notify('kagzi', 'w|' || octet_length(NEW.namespace) || ':' || NEW.namespace || '|'
            || NEW.workflow_type || '|' || (extract(epoch FROM now()) * 1000)::bigint);
    END IF;
    RETURN NEW;
END $$;

-- +goose StatementEnd

DROP TRIGGER runs_changed ON kagzi.runs;
CREATE TRIGGER runs_changed AFTER UPDATE OF status, cancel_requested ON kagzi.runs
    FOR EACH ROW
    WHEN ((OLD.status IS DISTINCT FROM NEW.status
           AND (NEW.parent_run_id IS NOT NULL OR NEW.status IN ('CANCELLED', 'FAILED')
                OR (OLD.status = 'RUNNING' AND OLD.holds_type_slot AND NEW.holds_type_slot)
                OR (NEW.flow_key IS NOT NULL AND NEW.status = 'COMPLETED')))
          OR OLD.cancel_requested IS DISTINCT FROM NEW.cancel_requested)
    EXECUTE FUNCTION kagzi.run_changed();

-- +goose Down
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
    -- A run that held a slot of its type's concurrency limit, or a place of its
    -- concurrency key, and stops running: the workers of its type may claim another.
    -- A worker's end of a run that held a slot clears holds_type_slot and notifies
    -- once for the ends of its statement (store.FinishRun), so not here.
    IF OLD.status IS DISTINCT FROM NEW.status AND OLD.status = 'RUNNING'
       AND ((OLD.holds_type_slot AND NEW.holds_type_slot)
            OR (NEW.flow_key IS NOT NULL AND NEW.started_at IS NOT NULL)) THEN
        PERFORM pg_notify('kagzi', 'w|' || octet_length(NEW.namespace) || ':' || NEW.namespace || '|'
            || NEW.workflow_type || '|' || (extract(epoch FROM now()) * 1000)::bigint);
    END IF;
    RETURN NEW;
END $$;

-- +goose StatementEnd

DROP TRIGGER runs_changed ON kagzi.runs;
CREATE TRIGGER runs_changed AFTER UPDATE OF status, cancel_requested ON kagzi.runs
    FOR EACH ROW
    WHEN ((OLD.status IS DISTINCT FROM NEW.status
           AND (NEW.parent_run_id IS NOT NULL OR NEW.status IN ('CANCELLED', 'FAILED')
                OR (OLD.status = 'RUNNING' AND ((OLD.holds_type_slot AND NEW.holds_type_slot)
                                            OR NEW.flow_key IS NOT NULL))))
          OR OLD.cancel_requested IS DISTINCT FROM NEW.cancel_requested)
    EXECUTE FUNCTION kagzi.run_changed();
