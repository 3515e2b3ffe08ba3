-- +goose Up
-- A start with IDReuseNever must find the newest finished run of its workflow id that
-- was itself started with IDReuseNever, in the live table and in the history. In the
-- history it probed the workflow-id index of every partition, one per retained day:
-- 0.15-0.3 ms more per start with 33 days (the lock, setup and probe of each
-- partition, whatever their size), growing with Retention. history_ids holds the
-- workflow id of every archived run that was started with IDReuseNever, with the
-- partition key of its history row: the start reads one index, and reads the history
-- only when the id is there (to return the run). The archiver adds the rows, a restore
-- (rerun, reset) and a namespace's pruning remove them with their runs, and dropping
-- a day's partitions deletes the day's rows after the partitions are gone; a row whose
-- run is gone all the same is found stale by the start that reads it, and deleted.
CREATE TABLE kagzi.history_ids (
    namespace       text        NOT NULL,
    workflow_id     text        NOT NULL,
    created_at      timestamptz NOT NULL,
    run_id          uuid        NOT NULL,
    run_finished_at timestamptz NOT NULL,
    PRIMARY KEY (namespace, workflow_id, created_at, run_id)
);
CREATE INDEX history_ids_finished ON kagzi.history_ids (run_finished_at);

INSERT INTO kagzi.history_ids (namespace, workflow_id, created_at, run_id, run_finished_at)
SELECT namespace, workflow_id, created_at, run_id, finished_at FROM kagzi.runs_history WHERE id_reuse_never
ON CONFLICT DO NOTHING;

-- +goose Down
DROP TABLE kagzi.history_ids;
