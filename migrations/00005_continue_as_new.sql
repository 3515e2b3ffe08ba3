-- +goose Up
-- Continue-as-new (kagzi.ContinueAsNew): a run that continued as new ended COMPLETED
-- with continued_as_run_id naming the fresh run of its workflow id, which names it in
-- continued_from_run_id. Wait and a parent's ChildRun.Get follow the chain.
ALTER TABLE kagzi.runs
    ADD COLUMN continued_from_run_id uuid,
    ADD COLUMN continued_as_run_id uuid;

-- +goose Down
ALTER TABLE kagzi.runs
    DROP COLUMN continued_as_run_id,
    DROP COLUMN continued_from_run_id;
