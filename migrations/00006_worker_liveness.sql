-- +goose Up
-- A live worker holds a session-level advisory lock on a connection of its own, on the
-- key it records here: when its process dies, Postgres releases the lock with the
-- connection, and any other worker of the namespace sees it gone (pg_locks), marks the
-- worker OFFLINE and makes its runs claimable at once instead of when their leases pass
-- (store.ReapDeadWorkers). NULL: the worker holds no such lock (leases alone govern).
ALTER TABLE kagzi.workers ADD COLUMN liveness_key bigint;

-- +goose Down
ALTER TABLE kagzi.workers DROP COLUMN liveness_key;
