-- +goose Up
-- The worker registry: every Worker registers on start, heartbeats, is DRAINING while it
-- shuts down and OFFLINE after. A worker that stops heartbeating is marked OFFLINE by the
-- others after three of its own heartbeat intervals, and its row is pruned a day later.
CREATE TABLE kagzi.workers (
    namespace          text        NOT NULL,
    worker_id          text        NOT NULL,
    hostname           text        NOT NULL,
    pid                integer     NOT NULL,
    version            text        NOT NULL,
    labels             jsonb       NOT NULL DEFAULT '{}',
    workflow_types     text[]      NOT NULL,
    max_concurrent     integer     NOT NULL,
    heartbeat_interval_ms bigint   NOT NULL,
    status             text        NOT NULL,
    active_runs        integer     NOT NULL DEFAULT 0,
    completed_total    bigint      NOT NULL DEFAULT 0,
    failed_total       bigint      NOT NULL DEFAULT 0,
    started_at         timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    stopped_at         timestamptz,
    PRIMARY KEY (namespace, worker_id),
    CONSTRAINT workers_status_valid CHECK (status IN ('ONLINE', 'DRAINING', 'OFFLINE'))
);

-- Expiry of silent workers and the "pending types with no live worker" health check.
CREATE INDEX workers_live ON kagzi.workers (namespace, last_heartbeat_at) WHERE status <> 'OFFLINE';

-- +goose Down
DROP TABLE kagzi.workers;
