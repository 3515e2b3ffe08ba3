-- +goose Up
-- Flow control: limits per workflow type stored in the database (read at every claim,
-- changed at runtime), concurrency keys, priorities and debounce. See
-- docs/flow-control.md.

-- A run's priority (0 by default; higher is claimed first), its concurrency key, whether
-- it holds a slot of its type's concurrency limit while RUNNING (set by each claim:
-- true under a type's concurrency limit), and its debounce key with the latest time its
-- start may be pushed to.
ALTER TABLE kagzi.runs
    ADD COLUMN priority smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 3600),
    ADD COLUMN flow_key text,
    ADD COLUMN holds_type_slot boolean NOT NULL DEFAULT false,
    ADD COLUMN debounce_key text,
    ADD COLUMN debounce_until timestamptz;

-- runs_claimable no longer holds the runs of a concurrency key that never started: they
-- wait in their key's queue (runs_key_queue) and only the claim's key rotation takes
-- them, in start order within the key.
DROP INDEX kagzi.runs_claimable;
CREATE INDEX runs_claimable ON kagzi.runs (namespace, workflow_type, available_at)
    WHERE status IN ('PENDING', 'RUNNING', 'SLEEPING') AND available_at IS NOT NULL
      AND (flow_key IS NULL OR started_at IS NOT NULL);

-- The queue of each concurrency key: its runs that never started, in order.
CREATE INDEX runs_key_queue ON kagzi.runs (namespace, workflow_type, flow_key, available_at)
    WHERE flow_key IS NOT NULL AND started_at IS NULL AND status = 'PENDING';

-- The same runs by start time, for the worker's next wake-up (store.NextWake). Its
-- predicate says priority >= 0 (always true), which the claim's queries do not: a
-- generic plan of the claim once read a key's head through this index, filtering every
-- queued run of the type (80 ms a claim), instead of through runs_key_queue.
CREATE INDEX runs_key_due ON kagzi.runs (namespace, workflow_type, available_at)
    WHERE flow_key IS NOT NULL AND started_at IS NULL AND status = 'PENDING' AND priority >= 0;

-- The holders of each key: its runs that started and have not finished.
CREATE INDEX runs_key_holders ON kagzi.runs (namespace, workflow_type, flow_key)
    WHERE flow_key IS NOT NULL AND started_at IS NOT NULL AND status IN ('PENDING', 'RUNNING', 'SLEEPING');

-- The holders of each limited type's concurrency slots: runs claimed under the limit
-- and still RUNNING (a run that stops running leaves the index with the row version
-- that stops it; its flag is not cleared, nor read, until a claim sets it again).
CREATE INDEX runs_type_holders ON kagzi.runs (namespace, workflow_type) WHERE holds_type_slot AND status = 'RUNNING';

-- One pending run per debounce key of a type: later starts of the key update it.
CREATE UNIQUE INDEX runs_debounce ON kagzi.runs (namespace, workflow_type, debounce_key)
    WHERE debounce_key IS NOT NULL AND started_at IS NULL AND status = 'PENDING';

-- The limits of a workflow type in a namespace. NULL: no such limit.
CREATE TABLE kagzi.flow_limits (
    namespace                 text        NOT NULL,
    workflow_type             text        NOT NULL,
    -- Runs of the type executing at once (RUNNING).
    concurrency               integer     CHECK (concurrency > 0),
    -- Runs of one concurrency key started and not finished (sleeping and waiting
    -- ones hold their key's place).
    key_concurrency           integer     CHECK (key_concurrency > 0),
    -- Runs of the type that begin executing per rate_period_ms, and of one key per
    -- key_rate_period_ms.
    rate                      integer     CHECK (rate > 0),
    rate_period_ms            bigint      CHECK (rate_period_ms > 0),
    key_rate                  integer     CHECK (key_rate > 0),
    key_rate_period_ms        bigint      CHECK (key_rate_period_ms > 0),
    updated_at                timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, workflow_type)
);

-- The sliding windows of the rate limits: for the type (flow_key '') and for each key
-- with a key rate, the starts counted in slots of a tenth of the period from
-- window_start on. A start is admitted only when the slots that overlap the last
-- period hold fewer than the limit, so no window of one period holds more.
CREATE TABLE kagzi.flow_rates (
    namespace     text        NOT NULL,
    workflow_type text        NOT NULL,
    flow_key      text        NOT NULL,
    window_start  timestamptz NOT NULL,
    slots         integer[]   NOT NULL,
    PRIMARY KEY (namespace, workflow_type, flow_key)
);
CREATE INDEX flow_rates_age ON kagzi.flow_rates (window_start);


