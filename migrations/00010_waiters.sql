-- +goose Up
-- Clients waiting for run ends (Run.Wait, a schedule's overlap policy) register here,
-- for a minute at a time, while they wait. A run's end notifies only when a client
-- other than the ending worker's own waits in its namespace: the ending worker tells
-- its own client's waiters in process. A transaction that notifies holds a server-wide
-- lock through its commit, so every notifying run end serialised the commits of all
-- the others.
CREATE TABLE kagzi.waiters (
    namespace  text        NOT NULL,
    client_id  uuid        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (namespace, client_id)
);

-- +goose Down
DROP TABLE kagzi.waiters;
