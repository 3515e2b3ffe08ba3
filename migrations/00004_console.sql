-- +goose Up
-- The operator console (package ui): its audit log, and an index its run page reads.

-- Every action taken through the console, one row each: who (as the console's
-- authorization hook named them), what, when, on which runs, and how it ended. A row is
-- written before the action runs (outcome NULL) and completed after it, so an action
-- cut short by a crash still shows.
CREATE TABLE kagzi.console_audit (
    id          bigserial   PRIMARY KEY,
    namespace   text        NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    who         text        NOT NULL,
    -- cancel, rerun, fork, signal, pause, resume, trigger, bulk-cancel, bulk-rerun.
    action      text        NOT NULL,
    -- The run or schedule acted on; for a bulk action, its filter in words.
    target      text        NOT NULL DEFAULT '',
    -- The runs acted on: the one run, a fork's or a trigger's new run too, or the first
    -- 1000 runs a bulk action changed (run_count counts them all).
    run_ids     uuid[]      NOT NULL DEFAULT '{}',
    run_count   bigint      NOT NULL DEFAULT 0,
    -- The action's parameters and result: a bulk action's filter and counts, a signal's
    -- name, a fork's step.
    detail      jsonb       NOT NULL DEFAULT '{}',
    -- NULL while the action runs; then 'ok' or the error.
    outcome     text,
    finished_at timestamptz
);

-- The audit view: a namespace's actions, newest first.
CREATE INDEX console_audit_by_namespace ON kagzi.console_audit (namespace, id DESC);
-- A run's page lists the actions taken on it.
CREATE INDEX console_audit_by_run ON kagzi.console_audit USING gin (run_ids);

-- Every signal of a run, received or not, in the order sent (signals_pending holds only
-- those not yet received): the console's run page and Client.ListSignals. Deleting a run
-- (retention) cascades to its signals through this index too.
CREATE INDEX signals_by_run ON kagzi.signals (run_id, id);

-- +goose Down
DROP INDEX kagzi.signals_by_run;
DROP TABLE kagzi.console_audit;