-- kagzi.flow_rate_room locks the sliding window of a rate limit (rate starts per
-- period_ms; made on first use), moves it on to now, and returns how many starts it
-- admits now. Eleven slots of a tenth of the period each: any window of one period
-- overlaps at most eleven, and starts are admitted only while the eleven that end now
-- hold fewer than rate, so no window of one period ever holds more. The caller records
-- the starts it made with kagzi.flow_rate_add, in the same transaction. Times are the
-- clock's after the row lock (clock_timestamp), not the transaction's start (now()): a
-- claim that waited for the lock must not count its starts in the past.
-- +goose StatementBegin
CREATE FUNCTION kagzi.flow_rate_room(p_ns text, p_type text, p_key text, p_rate integer, p_period_ms bigint)
    RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    w kagzi.flow_rates%ROWTYPE;
    slot interval := (p_period_ms / 10.0) * interval '1 millisecond';
    shift integer;
    at timestamptz;
BEGIN
    INSERT INTO kagzi.flow_rates (namespace, workflow_type, flow_key, window_start, slots)
    VALUES (p_ns, p_type, p_key, clock_timestamp(), array_fill(0, ARRAY[11]))
    ON CONFLICT DO NOTHING;
    SELECT * INTO w FROM kagzi.flow_rates
    WHERE namespace = p_ns AND workflow_type = p_type AND flow_key = p_key FOR UPDATE;
    at := clock_timestamp(); -- after the lock: the claims of a window are timed in lock order
    shift := floor(extract(epoch FROM at - w.window_start) / extract(epoch FROM slot))::integer + 1 - 11;
    IF shift > 0 THEN
        IF shift >= 11 THEN
            w.slots := array_fill(0, ARRAY[11]);
        ELSE
            w.slots := w.slots[shift + 1:11] || array_fill(0, ARRAY[shift]);
        END IF;
        UPDATE kagzi.flow_rates SET window_start = w.window_start + shift * slot, slots = w.slots
        WHERE namespace = p_ns AND workflow_type = p_type AND flow_key = p_key;
    END IF;
    RETURN greatest(p_rate - (SELECT coalesce(sum(s), 0) FROM unnest(w.slots) s), 0);
END $$;
-- +goose StatementEnd

-- kagzi.flow_rate_add records n starts in the slot of the clock's time now, in a rate
-- window that kagzi.flow_rate_room locked (moving the window on when the clock passed
-- its last slot since), so that a start counts until a period after it was made.
-- +goose StatementBegin
CREATE FUNCTION kagzi.flow_rate_add(p_ns text, p_type text, p_key text, p_period_ms bigint, p_n integer)
    RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    w kagzi.flow_rates%ROWTYPE;
    slot interval := (p_period_ms / 10.0) * interval '1 millisecond';
    i integer;
BEGIN
    IF p_n <= 0 THEN
        RETURN;
    END IF;
    SELECT * INTO w FROM kagzi.flow_rates
    WHERE namespace = p_ns AND workflow_type = p_type AND flow_key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    i := greatest(floor(extract(epoch FROM clock_timestamp() - w.window_start) / extract(epoch FROM slot))::integer + 1, 1);
    IF i > 11 THEN
        IF i - 11 >= 11 THEN
            w.slots := array_fill(0, ARRAY[11]);
        ELSE
            w.slots := w.slots[i - 11 + 1:11] || array_fill(0, ARRAY[i - 11]);
        END IF;
        w.window_start := w.window_start + (i - 11) * slot;
        i := 11;
    END IF;
    w.slots[i] := w.slots[i] + p_n;
    UPDATE kagzi.flow_rates SET window_start = w.window_start, slots = w.slots
    WHERE namespace = p_ns AND workflow_type = p_type AND flow_key = p_key;
END $$;
-- +goose StatementEnd

