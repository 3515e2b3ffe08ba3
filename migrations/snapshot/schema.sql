-- The kagzi schema as the migrations build it: pg_dump --schema-only --schema=kagzi
-- --no-owner --no-privileges --no-tablespaces of a freshly migrated database, without
-- pg_dump's comments and session settings. Generated; do not edit. After changing the
-- migrations, regenerate it with: go test ./migrations -run TestSchemaSnapshot -update

CREATE SCHEMA kagzi;

CREATE TYPE kagzi.claimed_run AS (
	run_id uuid,
	namespace text,
	workflow_id text,
	workflow_type text,
	version text,
	input jsonb,
	attempt integer,
	lease_epoch bigint,
	cancel_requested boolean,
	deadline_at timestamp with time zone,
	created_at timestamp with time zone,
	db_now timestamp with time zone,
	prev_available_at timestamp with time zone,
	trace_carrier jsonb,
	has_steps boolean,
	takeovers integer,
	flow_key text,
	holds_slot boolean
);

CREATE FUNCTION kagzi.claim(p_ns text, p_types text[], p_versions text[], p_cursors text[], p_worker text, p_lease_ms bigint, p_n integer, p_finishing uuid[], p_floors timestamp with time zone[], p_walk boolean[], p_key_floors timestamp with time zone[], p_key_scans boolean[]) RETURNS SETOF kagzi.claimed_run
    LANGUAGE plpgsql
    AS $$
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
    -- Per type: how many of its keys the claim passed over (locked by other claims).
    passed integer[] := '{}';
    -- Per limited or keyed type: whether the claim read its runs of no key, whether a
    -- read came back short (the range was read through up to now), and the latest
    -- claimable time of the runs it claimed there: the type's next floor.
    nk_read boolean[] := '{}';
    nk_short boolean[] := '{}';
    nk_last timestamptz[] := '{}';
    -- Per type: whether its own rate window held runs back; the keys of key-rate types
    -- that the claim visited and took nothing from (the type's position, \x1f, the key);
    -- and when the soonest of those full windows admits again.
    rate_held boolean[] := '{}';
    rate_room integer;
    unserved text[] := '{}';
    -- The keys (the type's position, \x1f, the key) that the first pass left with
    -- nothing more to give.
    spent text[] := '{}';
    next_at timestamptz;
    -- Per type: whether the walk of the ring stopped at its cap, whether it came round
    -- past the key space's end, the last key it walked, and the cursor after a walk
    -- beyond the cap (NULL: none).
    walk_capped boolean[] := '{}';
    walk_wrapped boolean[] := '{}';
    walk_end text[] := '{}';
    beyond_cursor text[] := '{}';
    beyond text[];
    full_keys text[];
    locked_keys text[];
    -- Per type: whether its next claim walks the ring with the skip scan rather than
    -- read its queued keys from the floor (see below); the keys this one read there
    -- (NULL: it did not, or there were too many).
    scan_next boolean[] := '{}';
    ring text[];
    plain_types text[] := '{}';
    plain_versions text[] := '{}';
    plain_floors timestamptz[] := '{}';
    plain_asked integer;
    claimed_types text[];
    claimed_at timestamptz[];
    floors timestamptz[] := '{}';
    key_first timestamptz[];
    kf timestamptz;
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
    -- Each type's limits (a row of NULLs: none), and the types with queued runs of
    -- concurrency keys, one statement each for all the types: a worker of fifty
    -- types claimed a quarter slower when each type cost a lookup and a skip scan.
    lims := ARRAY(SELECT l FROM unnest(p_types) WITH ORDINALITY AS t(workflow_type, o)
        LEFT JOIN kagzi.flow_limits l ON l.namespace = p_ns AND l.workflow_type = t.workflow_type
        ORDER BY t.o);
    -- The earliest queued run of a concurrency key of each type (NULL: none), read from
    -- the worker's floor of the type's key queue (p_key_floors) through runs_key_due:
    -- one index probe per type (a LATERAL with LIMIT 1 cannot become the hash semi-join
    -- a generic plan made of an EXISTS, which read the whole namespace's key queue).
    key_first := ARRAY(SELECT q.available_at
        FROM unnest(p_types, p_key_floors) WITH ORDINALITY AS t(workflow_type, floor, o)
        LEFT JOIN LATERAL (SELECT r.available_at FROM kagzi.runs r
            WHERE r.namespace = p_ns AND r.workflow_type = t.workflow_type
              AND r.flow_key IS NOT NULL AND r.started_at IS NULL AND r.status = 'PENDING' AND r.priority >= 0
              AND r.available_at >= coalesce(t.floor, '-infinity')
            ORDER BY r.available_at
            LIMIT 1) q ON true
        WHERE t.o <= nt
        ORDER BY t.o);
    FOR i IN 1 .. nt LOOP
        IF lims[i].concurrency IS NOT NULL THEN
            PERFORM pg_advisory_xact_lock(hashtextextended('kagzi.flow.type|' || p_ns || '|' || p_types[i], 0));
        END IF;
    END LOOP;
    -- Each limited type's room, counted by statements that start after the locks, and
    -- the members of each type's ring to visit.
    FOR i IN 1 .. nt LOOP
        allow := allow || budget;
        taken := taken || 0;
        served := served || 0;
        passed := passed || 0;
        nk_read := nk_read || false;
        nk_short := nk_short || false;
        nk_last := nk_last || NULL::timestamptz;
        rate_held := rate_held || false;
        IF lims[i].concurrency IS NOT NULL THEN
            -- A holder whose lease passed (its worker died) no longer counts, two
            -- seconds after its lease's end (a renewal that checked the lease just
            -- before it ended may still commit): its slot is free, and the claim that
            -- takes the run over holds it again.
            SELECT count(*) INTO held FROM kagzi.runs r
            WHERE r.namespace = p_ns AND r.workflow_type = p_types[i] AND r.holds_type_slot AND r.status = 'RUNNING'
              AND r.available_at > now() - interval '2 seconds'
              AND (r.run_id NOT IN (SELECT unnest(fin)) OR r.locked_by IS DISTINCT FROM p_worker);
            allow[i] := greatest(least(allow[i], lims[i].concurrency - held), 0);
        END IF;
        IF lims[i].rate IS NOT NULL THEN
            rate_room := kagzi.flow_rate_room(p_ns, p_types[i], '', lims[i].rate, lims[i].rate_period_ms);
            rate_held[i] := rate_held[i] OR rate_room < allow[i];
            allow[i] := least(allow[i], rate_room);
        END IF;
        -- The keys with queued runs after the cursor, then, if the ring's end came
        -- first, the runs of no key and the keys from the first one up to the cursor;
        -- the keys with a concurrency limit are locked.
        cur := coalesce(p_cursors[i], '');
        kf := coalesce(p_key_floors[i], '-infinity');
        -- A few more keys than the room, for keys without any; at most 500 (a claim
        -- locks each key it visits that has a concurrency limit: see the header).
        m := least(allow[i] + 16, 500);
        ks := '{}';
        sub := '{}';
        scan_next := scan_next || (key_first[i] IS NOT NULL AND coalesce(p_key_scans[i], false));
        IF allow[i] > 0 AND key_first[i] IS NOT NULL THEN
            -- The ring's keys from the queue's floor (runs_key_due, in time order), unless
            -- the worker's last claim found many runs queued there (p_key_scans): under
            -- a pinned horizon the skip scan below walks every entry left in
            -- runs_key_queue since the pin (in the index: their times are below the
            -- floor), while this read walks those since the floor. More than 1,000 runs
            -- queued from the floor on: the skip scan, and the next claim too.
            ring := NULL;
            IF NOT coalesce(p_key_scans[i], false) THEN
                SELECT CASE WHEN count(*) < 1000 THEN coalesce(array_agg(DISTINCT q.flow_key), '{}') END INTO ring
                FROM (SELECT r.flow_key FROM kagzi.runs r
                    WHERE r.namespace = p_ns AND r.workflow_type = p_types[i]
                      AND r.flow_key IS NOT NULL AND r.started_at IS NULL AND r.status = 'PENDING' AND r.priority >= 0
                      AND r.available_at >= kf
                    ORDER BY r.available_at
                    LIMIT 1000) q;
            END IF;
            IF ring IS NOT NULL THEN
                ks := ARRAY(SELECT k FROM unnest(ring) k WHERE k > cur ORDER BY k LIMIT m);
                IF cur > E'\x01' AND cardinality(ks) < m THEN
                    sub := ARRAY(SELECT k FROM unnest(ring) k WHERE k <= cur ORDER BY k LIMIT m - cardinality(ks));
                END IF;
            ELSE
                ks := kagzi.flow_keys_after(p_ns, p_types[i], cur, NULL, m, kf);
                IF cur > E'\x01' AND cardinality(ks) < m THEN
                    sub := kagzi.flow_keys_after(p_ns, p_types[i], '', cur, m - cardinality(ks), kf);
                END IF;
                -- Back to the read from the floor when the read was not just tried and
                -- the ring holds few keys, all queued within the last two seconds: few
                -- runs from the floor on, most likely (a backlog is queued from further back).
                scan_next[i] := NOT coalesce(p_key_scans[i], false) OR cardinality(ks) + cardinality(sub) >= m
                    OR key_first[i] < now() - interval '2 seconds';
            END IF;
        END IF;
        nokey_turn := nokey_turn || (cur = '' OR cardinality(ks) < m);
        walk_capped := walk_capped || (cardinality(ks) + cardinality(sub) >= m);
        walk_wrapped := walk_wrapped || (cardinality(sub) > 0);
        walk_end := walk_end || (ks || sub)[cardinality(ks) + cardinality(sub)];
        beyond_cursor := beyond_cursor || NULL::text;
        IF lims[i].key_concurrency IS NOT NULL THEN
            passed[i] := cardinality(ks) + cardinality(sub);
            ks := kagzi.flow_lock_keys(p_ns, p_types[i], ks);
            sub := kagzi.flow_lock_keys(p_ns, p_types[i], sub);
            passed[i] := passed[i] - cardinality(ks) - cardinality(sub);
        END IF;
        split := split || CASE WHEN cur = '' THEN 0 ELSE cardinality(ks) END;
        ks := ks || sub;
        key_lists := key_lists || array_to_string(ks, E'\x1f');
        IF lims[i].concurrency IS NULL AND lims[i].rate IS NULL AND cardinality(ks) = 0 THEN
            plain_types := plain_types || p_types[i];
            plain_versions := plain_versions || p_versions[i];
            plain_floors := plain_floors || p_floors[i];
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
                          AND c.available_at >= coalesce(p_floors[i], '-infinity')
                          AND (c.flow_key IS NULL OR c.started_at IS NOT NULL)
                          AND (c.version IS NULL OR c.version = p_versions[i])
                        ORDER BY c.available_at
                        LIMIT n
                        FOR UPDATE SKIP LOCKED), array_fill(p_versions[i], ARRAY[n]),
                        p_worker, p_lease_ms, lims[i].concurrency IS NOT NULL) c);
                    nk_read[i] := true;
                    IF coalesce(cardinality(batch), 0) < n THEN
                        nk_short[i] := true;
                    END IF;
                    nk_last[i] := greatest(nk_last[i], (SELECT max(b.prev_available_at) FROM unnest(batch) b));
                    IF cardinality(batch) > 0 THEN
                        served[i] := greatest(served[i], 2 * split[i] + 1);
                    END IF;
                ELSE
                    sub := CASE WHEN seg = 1 THEN ks[1:split[i]] ELSE ks[split[i] + 1:cardinality(ks)] END;
                    IF pass = 2 THEN
                        sub := ARRAY(SELECT k FROM unnest(sub) k WHERE i || E'\x1f' || k NOT IN (SELECT unnest(spent)));
                    END IF;
                    CONTINUE WHEN coalesce(cardinality(sub), 0) = 0;
                    batch := ARRAY(SELECT c FROM kagzi.claim_keyed(p_ns, p_types[i], p_versions[i], sub, share,
                        least(allow[i], budget), lims[i].key_concurrency, lims[i].key_rate,
                        lims[i].key_rate_period_ms, p_worker, p_lease_ms, lims[i].concurrency IS NOT NULL, fin,
                        coalesce(p_key_floors[i], '-infinity')) c);
                    IF lims[i].key_rate IS NOT NULL THEN
                        PERFORM kagzi.flow_rate_add(p_ns, p_types[i], b.flow_key, lims[i].key_rate_period_ms, count(*)::integer)
                        FROM unnest(batch) b GROUP BY b.flow_key;
                        unserved := unserved || ARRAY(SELECT i || E'\x1f' || k FROM unnest(sub) k
                            WHERE k NOT IN (SELECT b.flow_key FROM unnest(batch) b WHERE b.flow_key IS NOT NULL));
                    END IF;
                    served[i] := greatest(served[i], coalesce((SELECT 2 * max(array_position(ks, b.flow_key))
                        FROM unnest(batch) b), 0));
                    -- The keys that gave less than their share (their room, their queue or
                    -- their rate window ran out) or reached their limit have nothing more for
                    -- the second pass, which would only count their holders again (noted
                    -- when this call left room for a second pass).
                    IF pass = 1 AND coalesce(cardinality(batch), 0) < least(allow[i], budget) THEN
                        spent := spent || ARRAY(SELECT i || E'\x1f' || u.k FROM unnest(sub) u(k)
                            LEFT JOIN (SELECT b.flow_key, count(*) AS took FROM unnest(batch) b GROUP BY b.flow_key) t
                                ON t.flow_key = u.k
                            WHERE coalesce(t.took, 0) < share OR t.took >= coalesce(lims[i].key_concurrency, share + 1));
                    END IF;
                END IF;
                n := coalesce(cardinality(batch), 0);
                allow[i] := allow[i] - n;
                taken[i] := taken[i] + n;
                budget := budget - n;
                RETURN QUERY SELECT * FROM unnest(batch);
            END LOOP;
        END LOOP;
        IF pass = 1 AND budget > 0 AND cardinality(plain_types) > 0 THEN
            plain_asked := budget;
            SELECT array_agg(c.run_id ORDER BY c.available_at), array_agg(c.version ORDER BY c.available_at),
                array_agg(c.workflow_type), array_agg(c.available_at)
            INTO ids, versions, claimed_types, claimed_at
            FROM (
                SELECT c.run_id, c.available_at, t.version, t.workflow_type
                FROM unnest(plain_types, plain_versions, plain_floors) AS t(workflow_type, version, floor),
                LATERAL (
                    SELECT r.run_id, r.available_at FROM kagzi.runs r
                    WHERE r.namespace = p_ns AND r.workflow_type = t.workflow_type
                      AND r.status IN ('PENDING', 'RUNNING', 'SLEEPING') AND r.available_at <= now()
                      AND r.available_at >= coalesce(t.floor, '-infinity')
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
            -- The plain types' next floors: fewer runs than asked means each type's
            -- range up to now was read through; otherwise a type's range was read
            -- up to its last claimed run. A second back covers starts that commit a
            -- little after their statement's now().
            floors := ARRAY(SELECT CASE WHEN coalesce(cardinality(ids), 0) < plain_asked THEN now() ELSE c.last END
                    - interval '1 second'
                FROM unnest(plain_types) WITH ORDINALITY AS p(t, o)
                LEFT JOIN (SELECT x.t, max(x.a) AS last FROM unnest(claimed_types, claimed_at) AS x(t, a) GROUP BY x.t) c
                    ON c.t = p.t
                ORDER BY p.o);
        END IF;
    END LOOP;
    -- A claim left with room whose walk of the ring stopped at its cap, after its worker
    -- heard of a freed key's place (p_walk): the freed key may lie beyond the cap, among
    -- many whose holders run long, so it walks up to 1,000 more, up to its cursor, and
    -- takes from them as from the others.
    FOR i IN 1 .. nt LOOP
        EXIT WHEN budget <= 0;
        CONTINUE WHEN allow[i] <= 0 OR NOT walk_capped[i] OR NOT coalesce(p_walk[i], false);
        cur := coalesce(p_cursors[i], '');
        kf := coalesce(p_key_floors[i], '-infinity');
        IF walk_wrapped[i] THEN
            beyond := kagzi.flow_keys_after(p_ns, p_types[i], walk_end[i], cur, 1000, kf);
        ELSE
            beyond := kagzi.flow_keys_after(p_ns, p_types[i], walk_end[i], NULL, 1000, kf);
            IF cur > E'\x01' AND cardinality(beyond) < 1000 THEN
                beyond := beyond || kagzi.flow_keys_after(p_ns, p_types[i], '', cur, 1000 - cardinality(beyond), kf);
            END IF;
        END IF;
        IF lims[i].key_concurrency IS NOT NULL THEN
            -- Only the keys with room by a look without their locks are locked (and
            -- their holders counted again under the lock): a walk of 1,000 full keys
            -- took 1,000 advisory locks, and a few workers walking at once filled
            -- PostgreSQL's lock table. A key that looks full here was full when this
            -- statement began; one freed since announces it, and a claim walks again.
            full_keys := ARRAY(SELECT u.k FROM unnest(beyond) AS u(k)
                WHERE (SELECT count(*) FROM kagzi.runs h
                    WHERE h.namespace = p_ns AND h.workflow_type = p_types[i] AND h.flow_key = u.k
                      AND h.started_at IS NOT NULL AND h.status IN ('PENDING', 'RUNNING', 'SLEEPING')
                      AND (h.run_id NOT IN (SELECT unnest(fin)) OR h.locked_by IS DISTINCT FROM p_worker
                           OR h.available_at <= now())) >= lims[i].key_concurrency);
            locked_keys := kagzi.flow_lock_keys(p_ns, p_types[i], ARRAY(SELECT u.k
                FROM unnest(beyond) WITH ORDINALITY AS u(k, o) WHERE u.k NOT IN (SELECT unnest(full_keys)) ORDER BY u.o));
            passed[i] := passed[i] + cardinality(beyond) - cardinality(full_keys) - cardinality(locked_keys);
            -- The cursor may pass the full keys and the locked ones; the keys another
            -- claim held are not passed by it: the look again that their count asks for
            -- visits them.
            beyond_cursor[i] := (SELECT u.k FROM unnest(beyond) WITH ORDINALITY AS u(k, o)
                WHERE u.k IN (SELECT unnest(full_keys)) OR u.k IN (SELECT unnest(locked_keys))
                ORDER BY u.o DESC LIMIT 1);
            beyond := locked_keys;
        ELSE
            beyond_cursor[i] := beyond[cardinality(beyond)];
        END IF;
        CONTINUE WHEN cardinality(beyond) = 0;
        share := ceil(least(allow[i], budget)::numeric / cardinality(beyond))::integer;
        batch := ARRAY(SELECT c FROM kagzi.claim_keyed(p_ns, p_types[i], p_versions[i], beyond, share,
            least(allow[i], budget), lims[i].key_concurrency, lims[i].key_rate,
            lims[i].key_rate_period_ms, p_worker, p_lease_ms, lims[i].concurrency IS NOT NULL, fin, kf) c);
        IF lims[i].key_rate IS NOT NULL THEN
            PERFORM kagzi.flow_rate_add(p_ns, p_types[i], b.flow_key, lims[i].key_rate_period_ms, count(*)::integer)
            FROM unnest(batch) b GROUP BY b.flow_key;
            unserved := unserved || ARRAY(SELECT i || E'\x1f' || k FROM unnest(beyond) k
                WHERE k NOT IN (SELECT b.flow_key FROM unnest(batch) b WHERE b.flow_key IS NOT NULL));
        END IF;
        -- The next cursor: the last key served beyond the cap, else the last walked.
        beyond_cursor[i] := coalesce((SELECT beyond[max(array_position(beyond, b.flow_key))] FROM unnest(batch) b),
            beyond_cursor[i]);
        n := coalesce(cardinality(batch), 0);
        allow[i] := allow[i] - n;
        taken[i] := taken[i] + n;
        budget := budget - n;
        RETURN QUERY SELECT * FROM unnest(batch);
    END LOOP;
    FOR i IN 1 .. nt LOOP
        -- The type's next key-queue floor (in created_at): a second before its earliest
        -- queued keyed run, or before now() when it has none, and never below the floor
        -- the worker sent, under which the claim looked for none; and whether the next
        -- claim walks the ring with the skip scan instead (in holds_slot).
        RETURN NEXT ROW(NULL, p_ns, NULL, p_types[i], NULL, NULL, NULL, NULL, NULL, NULL,
            greatest(p_key_floors[i], least(key_first[i], now()) - interval '1 second'), NULL, NULL, NULL, NULL, NULL,
            NULL, scan_next[i])::kagzi.claimed_run;
        -- The keys passed over: the claim that held one may not take its next run.
        IF passed[i] > 0 THEN
            RETURN NEXT ROW(NULL, p_ns, NULL, p_types[i], NULL, NULL, passed[i], NULL, NULL, NULL, NULL, NULL,
                NULL, NULL, NULL, NULL, NULL, NULL)::kagzi.claimed_run;
        END IF;
        -- The type's own rate window counts every claim of its runs.
        IF lims[i].rate IS NOT NULL AND taken[i] > 0 THEN
            PERFORM kagzi.flow_rate_add(p_ns, p_types[i], '', lims[i].rate_period_ms, taken[i]);
        END IF;
        -- A claim that came back short while rate windows held runs back: when the
        -- soonest of them admits again, for the worker's timer (nothing announces it).
        IF budget > 0 AND (rate_held[i] OR lims[i].key_rate IS NOT NULL) THEN
            next_at := NULL;
            IF rate_held[i] THEN
                next_at := kagzi.flow_rate_next(p_ns, p_types[i], '', lims[i].rate, lims[i].rate_period_ms);
            END IF;
            IF lims[i].key_rate IS NOT NULL THEN
                next_at := least(next_at, (SELECT min(kagzi.flow_rate_next(p_ns, p_types[i], split_part(u, E'\x1f', 2),
                        lims[i].key_rate, lims[i].key_rate_period_ms))
                    FROM unnest(unserved) u WHERE split_part(u, E'\x1f', 1) = i::text));
            END IF;
            IF next_at IS NOT NULL THEN
                RETURN NEXT ROW(NULL, p_ns, NULL, p_types[i], NULL, NULL, NULL, NULL, NULL, next_at, NULL, NULL, NULL,
                    NULL, NULL, NULL, NULL, NULL)::kagzi.claimed_run;
            END IF;
        END IF;
        -- A limited or keyed type's next floor, when its runs of no key were read: as a
        -- plain type's below.
        IF nk_read[i] AND (nk_short[i] OR nk_last[i] IS NOT NULL) THEN
            RETURN NEXT ROW(NULL, p_ns, NULL, p_types[i], NULL, NULL, NULL, NULL, NULL, NULL, NULL, now(),
                CASE WHEN nk_short[i] THEN now() ELSE nk_last[i] END - interval '1 second',
                NULL, NULL, NULL, NULL, NULL)::kagzi.claimed_run;
        END IF;
        -- The type's next cursor: the last member served, else the last one visited.
        IF beyond_cursor[i] IS NOT NULL THEN
            RETURN NEXT ROW(NULL, p_ns, NULL, p_types[i], NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                NULL, NULL, beyond_cursor[i], NULL)::kagzi.claimed_run;
            CONTINUE;
        END IF;
        IF key_lists[i] = '' THEN
            -- A plain type's next floor (none when none was found).
            n := array_position(plain_types, p_types[i]);
            IF n IS NOT NULL AND floors[n] IS NOT NULL THEN
                RETURN NEXT ROW(NULL, p_ns, NULL, p_types[i], NULL, NULL, NULL, NULL, NULL, NULL, NULL, now(),
                    floors[n], NULL, NULL, NULL, NULL, NULL)::kagzi.claimed_run;
            END IF;
            CONTINUE;
        END IF;
        ks := string_to_array(key_lists[i], E'\x1f');
        rank := CASE WHEN served[i] > 0 THEN served[i]
            WHEN cardinality(ks) > split[i] THEN 2 * cardinality(ks)
            WHEN nokey_turn[i] THEN 2 * split[i] + 1
            ELSE 2 * cardinality(ks) END;
        RETURN NEXT ROW(NULL, p_ns, NULL, p_types[i], NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            NULL, NULL, CASE WHEN rank % 2 = 1 THEN E'\x01' ELSE ks[rank / 2] END, NULL)::kagzi.claimed_run;
    END LOOP;
END $$;

CREATE FUNCTION kagzi.claim_keyed(p_ns text, p_type text, p_version text, ks text[], p_share integer, p_max integer, p_key_concurrency integer, p_key_rate integer, p_key_rate_period_ms bigint, p_worker text, p_lease_ms bigint, p_holds_slot boolean, p_finishing uuid[], p_floor timestamp with time zone) RETURNS SETOF kagzi.claimed_run
    LANGUAGE plpgsql
    AS $$
BEGIN
    RETURN QUERY SELECT * FROM kagzi.claim_runs(ARRAY(
        SELECT q.run_id FROM unnest(ks) WITH ORDINALITY AS k(k, o)
        CROSS JOIN LATERAL (
            SELECT greatest(least(p_share,
                CASE WHEN p_key_concurrency IS NULL THEN p_share ELSE p_key_concurrency - (
                    SELECT count(*)::integer FROM kagzi.runs h
                    WHERE h.namespace = p_ns AND h.workflow_type = p_type AND h.flow_key = k.k
                      AND h.started_at IS NOT NULL AND h.status IN ('PENDING', 'RUNNING', 'SLEEPING')
                      AND (h.run_id NOT IN (SELECT unnest(p_finishing)) OR h.locked_by IS DISTINCT FROM p_worker
                           OR h.available_at <= now())) END,
                CASE WHEN p_key_rate IS NULL THEN p_share
                    ELSE kagzi.flow_rate_room(p_ns, p_type, k.k, p_key_rate, p_key_rate_period_ms) END), 0) AS room
        ) rm
        CROSS JOIN LATERAL (
            SELECT c.run_id FROM kagzi.runs c
            WHERE c.namespace = p_ns AND c.workflow_type = p_type AND c.flow_key = k.k
              AND c.flow_key IS NOT NULL AND c.started_at IS NULL AND c.status = 'PENDING'
              AND c.available_at <= now() AND c.available_at >= p_floor
              AND (c.version IS NULL OR c.version = p_version)
            ORDER BY c.available_at
            LIMIT rm.room
            FOR UPDATE SKIP LOCKED
        ) q
        ORDER BY k.o
        LIMIT p_max), array_fill(p_version, ARRAY[p_max]), p_worker, p_lease_ms, p_holds_slot);
END $$;

CREATE FUNCTION kagzi.claim_runs(p_ids uuid[], p_versions text[], p_worker text, p_lease_ms bigint, p_holds_slot boolean) RETURNS SETOF kagzi.claimed_run
    LANGUAGE plpgsql
    AS $$
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

CREATE FUNCTION kagzi.flow_keys_after(p_ns text, p_type text, p_after text, p_until text, p_n integer, p_floor timestamp with time zone) RETURNS text[]
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN (WITH RECURSIVE ks(k, n) AS (
        SELECT (SELECT r.flow_key FROM kagzi.runs r
                WHERE r.namespace = p_ns AND r.workflow_type = p_type AND r.flow_key > p_after
                  AND r.flow_key IS NOT NULL AND r.started_at IS NULL AND r.status = 'PENDING'
                  AND r.available_at >= p_floor
                ORDER BY r.flow_key LIMIT 1), 1
        UNION ALL
        SELECT (SELECT r.flow_key FROM kagzi.runs r
                WHERE r.namespace = p_ns AND r.workflow_type = p_type AND r.flow_key > ks.k
                  AND r.flow_key IS NOT NULL AND r.started_at IS NULL AND r.status = 'PENDING'
                  AND r.available_at >= p_floor
                ORDER BY r.flow_key LIMIT 1), ks.n + 1
        FROM ks WHERE ks.k IS NOT NULL AND ks.n < p_n
    )
    SELECT coalesce(array_agg(k ORDER BY n), '{}') FROM ks
    WHERE k IS NOT NULL AND (p_until IS NULL OR k <= p_until) AND p_n > 0);
END $$;

CREATE FUNCTION kagzi.flow_lock_keys(p_ns text, p_type text, ks text[]) RETURNS text[]
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF coalesce(cardinality(ks), 0) = 0 THEN
        RETURN '{}';
    END IF;
    RETURN ARRAY(SELECT k FROM unnest(ks) WITH ORDINALITY AS u(k, o)
        WHERE pg_try_advisory_xact_lock(hashtextextended('kagzi.flow.key|' || p_ns || '|' || p_type || '|' || k, 0))
        ORDER BY o);
END $$;

CREATE FUNCTION kagzi.flow_rate_add(p_ns text, p_type text, p_key text, p_period_ms bigint, p_n integer) RETURNS void
    LANGUAGE plpgsql
    AS $$
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
    IF w.period_ms IS NOT NULL AND w.period_ms <> p_period_ms THEN
        SELECT r.window_start, r.slots INTO w.window_start, w.slots
        FROM kagzi.flow_rate_recut(w.window_start, w.slots, w.period_ms, p_period_ms, clock_timestamp()) r;
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
    UPDATE kagzi.flow_rates SET window_start = w.window_start, slots = w.slots, period_ms = p_period_ms
    WHERE namespace = p_ns AND workflow_type = p_type AND flow_key = p_key;
END $$;

CREATE FUNCTION kagzi.flow_rate_next(p_ns text, p_type text, p_key text, p_rate integer, p_period_ms bigint) RETURNS timestamp with time zone
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN (SELECT c.window_start + (u.first_used - 1 + 11) * ((p_period_ms / 10.0) * interval '1 millisecond')
    FROM kagzi.flow_rates w,
        LATERAL (SELECT w.window_start, w.slots
                 WHERE w.period_ms IS NULL OR w.period_ms = p_period_ms
                 UNION ALL
                 SELECT r.window_start, r.slots
                 FROM kagzi.flow_rate_recut(w.window_start, w.slots, w.period_ms, p_period_ms, clock_timestamp()) r
                 WHERE w.period_ms <> p_period_ms) c,
        LATERAL (SELECT min(o) AS first_used, sum(s) AS used FROM unnest(c.slots) WITH ORDINALITY AS u(s, o)
                 WHERE s > 0) u
    WHERE w.namespace = p_ns AND w.workflow_type = p_type AND w.flow_key = p_key AND u.used >= p_rate);
END $$;

CREATE FUNCTION kagzi.flow_rate_recut(p_start timestamp with time zone, p_slots integer[], p_old_ms bigint, p_new_ms bigint, p_at timestamp with time zone, OUT window_start timestamp with time zone, OUT slots integer[]) RETURNS record
    LANGUAGE plpgsql IMMUTABLE
    AS $$
DECLARE
    old_slot interval := (p_old_ms / 10.0) * interval '1 millisecond';
    new_slot interval := (p_new_ms / 10.0) * interval '1 millisecond';
    t timestamptz;
    j integer;
BEGIN
    window_start := p_at - 10 * new_slot;
    slots := array_fill(0, ARRAY[11]);
    FOR i IN 1 .. coalesce(cardinality(p_slots), 0) LOOP
        CONTINUE WHEN p_slots[i] IS NULL OR p_slots[i] <= 0;
        t := least(p_start + i * old_slot, p_at);
        j := floor(extract(epoch FROM t - window_start) / extract(epoch FROM new_slot))::integer + 1;
        j := greatest(least(j, 11), 1);
        slots[j] := slots[j] + p_slots[i];
    END LOOP;
END $$;

CREATE FUNCTION kagzi.flow_rate_room(p_ns text, p_type text, p_key text, p_rate integer, p_period_ms bigint) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    w kagzi.flow_rates%ROWTYPE;
    slot interval := (p_period_ms / 10.0) * interval '1 millisecond';
    shift integer;
    at timestamptz;
BEGIN
    INSERT INTO kagzi.flow_rates (namespace, workflow_type, flow_key, window_start, slots, period_ms)
    VALUES (p_ns, p_type, p_key, clock_timestamp(), array_fill(0, ARRAY[11]), p_period_ms)
    ON CONFLICT DO NOTHING;
    SELECT * INTO w FROM kagzi.flow_rates
    WHERE namespace = p_ns AND workflow_type = p_type AND flow_key = p_key FOR UPDATE;
    at := clock_timestamp(); -- after the lock: the claims of a window are timed in lock order
    IF w.period_ms IS DISTINCT FROM p_period_ms THEN
        IF w.period_ms IS NOT NULL THEN
            SELECT r.window_start, r.slots INTO w.window_start, w.slots
            FROM kagzi.flow_rate_recut(w.window_start, w.slots, w.period_ms, p_period_ms, at) r;
        END IF;
        UPDATE kagzi.flow_rates SET window_start = w.window_start, slots = w.slots, period_ms = p_period_ms
        WHERE namespace = p_ns AND workflow_type = p_type AND flow_key = p_key;
    END IF;
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

CREATE FUNCTION kagzi.run_changed() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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
    -- A run that held a slot of its type's concurrency limit and stops running, or a
    -- run that held a place of its concurrency key and ends (from RUNNING, or from
    -- SLEEPING or PENDING: a cancel, a deadline): the workers of its type may claim
    -- another. A worker's end of a run that held a slot clears holds_type_slot and
    -- notifies once for the ends of its statement (store.FinishRun), so not here.
    IF OLD.status IS DISTINCT FROM NEW.status
       AND ((OLD.status = 'RUNNING' AND OLD.holds_type_slot AND NEW.holds_type_slot)
            OR (NEW.flow_key IS NOT NULL AND NEW.started_at IS NOT NULL
                AND NEW.status IN ('COMPLETED', 'FAILED', 'CANCELLED'))) THEN
        PERFORM pg_notify('kagzi', 'w|' || octet_length(NEW.namespace) || ':' || NEW.namespace || '|'
            || NEW.workflow_type || '|' || (extract(epoch FROM now()) * 1000)::bigint
            || CASE WHEN NEW.flow_key IS NOT NULL AND NEW.started_at IS NOT NULL THEN 'k' ELSE '' END);
    END IF;
    RETURN NEW;
END $$;

CREATE TABLE kagzi.console_audit (
    id bigint NOT NULL,
    namespace text NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    who text NOT NULL,
    action text NOT NULL,
    target text DEFAULT ''::text NOT NULL,
    run_ids uuid[] DEFAULT '{}'::uuid[] NOT NULL,
    run_count bigint DEFAULT 0 NOT NULL,
    detail jsonb DEFAULT '{}'::jsonb NOT NULL,
    outcome text,
    finished_at timestamp with time zone
);

CREATE SEQUENCE kagzi.console_audit_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE kagzi.console_audit_id_seq OWNED BY kagzi.console_audit.id;

CREATE TABLE kagzi.events (
    run_id uuid NOT NULL,
    key text NOT NULL,
    value jsonb NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE kagzi.events_history (
    run_id uuid NOT NULL,
    key text NOT NULL,
    value jsonb NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    run_finished_at timestamp with time zone NOT NULL
)
PARTITION BY RANGE (run_finished_at);

CREATE VIEW kagzi.events_all AS
 SELECT events.run_id,
    events.key,
    events.value,
    events.updated_at
   FROM kagzi.events
UNION ALL
 SELECT events_history.run_id,
    events_history.key,
    events_history.value,
    events_history.updated_at
   FROM kagzi.events_history;

CREATE TABLE kagzi.flow_limits (
    namespace text NOT NULL,
    workflow_type text NOT NULL,
    concurrency integer,
    key_concurrency integer,
    rate integer,
    rate_period_ms bigint,
    key_rate integer,
    key_rate_period_ms bigint,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT flow_limits_concurrency_check CHECK ((concurrency > 0)),
    CONSTRAINT flow_limits_key_concurrency_check CHECK ((key_concurrency > 0)),
    CONSTRAINT flow_limits_key_rate_check CHECK ((key_rate > 0)),
    CONSTRAINT flow_limits_key_rate_period_ms_check CHECK ((key_rate_period_ms > 0)),
    CONSTRAINT flow_limits_rate_check CHECK ((rate > 0)),
    CONSTRAINT flow_limits_rate_period_ms_check CHECK ((rate_period_ms > 0))
);

CREATE TABLE kagzi.flow_rates (
    namespace text NOT NULL,
    workflow_type text NOT NULL,
    flow_key text NOT NULL,
    window_start timestamp with time zone NOT NULL,
    slots integer[] NOT NULL,
    period_ms bigint
);

CREATE TABLE kagzi.goose_db_version (
    id integer NOT NULL,
    version_id bigint NOT NULL,
    is_applied boolean NOT NULL,
    tstamp timestamp without time zone DEFAULT now() NOT NULL
);

ALTER TABLE kagzi.goose_db_version ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME kagzi.goose_db_version_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE kagzi.history_drops (
    id boolean DEFAULT true NOT NULL,
    holder text NOT NULL,
    until timestamp with time zone NOT NULL,
    dropping_before timestamp with time zone,
    CONSTRAINT history_drops_id_check CHECK (id)
);

CREATE TABLE kagzi.history_ids (
    namespace text NOT NULL,
    workflow_id text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    run_id uuid NOT NULL,
    run_finished_at timestamp with time zone NOT NULL
);

CREATE TABLE kagzi.history_retention (
    namespace text NOT NULL,
    keep_ms bigint NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE kagzi.runs (
    run_id uuid NOT NULL,
    namespace text NOT NULL,
    workflow_id text NOT NULL,
    workflow_type text NOT NULL,
    status text NOT NULL,
    input jsonb NOT NULL,
    output jsonb,
    error jsonb,
    attempt integer DEFAULT 1 NOT NULL,
    available_at timestamp with time zone NOT NULL,
    locked_by text,
    lease_epoch bigint DEFAULT 0 NOT NULL,
    cancel_requested boolean DEFAULT false NOT NULL,
    deadline_at timestamp with time zone,
    id_reuse_never boolean DEFAULT false NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    schedule_id text,
    schedule_tick timestamp with time zone,
    parent_run_id uuid,
    parent_step_key text,
    waiting_signal text,
    trace_carrier jsonb,
    version text,
    forked_from_run_id uuid,
    forked_from_step text,
    wake_pending boolean DEFAULT false NOT NULL,
    takeovers integer DEFAULT 0 NOT NULL,
    attributes jsonb,
    priority smallint DEFAULT 0 NOT NULL,
    flow_key text,
    holds_type_slot boolean DEFAULT false NOT NULL,
    debounce_key text,
    debounce_until timestamp with time zone,
    continued_from_run_id uuid,
    continued_as_run_id uuid,
    lease_token uuid,
    CONSTRAINT runs_namespace_valid CHECK (((namespace <> ''::text) AND (length(namespace) <= 255))),
    CONSTRAINT runs_priority_check CHECK (((priority >= 0) AND (priority <= 3600))),
    CONSTRAINT runs_status_valid CHECK ((status = ANY (ARRAY['PENDING'::text, 'RUNNING'::text, 'SLEEPING'::text, 'COMPLETED'::text, 'FAILED'::text, 'CANCELLED'::text]))),
    CONSTRAINT runs_workflow_id_valid CHECK (((workflow_id <> ''::text) AND (length(workflow_id) <= 255)))
);

CREATE TABLE kagzi.runs_history (
    run_id uuid NOT NULL,
    namespace text NOT NULL,
    workflow_id text NOT NULL,
    workflow_type text NOT NULL,
    status text NOT NULL,
    input jsonb NOT NULL,
    output jsonb,
    error jsonb,
    attempt integer DEFAULT 1 NOT NULL,
    available_at timestamp with time zone NOT NULL,
    locked_by text,
    lease_epoch bigint DEFAULT 0 NOT NULL,
    cancel_requested boolean DEFAULT false NOT NULL,
    deadline_at timestamp with time zone,
    id_reuse_never boolean DEFAULT false NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    schedule_id text,
    schedule_tick timestamp with time zone,
    parent_run_id uuid,
    parent_step_key text,
    waiting_signal text,
    trace_carrier jsonb,
    version text,
    forked_from_run_id uuid,
    forked_from_step text,
    wake_pending boolean DEFAULT false NOT NULL,
    takeovers integer DEFAULT 0 NOT NULL,
    attributes jsonb,
    priority smallint DEFAULT 0 NOT NULL,
    flow_key text,
    holds_type_slot boolean DEFAULT false NOT NULL,
    debounce_key text,
    debounce_until timestamp with time zone,
    continued_from_run_id uuid,
    continued_as_run_id uuid,
    lease_token uuid,
    CONSTRAINT runs_namespace_valid CHECK (((namespace <> ''::text) AND (length(namespace) <= 255))),
    CONSTRAINT runs_priority_check CHECK (((priority >= 0) AND (priority <= 3600))),
    CONSTRAINT runs_status_valid CHECK ((status = ANY (ARRAY['PENDING'::text, 'RUNNING'::text, 'SLEEPING'::text, 'COMPLETED'::text, 'FAILED'::text, 'CANCELLED'::text]))),
    CONSTRAINT runs_workflow_id_valid CHECK (((workflow_id <> ''::text) AND (length(workflow_id) <= 255)))
)
PARTITION BY RANGE (finished_at);

CREATE VIEW kagzi.runs_all AS
 SELECT runs.run_id,
    runs.namespace,
    runs.workflow_id,
    runs.workflow_type,
    runs.status,
    runs.input,
    runs.output,
    runs.error,
    runs.attempt,
    runs.available_at,
    runs.locked_by,
    runs.lease_epoch,
    runs.cancel_requested,
    runs.deadline_at,
    runs.id_reuse_never,
    runs.created_at,
    runs.started_at,
    runs.finished_at,
    runs.updated_at,
    runs.schedule_id,
    runs.schedule_tick,
    runs.parent_run_id,
    runs.parent_step_key,
    runs.waiting_signal,
    runs.trace_carrier,
    runs.version,
    runs.forked_from_run_id,
    runs.forked_from_step,
    runs.wake_pending,
    runs.takeovers,
    runs.attributes,
    runs.priority,
    runs.flow_key,
    runs.holds_type_slot,
    runs.debounce_key,
    runs.debounce_until,
    runs.continued_from_run_id,
    runs.continued_as_run_id
   FROM kagzi.runs
UNION ALL
 SELECT runs_history.run_id,
    runs_history.namespace,
    runs_history.workflow_id,
    runs_history.workflow_type,
    runs_history.status,
    runs_history.input,
    runs_history.output,
    runs_history.error,
    runs_history.attempt,
    runs_history.available_at,
    runs_history.locked_by,
    runs_history.lease_epoch,
    runs_history.cancel_requested,
    runs_history.deadline_at,
    runs_history.id_reuse_never,
    runs_history.created_at,
    runs_history.started_at,
    runs_history.finished_at,
    runs_history.updated_at,
    runs_history.schedule_id,
    runs_history.schedule_tick,
    runs_history.parent_run_id,
    runs_history.parent_step_key,
    runs_history.waiting_signal,
    runs_history.trace_carrier,
    runs_history.version,
    runs_history.forked_from_run_id,
    runs_history.forked_from_step,
    runs_history.wake_pending,
    runs_history.takeovers,
    runs_history.attributes,
    runs_history.priority,
    runs_history.flow_key,
    runs_history.holds_type_slot,
    runs_history.debounce_key,
    runs_history.debounce_until,
    runs_history.continued_from_run_id,
    runs_history.continued_as_run_id
   FROM kagzi.runs_history;

CREATE TABLE kagzi.runs_created (
    namespace text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    run_id uuid NOT NULL,
    workflow_type text
);

CREATE TABLE kagzi.runs_created_history (
    namespace text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    run_id uuid NOT NULL,
    workflow_type text,
    run_finished_at timestamp with time zone NOT NULL
)
PARTITION BY RANGE (run_finished_at);

CREATE VIEW kagzi.runs_created_all AS
 SELECT runs_created.namespace,
    runs_created.created_at,
    runs_created.run_id,
    runs_created.workflow_type,
    NULL::timestamp with time zone AS run_finished_at
   FROM kagzi.runs_created
UNION ALL
 SELECT runs_created_history.namespace,
    runs_created_history.created_at,
    runs_created_history.run_id,
    runs_created_history.workflow_type,
    runs_created_history.run_finished_at
   FROM kagzi.runs_created_history;

CREATE TABLE kagzi.schedules (
    namespace text NOT NULL,
    schedule_id text NOT NULL,
    workflow_type text NOT NULL,
    cron text NOT NULL,
    cron_seconds boolean DEFAULT false NOT NULL,
    time_zone text NOT NULL,
    input jsonb NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    max_catchup integer NOT NULL,
    overlap text NOT NULL,
    next_fire_at timestamp with time zone,
    last_fired_at timestamp with time zone,
    last_run_id uuid,
    buffered_tick timestamp with time zone,
    catchup_skipped bigint DEFAULT 0 NOT NULL,
    overlap_skipped bigint DEFAULT 0 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT schedules_id_valid CHECK (((schedule_id <> ''::text) AND (length(schedule_id) <= 200))),
    CONSTRAINT schedules_max_catchup_valid CHECK (((max_catchup >= 0) AND (max_catchup <= 1000))),
    CONSTRAINT schedules_overlap_valid CHECK ((overlap = ANY (ARRAY['ALLOW'::text, 'SKIP'::text, 'BUFFER_ONE'::text]))),
    CONSTRAINT schedules_paused_has_no_next CHECK ((paused = (next_fire_at IS NULL)))
);

CREATE TABLE kagzi.signals (
    id bigint NOT NULL,
    run_id uuid NOT NULL,
    name text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    consumed_by text,
    key text
);

CREATE TABLE kagzi.signals_history (
    id bigint NOT NULL,
    run_id uuid NOT NULL,
    name text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamp with time zone NOT NULL,
    consumed_by text,
    key text,
    run_finished_at timestamp with time zone NOT NULL
)
PARTITION BY RANGE (run_finished_at);

CREATE VIEW kagzi.signals_all AS
 SELECT signals.id,
    signals.run_id,
    signals.name,
    signals.payload,
    signals.created_at,
    signals.consumed_by,
    signals.key
   FROM kagzi.signals
UNION ALL
 SELECT signals_history.id,
    signals_history.run_id,
    signals_history.name,
    signals_history.payload,
    signals_history.created_at,
    signals_history.consumed_by,
    signals_history.key
   FROM kagzi.signals_history;

CREATE SEQUENCE kagzi.signals_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE kagzi.signals_id_seq OWNED BY kagzi.signals.id;

CREATE TABLE kagzi.step_attempts (
    run_id uuid NOT NULL,
    step_key text NOT NULL,
    attempt integer NOT NULL,
    status text NOT NULL,
    error jsonb,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone NOT NULL,
    CONSTRAINT step_attempts_status_valid CHECK ((status = ANY (ARRAY['COMPLETED'::text, 'FAILED'::text, 'TIMED_OUT'::text])))
);

CREATE TABLE kagzi.step_attempts_history (
    run_id uuid NOT NULL,
    step_key text NOT NULL,
    attempt integer NOT NULL,
    status text NOT NULL,
    error jsonb,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone NOT NULL,
    run_finished_at timestamp with time zone NOT NULL,
    CONSTRAINT step_attempts_status_valid CHECK ((status = ANY (ARRAY['COMPLETED'::text, 'FAILED'::text, 'TIMED_OUT'::text])))
)
PARTITION BY RANGE (run_finished_at);

CREATE VIEW kagzi.step_attempts_all AS
 SELECT step_attempts.run_id,
    step_attempts.step_key,
    step_attempts.attempt,
    step_attempts.status,
    step_attempts.error,
    step_attempts.started_at,
    step_attempts.finished_at
   FROM kagzi.step_attempts
UNION ALL
 SELECT step_attempts_history.run_id,
    step_attempts_history.step_key,
    step_attempts_history.attempt,
    step_attempts_history.status,
    step_attempts_history.error,
    step_attempts_history.started_at,
    step_attempts_history.finished_at
   FROM kagzi.step_attempts_history;

CREATE TABLE kagzi.steps (
    run_id uuid NOT NULL,
    step_key text NOT NULL,
    name text NOT NULL,
    kind text NOT NULL,
    status text NOT NULL,
    output jsonb,
    error jsonb,
    attempts integer DEFAULT 0 NOT NULL,
    wake_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    "position" integer,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    CONSTRAINT steps_status_valid CHECK ((status = ANY (ARRAY['COMPLETED'::text, 'RETRYING'::text, 'FAILED'::text, 'WAITING'::text])))
);

CREATE TABLE kagzi.steps_history (
    run_id uuid NOT NULL,
    step_key text NOT NULL,
    name text NOT NULL,
    kind text NOT NULL,
    status text NOT NULL,
    output jsonb,
    error jsonb,
    attempts integer DEFAULT 0 NOT NULL,
    wake_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    "position" integer,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    run_finished_at timestamp with time zone NOT NULL,
    CONSTRAINT steps_kind_valid CHECK ((kind = ANY (ARRAY['STEP'::text, 'SLEEP'::text, 'CHILD'::text, 'SIGNAL'::text, 'EVENT'::text, 'PATCH'::text, 'ATTRIBUTES'::text]))),
    CONSTRAINT steps_status_valid CHECK ((status = ANY (ARRAY['COMPLETED'::text, 'RETRYING'::text, 'FAILED'::text, 'WAITING'::text])))
)
PARTITION BY RANGE (run_finished_at);

CREATE VIEW kagzi.steps_all AS
 SELECT steps.run_id,
    steps.step_key,
    steps.name,
    steps.kind,
    steps.status,
    steps.output,
    steps.error,
    steps.attempts,
    steps.wake_at,
    steps.created_at,
    steps.updated_at,
    steps."position",
    steps.started_at,
    steps.finished_at
   FROM kagzi.steps
UNION ALL
 SELECT steps_history.run_id,
    steps_history.step_key,
    steps_history.name,
    steps_history.kind,
    steps_history.status,
    steps_history.output,
    steps_history.error,
    steps_history.attempts,
    steps_history.wake_at,
    steps_history.created_at,
    steps_history.updated_at,
    steps_history."position",
    steps_history.started_at,
    steps_history.finished_at
   FROM kagzi.steps_history;

CREATE TABLE kagzi.waiters (
    namespace text NOT NULL,
    client_id uuid NOT NULL,
    expires_at timestamp with time zone NOT NULL
);

CREATE TABLE kagzi.workers (
    namespace text NOT NULL,
    worker_id text NOT NULL,
    hostname text NOT NULL,
    pid integer NOT NULL,
    version text NOT NULL,
    labels jsonb DEFAULT '{}'::jsonb NOT NULL,
    workflow_types text[] NOT NULL,
    max_concurrent integer NOT NULL,
    heartbeat_interval_ms bigint NOT NULL,
    status text NOT NULL,
    active_runs integer DEFAULT 0 NOT NULL,
    completed_total bigint DEFAULT 0 NOT NULL,
    failed_total bigint DEFAULT 0 NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    last_heartbeat_at timestamp with time zone DEFAULT now() NOT NULL,
    stopped_at timestamp with time zone,
    workflow_versions text[] DEFAULT '{}'::text[] NOT NULL,
    liveness_key bigint,
    CONSTRAINT workers_status_valid CHECK ((status = ANY (ARRAY['ONLINE'::text, 'DRAINING'::text, 'OFFLINE'::text])))
);

ALTER TABLE ONLY kagzi.console_audit ALTER COLUMN id SET DEFAULT nextval('kagzi.console_audit_id_seq'::regclass);

ALTER TABLE ONLY kagzi.signals ALTER COLUMN id SET DEFAULT nextval('kagzi.signals_id_seq'::regclass);

ALTER TABLE ONLY kagzi.console_audit
    ADD CONSTRAINT console_audit_pkey PRIMARY KEY (id);

ALTER TABLE ONLY kagzi.events_history
    ADD CONSTRAINT events_history_pkey PRIMARY KEY (run_id, key, run_finished_at);

ALTER TABLE ONLY kagzi.events
    ADD CONSTRAINT events_pkey PRIMARY KEY (run_id, key);

ALTER TABLE ONLY kagzi.flow_limits
    ADD CONSTRAINT flow_limits_pkey PRIMARY KEY (namespace, workflow_type);

ALTER TABLE ONLY kagzi.flow_rates
    ADD CONSTRAINT flow_rates_pkey PRIMARY KEY (namespace, workflow_type, flow_key);

ALTER TABLE ONLY kagzi.goose_db_version
    ADD CONSTRAINT goose_db_version_pkey PRIMARY KEY (id);

ALTER TABLE ONLY kagzi.history_drops
    ADD CONSTRAINT history_drops_pkey PRIMARY KEY (id);

ALTER TABLE ONLY kagzi.history_ids
    ADD CONSTRAINT history_ids_pkey PRIMARY KEY (namespace, workflow_id, created_at, run_id);

ALTER TABLE ONLY kagzi.history_retention
    ADD CONSTRAINT history_retention_pkey PRIMARY KEY (namespace);

ALTER TABLE ONLY kagzi.runs_created_history
    ADD CONSTRAINT runs_created_history_pkey PRIMARY KEY (namespace, created_at, run_id, run_finished_at);

ALTER TABLE ONLY kagzi.runs_created
    ADD CONSTRAINT runs_created_pkey PRIMARY KEY (namespace, created_at, run_id);

ALTER TABLE ONLY kagzi.runs_history
    ADD CONSTRAINT runs_history_pkey PRIMARY KEY (run_id, finished_at);

ALTER TABLE ONLY kagzi.runs
    ADD CONSTRAINT runs_pkey PRIMARY KEY (run_id);

ALTER TABLE ONLY kagzi.schedules
    ADD CONSTRAINT schedules_pkey PRIMARY KEY (namespace, schedule_id);

ALTER TABLE ONLY kagzi.signals_history
    ADD CONSTRAINT signals_history_pkey PRIMARY KEY (run_id, id, run_finished_at);

ALTER TABLE ONLY kagzi.signals
    ADD CONSTRAINT signals_pkey PRIMARY KEY (id);

ALTER TABLE ONLY kagzi.step_attempts_history
    ADD CONSTRAINT step_attempts_history_pkey PRIMARY KEY (run_id, step_key, attempt, run_finished_at);

ALTER TABLE ONLY kagzi.step_attempts
    ADD CONSTRAINT step_attempts_pkey PRIMARY KEY (run_id, step_key, attempt);

ALTER TABLE ONLY kagzi.steps_history
    ADD CONSTRAINT steps_history_pkey PRIMARY KEY (run_id, step_key, run_finished_at);

ALTER TABLE kagzi.steps
    ADD CONSTRAINT steps_kind_valid CHECK ((kind = ANY (ARRAY['STEP'::text, 'SLEEP'::text, 'CHILD'::text, 'SIGNAL'::text, 'EVENT'::text, 'PATCH'::text, 'ATTRIBUTES'::text]))) NOT VALID;

ALTER TABLE ONLY kagzi.steps
    ADD CONSTRAINT steps_pkey PRIMARY KEY (run_id, step_key);

ALTER TABLE ONLY kagzi.waiters
    ADD CONSTRAINT waiters_pkey PRIMARY KEY (namespace, client_id);

ALTER TABLE ONLY kagzi.workers
    ADD CONSTRAINT workers_pkey PRIMARY KEY (namespace, worker_id);

CREATE INDEX console_audit_by_namespace ON kagzi.console_audit USING btree (namespace, id DESC);

CREATE INDEX console_audit_by_run ON kagzi.console_audit USING gin (run_ids);

CREATE INDEX flow_rates_age ON kagzi.flow_rates USING btree (window_start);

CREATE INDEX history_ids_finished ON kagzi.history_ids USING btree (run_finished_at);

CREATE INDEX runs_active_by_schedule ON kagzi.runs USING btree (namespace, schedule_id) WHERE ((schedule_id IS NOT NULL) AND (status = ANY (ARRAY['PENDING'::text, 'RUNNING'::text, 'SLEEPING'::text])));

CREATE INDEX runs_by_attributes ON kagzi.runs USING gin (attributes jsonb_path_ops) WHERE (attributes IS NOT NULL);

CREATE INDEX runs_by_parent ON kagzi.runs USING btree (parent_run_id, created_at DESC, run_id DESC) WHERE (parent_run_id IS NOT NULL);

CREATE INDEX runs_by_schedule ON kagzi.runs USING btree (namespace, schedule_id, created_at DESC, run_id DESC) WHERE (schedule_id IS NOT NULL);

CREATE INDEX runs_claimable ON kagzi.runs USING btree (namespace, workflow_type, available_at) WHERE ((status = ANY (ARRAY['PENDING'::text, 'RUNNING'::text, 'SLEEPING'::text])) AND (available_at IS NOT NULL) AND ((flow_key IS NULL) OR (started_at IS NOT NULL)));

CREATE INDEX runs_created_by_type ON kagzi.runs_created USING btree (namespace, workflow_type, created_at, run_id);

CREATE INDEX runs_created_history_by_type ON ONLY kagzi.runs_created_history USING btree (namespace, workflow_type, created_at, run_id);

CREATE INDEX runs_deadlines ON kagzi.runs USING btree (namespace, deadline_at) WHERE ((deadline_at IS NOT NULL) AND (status = ANY (ARRAY['PENDING'::text, 'RUNNING'::text, 'SLEEPING'::text])));

CREATE UNIQUE INDEX runs_debounce ON kagzi.runs USING btree (namespace, workflow_type, debounce_key) WHERE ((debounce_key IS NOT NULL) AND (started_at IS NULL) AND (status = 'PENDING'::text));

CREATE INDEX runs_finished ON kagzi.runs USING btree (namespace, finished_at) WHERE (status = ANY (ARRAY['COMPLETED'::text, 'FAILED'::text, 'CANCELLED'::text]));

CREATE INDEX runs_finished_by_workflow_id ON kagzi.runs USING btree (namespace, workflow_id, created_at DESC) WHERE (status = ANY (ARRAY['COMPLETED'::text, 'FAILED'::text, 'CANCELLED'::text]));

CREATE INDEX runs_history_by_attributes ON ONLY kagzi.runs_history USING gin (attributes jsonb_path_ops) WHERE (attributes IS NOT NULL);

CREATE INDEX runs_history_by_parent ON ONLY kagzi.runs_history USING btree (parent_run_id, created_at DESC, run_id DESC) WHERE (parent_run_id IS NOT NULL);

CREATE INDEX runs_history_by_schedule ON ONLY kagzi.runs_history USING btree (namespace, schedule_id, created_at DESC, run_id DESC) WHERE (schedule_id IS NOT NULL);

CREATE INDEX runs_history_by_workflow_id ON ONLY kagzi.runs_history USING btree (namespace, workflow_id, created_at DESC);

CREATE INDEX runs_history_finished ON ONLY kagzi.runs_history USING btree (namespace, finished_at);

CREATE INDEX runs_key_due ON kagzi.runs USING btree (namespace, workflow_type, available_at) WHERE ((flow_key IS NOT NULL) AND (started_at IS NULL) AND (status = 'PENDING'::text) AND (priority >= 0));

CREATE INDEX runs_key_holders ON kagzi.runs USING btree (namespace, workflow_type, flow_key) WHERE ((flow_key IS NOT NULL) AND (started_at IS NOT NULL) AND (status = ANY (ARRAY['PENDING'::text, 'RUNNING'::text, 'SLEEPING'::text])));

CREATE INDEX runs_key_queue ON kagzi.runs USING btree (namespace, workflow_type, flow_key, available_at) WHERE ((flow_key IS NOT NULL) AND (started_at IS NULL) AND (status = 'PENDING'::text));

CREATE UNIQUE INDEX runs_one_active_per_workflow_id ON kagzi.runs USING btree (namespace, workflow_id) WHERE (status = ANY (ARRAY['PENDING'::text, 'RUNNING'::text, 'SLEEPING'::text]));

CREATE INDEX runs_type_holders ON kagzi.runs USING btree (namespace, workflow_type, available_at) WHERE (holds_type_slot AND (status = 'RUNNING'::text));

CREATE INDEX schedules_due ON kagzi.schedules USING btree (namespace, next_fire_at) WHERE (NOT paused);

CREATE INDEX signals_by_run ON kagzi.signals USING btree (run_id, id);

CREATE UNIQUE INDEX signals_key ON kagzi.signals USING btree (run_id, key) WHERE (key IS NOT NULL);

CREATE INDEX signals_pending ON kagzi.signals USING btree (run_id, name, id) WHERE (consumed_by IS NULL);

CREATE INDEX workers_live ON kagzi.workers USING btree (namespace, last_heartbeat_at) WHERE (status <> 'OFFLINE'::text);

CREATE TRIGGER runs_changed AFTER UPDATE OF status, cancel_requested ON kagzi.runs FOR EACH ROW WHEN ((((old.status IS DISTINCT FROM new.status) AND ((new.parent_run_id IS NOT NULL) OR (new.status = ANY (ARRAY['CANCELLED'::text, 'FAILED'::text])) OR ((old.status = 'RUNNING'::text) AND old.holds_type_slot AND new.holds_type_slot))) OR (old.cancel_requested IS DISTINCT FROM new.cancel_requested))) EXECUTE FUNCTION kagzi.run_changed();

ALTER TABLE ONLY kagzi.events
    ADD CONSTRAINT events_run_id_fkey FOREIGN KEY (run_id) REFERENCES kagzi.runs(run_id) ON DELETE CASCADE;

ALTER TABLE ONLY kagzi.signals
    ADD CONSTRAINT signals_run_id_fkey FOREIGN KEY (run_id) REFERENCES kagzi.runs(run_id) ON DELETE CASCADE;

ALTER TABLE ONLY kagzi.step_attempts
    ADD CONSTRAINT step_attempts_run_id_step_key_fkey FOREIGN KEY (run_id, step_key) REFERENCES kagzi.steps(run_id, step_key) ON DELETE CASCADE;
