-- +goose Up
-- Wake topics name the namespace with its length in bytes, "w|<length>:<namespace>|<type>",
-- so that a namespace or workflow type holding '|' cannot share another pair's topic
-- (namespace "a|b" with type "c" and namespace "a" with type "b|c" were both "w|a|b|c").
-- The only change to run_changed is the topic of the parent's wake-up.
-- During a rolling upgrade, workers of the older build do not hear wake-ups sent in the
-- new form (nor the new build the old form): they find such runs at their next poll.
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
    RETURN NEW;
END $$;
-- +goose StatementEnd

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