-- kagzi.flow_rate_next is when a full rate window admits a start again: when its oldest
-- counted slot leaves the window (NULL: it is not full, or has no row).
-- +goose StatementBegin
CREATE FUNCTION kagzi.flow_rate_next(p_ns text, p_type text, p_key text, p_rate integer, p_period_ms bigint)
    RETURNS timestamptz LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT w.window_start + (u.first_used - 1 + 11) * ((p_period_ms / 10.0) * interval '1 millisecond')
    FROM kagzi.flow_rates w,
        LATERAL (SELECT min(o) AS first_used, sum(s) AS used FROM unnest(w.slots) WITH ORDINALITY AS u(s, o)
                 WHERE s > 0) u
    WHERE w.namespace = p_ns AND w.workflow_type = p_type AND w.flow_key = p_key AND u.used >= p_rate);
END $$;
-- +goose StatementEnd

-- kagzi.flow_keys_after returns up to n keys of the type's queue after the key p_after
-- and not after p_until (NULL: no bound), in order: a skip scan of runs_key_queue, one
-- index probe a key.
-- +goose StatementBegin
CREATE FUNCTION kagzi.flow_keys_after(p_ns text, p_type text, p_after text, p_until text, p_n integer)
    RETURNS text[] LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (WITH RECURSIVE ks(k, n) AS (
        SELECT (SELECT r.flow_key FROM kagzi.runs r
                WHERE r.namespace = p_ns AND r.workflow_type = p_type AND r.flow_key > p_after
                  AND r.flow_key IS NOT NULL AND r.started_at IS NULL AND r.status = 'PENDING'
                ORDER BY r.flow_key LIMIT 1), 1
        UNION ALL
        SELECT (SELECT r.flow_key FROM kagzi.runs r
                WHERE r.namespace = p_ns AND r.workflow_type = p_type AND r.flow_key > ks.k
                  AND r.flow_key IS NOT NULL AND r.started_at IS NULL AND r.status = 'PENDING'
                ORDER BY r.flow_key LIMIT 1), ks.n + 1
        FROM ks WHERE ks.k IS NOT NULL AND ks.n < p_n
    )
    SELECT coalesce(array_agg(k ORDER BY n), '{}') FROM ks
    WHERE k IS NOT NULL AND (p_until IS NULL OR k <= p_until) AND p_n > 0);
END $$;
-- +goose StatementEnd

-- kagzi.flow_lock_keys returns the keys of ks (in order) whose transaction-scoped lock
-- it took: a key another claim holds is passed over, not waited for.
-- +goose StatementBegin
CREATE FUNCTION kagzi.flow_lock_keys(p_ns text, p_type text, ks text[]) RETURNS text[] LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(cardinality(ks), 0) = 0 THEN
        RETURN '{}';
    END IF;
    RETURN ARRAY(SELECT k FROM unnest(ks) WITH ORDINALITY AS u(k, o)
        WHERE pg_try_advisory_xact_lock(hashtextextended('kagzi.flow.key|' || p_ns || '|' || p_type || '|' || k, 0))
        ORDER BY o);
END $$;
-- +goose StatementEnd

-- A run as the claim returns it (see internal/store/claims.go ClaimRuns).
CREATE TYPE kagzi.claimed_run AS (run_id uuid, namespace text, workflow_id text, workflow_type text,
    version text, input jsonb, attempt integer, lease_epoch bigint, cancel_requested boolean,
    deadline_at timestamptz, created_at timestamptz, db_now timestamptz, prev_available_at timestamptz,
    trace_carrier jsonb, has_steps boolean, takeovers integer, flow_key text, holds_slot boolean);

