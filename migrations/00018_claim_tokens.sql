-- +goose Up
-- Claims commit without waiting for their WAL to reach disk (synchronous_commit off in
-- the claim's own transaction, see internal/store ClaimRuns): on the 1-step burn-down
-- the claim loop spent a sixth of its time waiting for those flushes. A claim is not
-- the users' data, and every fenced write of a claimed run commits synchronously,
-- which flushes the claim's WAL first: no write made under a claim outlives a claim
-- that was lost. But a claim lost in a crash of PostgreSQL (its commit record not yet
-- on disk) leaves the run as it was before, and the next claim would take it with the
-- same lease epoch (epoch + 1 again), so the fence (run, epoch) of the lost claim's
-- execution, still going on in its worker, would match the new claim's.
-- So each claim also sets a token of its own, which no later claim can repeat:
-- lease_token, a random uuid drawn by the claiming worker for each claim (passed in the
-- claim's transaction as the setting kagzi.lease_token, read by kagzi.claim_runs), or
-- by the starting client for an eager start. Every fenced write matches the token with
-- the epoch (IS NOT DISTINCT FROM: a run claimed by a library from before this
-- migration has none, and its fences neither). The epoch still counts the claims.
-- runs_history takes the column too: archiving copies runs rows as they are.
ALTER TABLE kagzi.runs ADD COLUMN lease_token uuid;
ALTER TABLE kagzi.runs_history ADD COLUMN lease_token uuid;

-- kagzi.claim_runs claims the given runs, which the caller locked, for the worker: each
-- becomes RUNNING under a new lease epoch and the claim's token (the setting
-- kagzi.lease_token of the claim's transaction; NULL when unset), a claim of a RUNNING
-- run, whose lease passed, counts a takeover, takes the version the worker registered
-- for its type if it had none, and holds a slot of its type's concurrency limit when
-- p_holds_slot.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION kagzi.claim_runs(p_ids uuid[], p_versions text[], p_worker text, p_lease_ms bigint,
    p_holds_slot boolean) RETURNS SETOF kagzi.claimed_run LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY WITH prev AS (
        SELECT p.run_id, p.version, r.available_at
        FROM unnest(p_ids, p_versions) AS p(run_id, version) JOIN kagzi.runs r ON r.run_id = p.run_id
    )
    UPDATE kagzi.runs r SET
        status = 'RUNNING',
        locked_by = p_worker,
        lease_epoch = r.lease_epoch + 1,
        lease_token = nullif(current_setting('kagzi.lease_token', true), '')::uuid,
        available_at = now() + p_lease_ms * interval '1 millisecond',
        started_at = coalesce(r.started_at, now()),
        waiting_signal = NULL, wake_pending = false,
        version = coalesce(r.version, prev.version),
        takeovers = r.takeovers + CASE WHEN r.status = 'RUNNING' THEN 1 ELSE 0 END,
        holds_type_slot = p_holds_slot,
        updated_at = now()
    FROM prev
    WHERE r.run_id = prev.run_id AND r.run_id = ANY (p_ids)
    RETURNING r.run_id, r.namespace, r.workflow_id, r.workflow_type, r.version, r.input, r.attempt,
        r.lease_epoch, r.cancel_requested, r.deadline_at, r.created_at, now(), prev.available_at, r.trace_carrier,
        r.lease_epoch > 1 OR r.forked_from_run_id IS NOT NULL, r.takeovers, r.flow_key, r.holds_type_slot;
END $$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION kagzi.claim_runs(p_ids uuid[], p_versions text[], p_worker text, p_lease_ms bigint,
    p_holds_slot boolean) RETURNS SETOF kagzi.claimed_run LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY WITH prev AS (
        SELECT p.run_id, p.version, r.available_at
        FROM unnest(p_ids, p_versions) AS p(run_id, version) JOIN kagzi.runs r ON r.run_id = p.run_id
    )
    UPDATE kagzi.runs r SET
        status = 'RUNNING',
        locked_by = p_worker,
        lease_epoch = r.lease_epoch + 1,
        available_at = now() + p_lease_ms * interval '1 millisecond',
        started_at = coalesce(r.started_at, now()),
        waiting_signal = NULL, wake_pending = false,
        version = coalesce(r.version, prev.version),
        takeovers = r.takeovers + CASE WHEN r.status = 'RUNNING' THEN 1 ELSE 0 END,
        holds_type_slot = p_holds_slot,
        updated_at = now()
    FROM prev
    WHERE r.run_id = prev.run_id AND r.run_id = ANY (p_ids)
    RETURNING r.run_id, r.namespace, r.workflow_id, r.workflow_type, r.version, r.input, r.attempt,
        r.lease_epoch, r.cancel_requested, r.deadline_at, r.created_at, now(), prev.available_at, r.trace_carrier,
        r.lease_epoch > 1 OR r.forked_from_run_id IS NOT NULL, r.takeovers, r.flow_key, r.holds_type_slot;
END $$;
-- +goose StatementEnd
ALTER TABLE kagzi.runs_history DROP COLUMN lease_token;
ALTER TABLE kagzi.runs DROP COLUMN lease_token;
