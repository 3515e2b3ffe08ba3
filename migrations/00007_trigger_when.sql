-- +goose Up
-- runs_changed only has work for children that end and for runs that are cancelled or
-- fail (their children may need cancelling): skip the plpgsql call for the common case,
-- a run without a parent that completes.
DROP TRIGGER runs_changed ON kagzi.runs;
CREATE TRIGGER runs_changed AFTER UPDATE OF status, cancel_requested ON kagzi.runs
    FOR EACH ROW
    WHEN ((OLD.status IS DISTINCT FROM NEW.status
           AND (NEW.parent_run_id IS NOT NULL OR NEW.status IN ('CANCELLED', 'FAILED')))
          OR OLD.cancel_requested IS DISTINCT FROM NEW.cancel_requested)
    EXECUTE FUNCTION kagzi.run_changed();

-- +goose Down
DROP TRIGGER runs_changed ON kagzi.runs;
CREATE TRIGGER runs_changed AFTER UPDATE OF status, cancel_requested ON kagzi.runs
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.cancel_requested IS DISTINCT FROM NEW.cancel_requested)
    EXECUTE FUNCTION kagzi.run_changed();