-- kagzi.claim_runs claims the given runs, which the caller locked, for the worker: each
-- becomes RUNNING under a new lease epoch (a claim of a RUNNING run, whose lease passed,
-- counts a takeover), takes the version the worker registered for its type if it had
-- none, and holds a slot of its type's concurrency limit when p_holds_slot.
-- +goose StatementBegin
CREATE FUNCTION kagzi.claim_runs(p_ids uuid[], p_versions text[], p_worker text, p_lease_ms bigint,
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

-- kagzi.claim_keyed claims queued runs of the type's keys ks (in that order), at most
-- p_share from a key and p_max in all, each key within its room: its concurrency limit
-- (p_key_concurrency, holders counted by this statement, which starts after the caller
-- locked the keys; the claiming worker's runs in p_finishing, whose workflow functions
-- returned and whose ends are being written, do not count) and its rate window
-- (p_key_rate). It returns the claimed runs.
-- +goose StatementBegin
CREATE FUNCTION kagzi.claim_keyed(p_ns text, p_type text, p_version text, ks text[], p_share integer,
    p_max integer, p_key_concurrency integer, p_key_rate integer,
    p_key_rate_period_ms bigint, p_worker text, p_lease_ms bigint, p_holds_slot boolean, p_finishing uuid[])
    RETURNS SETOF kagzi.claimed_run LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM kagzi.claim_runs(ARRAY(
        SELECT q.run_id FROM unnest(ks) WITH ORDINALITY AS k(k, o)
        CROSS JOIN LATERAL (
            SELECT greatest(least(p_share,
                CASE WHEN p_key_concurrency IS NULL THEN p_share ELSE p_key_concurrency - (
                    SELECT count(*)::integer FROM kagzi.runs h
                    WHERE h.namespace = p_ns AND h.workflow_type = p_type AND h.flow_key = k.k
                      AND h.started_at IS NOT NULL AND h.status IN ('PENDING', 'RUNNING', 'SLEEPING')
                      AND h.run_id <> ALL (p_finishing)) END,
                CASE WHEN p_key_rate IS NULL THEN p_share
                    ELSE kagzi.flow_rate_room(p_ns, p_type, k.k, p_key_rate, p_key_rate_period_ms) END), 0) AS room
        ) rm
        CROSS JOIN LATERAL (
            SELECT c.run_id FROM kagzi.runs c
            WHERE c.namespace = p_ns AND c.workflow_type = p_type AND c.flow_key = k.k
              AND c.flow_key IS NOT NULL AND c.started_at IS NULL AND c.status = 'PENDING'
              AND c.available_at <= now() AND (c.version IS NULL OR c.version = p_version)
            ORDER BY c.available_at
            LIMIT rm.room
            FOR UPDATE SKIP LOCKED
        ) q
        ORDER BY k.o
        LIMIT p_max), array_fill(p_version, ARRAY[p_max]), p_worker, p_lease_ms, p_holds_slot);
END $$;
-- +goose StatementEnd

-- kagzi.claim claims up to p_n claimable runs of the worker's types (p_types, with the
-- version each registered, p_versions) in one call, and returns them. Claimable: PENDING
-- runs whose start time has come, SLEEPING runs whose wake time has come, RUNNING runs
-- whose lease passed (their worker died or stalled), and the head of each concurrency
-- key's queue when its key and its type have room. SKIP LOCKED lets any number of
-- workers claim side by side.
--
-- Flow control (docs/flow-control.md), read from kagzi.flow_limits at every claim:
--   * a type's concurrency limit counts the runs that hold its slots (RUNNING runs
--     claimed under the limit, whose lease has not passed), after a lock on the type
--     that is held to the claim's commit and taken before the counting statement
--     starts, so the count sees every claim that committed before: two workers never
--     admit past the limit together;
--   * a key's concurrency limit counts the key's holders (its runs started and not
--     finished, whether running, sleeping or waiting) after a lock on the key
--     (pg_try_advisory_xact_lock: a key another claim holds is passed over);
--   * neither counts the claiming worker's runs in p_finishing: their workflow
--     functions returned, and their ends are being written;
--   * rate limits admit under sliding windows (kagzi.flow_rate_room) locked to the
--     commit: a type's counts every claim of its runs, a key's the first starts of the
--     key's runs;
--   * fairness: the keys of a type take turns in a ring, the runs of no key counting
--     as one member placed before the first key. From the worker's cursor (p_cursors:
--     the last member it served of each type; E'\x01' for the runs of no key), the
--     members are visited in ring order, each getting at most a share of the type's
--     room; the room left goes to the same members once more, and then to the runs of
--     no key. The claim returns each type's new cursor as a row without a run.
-- The runs of no key of types without limits and without queued keys are claimed as
-- before flow control existed: one ordered range of runs_claimable per type
-- (LATERAL), then in available_at order across the types.
-- +goose StatementBegin
CREATE FUNCTION kagzi.claim(p_ns text, p_types text[], p_versions text[], p_cursors text[],
    p_worker text, p_lease_ms bigint, p_n integer, p_finishing uuid[]) RETURNS SETOF kagzi.claimed_run
