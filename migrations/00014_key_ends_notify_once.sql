-- +goose Up
-- The end of a run of a concurrency key frees its key's place, and the key's next run
-- waits for a worker to hear of it. The run_changed trigger told the type's workers
-- for every such end: a trigger event, a function call and a notification each (a
-- twentieth of the PostgreSQL work of a keyed burn-down). A worker's end of a run
-- (store.FinishRun) now notifies once per statement for each type whose keys its
-- ends freed, as it does for type slots since 00010, and a continue-as-new's next run
-- notifies its type when it is inserted; COMPLETED is reached no other way, so the
-- trigger no longer fires for a keyed run that completes. A keyed run that ends FAILED
-- or CANCELLED (a cancel, a passed deadline, a worker's failure) still fires it.
DROP TRIGGER runs_changed ON kagzi.runs;
CREATE TRIGGER runs_changed AFTER UPDATE OF status, cancel_requested ON kagzi.runs
    FOR EACH ROW
    WHEN ((OLD.status IS DISTINCT FROM NEW.status
           AND (NEW.parent_run_id IS NOT NULL OR NEW.status IN ('CANCELLED', 'FAILED')
                OR (OLD.status = 'RUNNING' AND OLD.holds_type_slot AND NEW.holds_type_slot)))
          OR OLD.cancel_requested IS DISTINCT FROM NEW.cancel_requested)
    EXECUTE FUNCTION kagzi.run_changed();

-- +goose Down
DROP TRIGGER runs_changed ON kagzi.runs;
CREATE TRIGGER runs_changed AFTER UPDATE OF status, cancel_requested ON kagzi.runs
    FOR EACH ROW
    WHEN ((OLD.status IS DISTINCT FROM NEW.status
           AND (NEW.parent_run_id IS NOT NULL OR NEW.status IN ('CANCELLED', 'FAILED')
                OR (OLD.status = 'RUNNING' AND OLD.holds_type_slot AND NEW.holds_type_slot)
                OR (NEW.flow_key IS NOT NULL AND NEW.status = 'COMPLETED')))
          OR OLD.cancel_requested IS DISTINCT FROM NEW.cancel_requested)
    EXECUTE FUNCTION kagzi.run_changed();
