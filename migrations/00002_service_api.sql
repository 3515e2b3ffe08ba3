-- +goose Up
-- The service API of issue 21: searchable attributes of runs, listing children in
-- keyset order, signal idempotency keys, and the step kind of SetAttributes.

-- Searchable attributes of a run: a JSON object of the caller's keys (WithAttributes at
-- the start, Context.SetAttributes from the workflow), NULL for a run that has none.
-- They are not payloads: the payload codec does not apply to them, so that ListRuns
-- can select runs by them. Adding a nullable column without a default rewrites nothing.
ALTER TABLE kagzi.runs ADD COLUMN attributes jsonb;

-- ListRuns' attribute filter (containment, attributes @> filter). Partial, so that runs
-- without attributes (most of them) add nothing to it when their rows are rewritten;
-- jsonb_path_ops, whose entries are hashes of paths, is smaller than the default
-- operator class and serves @>, the only operator ListRuns uses. A GIN index gives no
-- order: a page of runs selected by attributes is the index's matches sorted, which is
-- why the filter is meant for keys that select few runs (ids).
CREATE INDEX runs_by_attributes ON kagzi.runs USING gin (attributes jsonb_path_ops)
    WHERE attributes IS NOT NULL;

-- The children of a run in ListRuns' keyset order (created_at, run_id), either way, so a
-- page of them is read in order without a sort. It replaces runs_by_parent, which
-- lacked run_id; the trigger's "active children of a run" reads its first column as
-- before.
DROP INDEX kagzi.runs_by_parent;
CREATE INDEX runs_by_parent ON kagzi.runs (parent_run_id, created_at DESC, run_id DESC)
    WHERE parent_run_id IS NOT NULL;

-- A signal's idempotency key (SignalKey): a signal sent again with the key of one the
-- run already has is not stored again. NULL for signals sent without one.
ALTER TABLE kagzi.signals ADD COLUMN key text;
CREATE UNIQUE INDEX signals_key ON kagzi.signals (run_id, key) WHERE key IS NOT NULL;

-- Steps of kind ATTRIBUTES record a Context.SetAttributes. The constraint only widens,
-- so every existing row satisfies it: NOT VALID spares the scan of every step (and the
-- lock held meanwhile); new and updated rows are checked as before.
ALTER TABLE kagzi.steps DROP CONSTRAINT steps_kind_valid;
ALTER TABLE kagzi.steps ADD CONSTRAINT steps_kind_valid
    CHECK (kind IN ('STEP', 'SLEEP', 'CHILD', 'SIGNAL', 'EVENT', 'PATCH', 'ATTRIBUTES')) NOT VALID;

-- +goose Down
DELETE FROM kagzi.steps WHERE kind = 'ATTRIBUTES';
ALTER TABLE kagzi.steps DROP CONSTRAINT steps_kind_valid;
ALTER TABLE kagzi.steps ADD CONSTRAINT steps_kind_valid
    CHECK (kind IN ('STEP', 'SLEEP', 'CHILD', 'SIGNAL', 'EVENT', 'PATCH'));
DROP INDEX kagzi.signals_key;
ALTER TABLE kagzi.signals DROP COLUMN key;
DROP INDEX kagzi.runs_by_parent;
CREATE INDEX runs_by_parent ON kagzi.runs (parent_run_id, created_at DESC) WHERE parent_run_id IS NOT NULL;
DROP INDEX kagzi.runs_by_attributes;
ALTER TABLE kagzi.runs DROP COLUMN attributes;