LANGUAGE plpgsql AS $$
DECLARE
    nt integer := coalesce(cardinality(p_types), 0);
    budget integer := p_n;
    fin uuid[] := coalesce(p_finishing, '{}');
    lims kagzi.flow_limits[] := '{}';
    allow integer[] := '{}';
    taken integer[] := '{}';
    -- Per type: its visited keys (joined by \x1f), how many come before the runs of no
    -- key (split), whether those have a turn in this claim, and the rank of the last
    -- member served (key at position p: 2p; the runs of no key: 2 split + 1).
    key_lists text[] := '{}';
    split integer[] := '{}';
    nokey_turn boolean[] := '{}';
    served integer[] := '{}';
    plain_types text[] := '{}';
    plain_versions text[] := '{}';
    lim kagzi.flow_limits;
    batch kagzi.claimed_run[];
    ids uuid[];
    versions text[];
    ks text[];
    sub text[];
    cur text;
    m integer;
    i integer;
    pass integer;
    seg integer;
    n integer;
    held integer;
    share integer;
    rank integer;
BEGIN
    IF budget <= 0 THEN
        RETURN;
    END IF;
    FOR i IN 1 .. nt LOOP
        lim := NULL;
        SELECT * INTO lim FROM kagzi.flow_limits l WHERE l.namespace = p_ns AND l.workflow_type = p_types[i];
        lims := lims || lim;
        IF lim.concurrency IS NOT NULL THEN
            PERFORM pg_advisory_xact_lock(hashtextextended('kagzi.flow.type|' || p_ns || '|' || p_types[i], 0));
        END IF;
    END LOOP;
    -- Each limited type's room, counted by statements that start after the locks, and
    -- the members of each type's ring to visit.
    FOR i IN 1 .. nt LOOP
        allow := allow || budget;
        taken := taken || 0;
        served := served || 0;
        IF lims[i].concurrency IS NOT NULL THEN
            -- A holder whose lease passed (its worker died) no longer counts: its slot
            -- is free, and the claim that takes the run over holds it again.
            SELECT count(*) INTO held FROM kagzi.runs r
            WHERE r.namespace = p_ns AND r.workflow_type = p_types[i] AND r.holds_type_slot AND r.status = 'RUNNING'
              AND r.available_at > now() AND r.run_id <> ALL (fin);
            allow[i] := greatest(least(allow[i], lims[i].concurrency - held), 0);
        END IF;
        IF lims[i].rate IS NOT NULL THEN
            allow[i] := least(allow[i], kagzi.flow_rate_room(p_ns, p_types[i], '', lims[i].rate, lims[i].rate_period_ms));
        END IF;
        -- The keys with queued runs after the cursor, then, if the ring's end came
        -- first, the runs of no key and the keys from the first one up to the cursor;
        -- the keys with a concurrency limit are locked.
        cur := coalesce(p_cursors[i], '');
        m := allow[i] + 16; -- a few more keys than the room, for keys without any
        ks := '{}';
        sub := '{}';
        IF allow[i] > 0 THEN
            ks := kagzi.flow_keys_after(p_ns, p_types[i], cur, NULL, m);
            IF cur > E'\x01' AND cardinality(ks) < m THEN
                sub := kagzi.flow_keys_after(p_ns, p_types[i], '', cur, m - cardinality(ks));
            END IF;
        END IF;
        nokey_turn := nokey_turn || (cur = '' OR cardinality(ks) < m);
        IF lims[i].key_concurrency IS NOT NULL THEN
            ks := kagzi.flow_lock_keys(p_ns, p_types[i], ks);
            sub := kagzi.flow_lock_keys(p_ns, p_types[i], sub);
        END IF;
        split := split || CASE WHEN cur = '' THEN 0 ELSE cardinality(ks) END;
        ks := ks || sub;
        key_lists := key_lists || array_to_string(ks, E'\x1f');
        IF lims[i].concurrency IS NULL AND lims[i].rate IS NULL AND cardinality(ks) = 0 THEN
            plain_types := plain_types || p_types[i];
            plain_versions := plain_versions || p_versions[i];
            allow[i] := 0; -- claimed below with the other plain types
        END IF;
    END LOOP;

    FOR pass IN 1 .. 2 LOOP
        -- Pass 1: each member's share, in ring order; pass 2: the room left, to the
        -- same members, then to the runs of no key whether or not they had a turn.
        FOR i IN 1 .. nt LOOP
            EXIT WHEN budget <= 0;
            CONTINUE WHEN allow[i] <= 0;
            ks := CASE WHEN key_lists[i] = '' THEN '{}'::text[] ELSE string_to_array(key_lists[i], E'\x1f') END;
            share := CASE WHEN pass = 1 THEN ceil(least(allow[i], budget)::numeric / (cardinality(ks) + 1))::integer
                ELSE least(allow[i], budget) END;
            FOR seg IN 1 .. 4 LOOP
                -- 1: the keys before the runs of no key, 2: those runs (when it is their
                -- turn), 3: the keys after them, 4 (pass 2): those runs in any case.
                EXIT WHEN budget <= 0 OR allow[i] <= 0;
                CONTINUE WHEN (seg = 2 AND NOT nokey_turn[i]) OR (seg = 4 AND (pass = 1 OR nokey_turn[i]));
                n := least(share, allow[i], budget);
                IF seg IN (2, 4) THEN
                    batch := ARRAY(SELECT c FROM kagzi.claim_runs(ARRAY(
                        SELECT c.run_id FROM kagzi.runs c
                        WHERE c.namespace = p_ns AND c.workflow_type = p_types[i]
                          AND c.status IN ('PENDING', 'RUNNING', 'SLEEPING') AND c.available_at <= now()
                          AND (c.flow_key IS NULL OR c.started_at IS NOT NULL)
                          AND (c.version IS NULL OR c.version = p_versions[i])
                        ORDER BY c.available_at
                        LIMIT n
                        FOR UPDATE SKIP LOCKED), array_fill(p_versions[i], ARRAY[n]),
                        p_worker, p_lease_ms, lims[i].concurrency IS NOT NULL) c);
                    IF cardinality(batch) > 0 THEN
                        served[i] := greatest(served[i], 2 * split[i] + 1);
                    END IF;
                ELSE
                    sub := CASE WHEN seg = 1 THEN ks[1:split[i]] ELSE ks[split[i] + 1:cardinality(ks)] END;
                    CONTINUE WHEN coalesce(cardinality(sub), 0) = 0;
                    batch := ARRAY(SELECT c FROM kagzi.claim_keyed(p_ns, p_types[i], p_versions[i], sub, share,
                        least(allow[i], budget), lims[i].key_concurrency, lims[i].key_rate,
                        lims[i].key_rate_period_ms, p_worker, p_lease_ms, lims[i].concurrency IS NOT NULL, fin) c);
                    IF lims[i].key_rate IS NOT NULL THEN
                        PERFORM kagzi.flow_rate_add(p_ns, p_types[i], b.flow_key, lims[i].key_rate_period_ms, count(*)::integer)
                        FROM unnest(batch) b GROUP BY b.flow_key;
                    END IF;
                    served[i] := greatest(served[i], coalesce((SELECT 2 * max(array_position(ks, b.flow_key))
                        FROM unnest(batch) b), 0));
                END IF;
                n := coalesce(cardinality(batch), 0);
                allow[i] := allow[i] - n;
                taken[i] := taken[i] + n;
                budget := budget - n;
                RETURN QUERY SELECT * FROM unnest(batch);
            END LOOP;
        END LOOP;
        IF pass = 1 AND budget > 0 AND cardinality(plain_types) > 0 THEN
            SELECT array_agg(c.run_id ORDER BY c.available_at), array_agg(c.version ORDER BY c.available_at)
            INTO ids, versions
            FROM (
                SELECT c.run_id, c.available_at, t.version
                FROM unnest(plain_types, plain_versions) AS t(workflow_type, version),
                LATERAL (
                    SELECT r.run_id, r.available_at FROM kagzi.runs r
                    WHERE r.namespace = p_ns AND r.workflow_type = t.workflow_type
                      AND r.status IN ('PENDING', 'RUNNING', 'SLEEPING') AND r.available_at <= now()
                      AND (r.flow_key IS NULL OR r.started_at IS NOT NULL)
                      AND (r.version IS NULL OR r.version = t.version)
                    ORDER BY r.available_at
                    LIMIT budget
                    FOR UPDATE SKIP LOCKED
                ) c
                ORDER BY c.available_at
                LIMIT budget
            ) c;
            IF ids IS NOT NULL THEN
                RETURN QUERY SELECT * FROM kagzi.claim_runs(ids, versions, p_worker, p_lease_ms, false);
                GET DIAGNOSTICS n = ROW_COUNT;
                budget := budget - n;
            END IF;
        END IF;
    END LOOP;
    FOR i IN 1 .. nt LOOP
        -- The type's own rate window counts every claim of its runs.
        IF lims[i].rate IS NOT NULL AND taken[i] > 0 THEN
            PERFORM kagzi.flow_rate_add(p_ns, p_types[i], '', lims[i].rate_period_ms, taken[i]);
        END IF;
        -- The type's next cursor: the last member served, else the last one visited.
        CONTINUE WHEN key_lists[i] = '';
        ks := string_to_array(key_lists[i], E'\x1f');
        rank := CASE WHEN served[i] > 0 THEN served[i]
            WHEN cardinality(ks) > split[i] THEN 2 * cardinality(ks)
            WHEN nokey_turn[i] THEN 2 * split[i] + 1
            ELSE 2 * cardinality(ks) END;
        RETURN NEXT ROW(NULL, p_ns, NULL, p_types[i], NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            NULL, NULL, CASE WHEN rank % 2 = 1 THEN E'\x01' ELSE ks[rank / 2] END, NULL)::kagzi.claimed_run;
    END LOOP;
END $$;
-- +goose StatementEnd

-- The trigger of a run's changes also tells the workers of a limited type (or of a
-- concurrency key's runs) that a holder stopped running: the runs it held back may be
-- claimed now. (The rest of the function is as in the baseline.)
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION kagzi.run_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    parent_type text;
    parent_status text;
    child record;
BEGIN
    IF NEW.parent_run_id IS NOT NULL
       AND NEW.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
       AND OLD.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED') THEN
        UPDATE kagzi.runs p SET wake_pending = true,
            available_at = CASE WHEN p.status = 'SLEEPING' AND p.available_at > now() THEN now() ELSE p.available_at END
        WHERE p.run_id = NEW.parent_run_id AND p.status IN ('PENDING', 'RUNNING', 'SLEEPING')
        RETURNING p.workflow_type, p.status INTO parent_type, parent_status;
        IF parent_status = 'SLEEPING' THEN
            PERFORM pg_notify('kagzi', 'w|' || octet_length(NEW.namespace) || ':' || NEW.namespace || '|' || parent_type || '|'
                || (extract(epoch FROM now()) * 1000)::bigint);
        END IF;
    END IF;
    IF (NEW.cancel_requested AND NOT OLD.cancel_requested)
       OR (NEW.status = 'CANCELLED' AND OLD.status <> 'CANCELLED')
       OR (NEW.status = 'FAILED' AND OLD.status <> 'FAILED' AND NEW.error->>'code' = 'DEADLINE_EXCEEDED') THEN
        FOR child IN
            UPDATE kagzi.runs c SET
                cancel_requested = true,
                status = CASE WHEN c.status IN ('PENDING', 'SLEEPING') THEN 'CANCELLED' ELSE c.status END,
                finished_at = CASE WHEN c.status IN ('PENDING', 'SLEEPING') THEN now() ELSE c.finished_at END,
                updated_at = now()
            WHERE c.parent_run_id = NEW.run_id AND c.status IN ('PENDING', 'RUNNING', 'SLEEPING')
              AND NOT c.cancel_requested
            RETURNING c.run_id, c.namespace, c.status
        LOOP
            IF child.status = 'CANCELLED' THEN
                PERFORM pg_notify('kagzi', 'd|' || child.run_id || '|CANCELLED');
            ELSE
                PERFORM pg_notify('kagzi', 'c|' || child.namespace || '|' || child.run_id);
            END IF;
        END LOOP;
    END IF;
    -- A run that held a slot of its type's concurrency limit, or a place of its
    -- concurrency key, and stops running: the workers of its type may claim another.
    IF OLD.status IS DISTINCT FROM NEW.status AND OLD.status = 'RUNNING'
       AND (OLD.holds_type_slot OR (NEW.flow_key IS NOT NULL AND NEW.started_at IS NOT NULL)) THEN
        PERFORM pg_notify('kagzi', 'w|' || octet_length(NEW.namespace) || ':' || NEW.namespace || '|'
            || NEW.workflow_type || '|' || (extract(epoch FROM now()) * 1000)::bigint);
    END IF;
    RETURN NEW;
END $$;

-- +goose StatementEnd

DROP TRIGGER runs_changed ON kagzi.runs;
CREATE TRIGGER runs_changed AFTER UPDATE OF status, cancel_requested ON kagzi.runs
    FOR EACH ROW
    WHEN ((OLD.status IS DISTINCT FROM NEW.status
           AND (NEW.parent_run_id IS NOT NULL OR NEW.status IN ('CANCELLED', 'FAILED')
                OR (OLD.status = 'RUNNING' AND (OLD.holds_type_slot OR NEW.flow_key IS NOT NULL))))
          OR OLD.cancel_requested IS DISTINCT FROM NEW.cancel_requested)
    EXECUTE FUNCTION kagzi.run_changed();

-- +goose Down
DROP TRIGGER runs_changed ON kagzi.runs;
CREATE TRIGGER runs_changed AFTER UPDATE OF status, cancel_requested ON kagzi.runs
    FOR EACH ROW
    WHEN ((OLD.status IS DISTINCT FROM NEW.status
           AND (NEW.parent_run_id IS NOT NULL OR NEW.status IN ('CANCELLED', 'FAILED')))
          OR OLD.cancel_requested IS DISTINCT FROM NEW.cancel_requested)
    EXECUTE FUNCTION kagzi.run_changed();
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION kagzi.run_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    parent_type text;
    parent_status text;
    child record;
BEGIN
    IF NEW.parent_run_id IS NOT NULL
       AND NEW.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
       AND OLD.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED') THEN
        UPDATE kagzi.runs p SET wake_pending = true,
            available_at = CASE WHEN p.status = 'SLEEPING' AND p.available_at > now() THEN now() ELSE p.available_at END
        WHERE p.run_id = NEW.parent_run_id AND p.status IN ('PENDING', 'RUNNING', 'SLEEPING')
        RETURNING p.workflow_type, p.status INTO parent_type, parent_status;
        IF parent_status = 'SLEEPING' THEN
            PERFORM pg_notify('kagzi', 'w|' || octet_length(NEW.namespace) || ':' || NEW.namespace || '|' || parent_type || '|'
                || (extract(epoch FROM now()) * 1000)::bigint);
        END IF;
    END IF;
    IF (NEW.cancel_requested AND NOT OLD.cancel_requested)
       OR (NEW.status = 'CANCELLED' AND OLD.status <> 'CANCELLED')
       OR (NEW.status = 'FAILED' AND OLD.status <> 'FAILED' AND NEW.error->>'code' = 'DEADLINE_EXCEEDED') THEN
        FOR child IN
            UPDATE kagzi.runs c SET
                cancel_requested = true,
                status = CASE WHEN c.status IN ('PENDING', 'SLEEPING') THEN 'CANCELLED' ELSE c.status END,
                finished_at = CASE WHEN c.status IN ('PENDING', 'SLEEPING') THEN now() ELSE c.finished_at END,
                updated_at = now()
            WHERE c.parent_run_id = NEW.run_id AND c.status IN ('PENDING', 'RUNNING', 'SLEEPING')
              AND NOT c.cancel_requested
            RETURNING c.run_id, c.namespace, c.status
        LOOP
            IF child.status = 'CANCELLED' THEN
                PERFORM pg_notify('kagzi', 'd|' || child.run_id || '|CANCELLED');
            ELSE
                PERFORM pg_notify('kagzi', 'c|' || child.namespace || '|' || child.run_id);
            END IF;
        END LOOP;
    END IF;
    RETURN NEW;
END $$;

-- +goose StatementEnd
DROP FUNCTION kagzi.claim, kagzi.claim_keyed, kagzi.claim_runs, kagzi.flow_lock_keys, kagzi.flow_keys_after, kagzi.flow_rate_room,
    kagzi.flow_rate_add, kagzi.flow_rate_next;
DROP TYPE kagzi.claimed_run;
DROP TABLE kagzi.flow_rates, kagzi.flow_limits;
DROP INDEX kagzi.runs_debounce, kagzi.runs_key_due, kagzi.runs_type_holders, kagzi.runs_key_holders, kagzi.runs_key_queue;
DROP INDEX kagzi.runs_claimable;
CREATE INDEX runs_claimable ON kagzi.runs (namespace, workflow_type, available_at)
    WHERE status IN ('PENDING', 'RUNNING', 'SLEEPING') AND available_at IS NOT NULL;
ALTER TABLE kagzi.runs DROP COLUMN priority, DROP COLUMN flow_key, DROP COLUMN holds_type_slot,
    DROP COLUMN debounce_key, DROP COLUMN debounce_until;
