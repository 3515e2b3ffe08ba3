-- +goose Up
-- The claims count a run holding a slot of its type's concurrency limit among the
-- holders for two seconds past its lease's end. A fenced write or lease renewal checks
-- the lease in its own snapshot; a claim counting holders reads the row as it stood
-- before a renewal in flight, so a renewal that checked the lease just before it ended
-- and committed just after kept the run while a claim in between had given its slot to
-- another run (two runs of a type limited to 1, both recording). The store's claim of a
-- known limited type, its eager starts and its explanation of a held run use the same
-- grace (internal/store: slotGraceSQL). Nothing else changes.

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION kagzi.claim(p_ns text, p_types text[], p_versions text[], p_cursors text[],
    p_worker text, p_lease_ms bigint, p_n integer, p_finishing uuid[], p_floors timestamptz[], p_walk boolean[],
    p_key_floors timestamptz[], p_key_scans boolean[])
    RETURNS SETOF kagzi.claimed_run
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
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION kagzi.claim(p_ns text, p_types text[], p_versions text[], p_cursors text[],
    p_worker text, p_lease_ms bigint, p_n integer, p_finishing uuid[], p_floors timestamptz[], p_walk boolean[],
    p_key_floors timestamptz[], p_key_scans boolean[])
    RETURNS SETOF kagzi.claimed_run
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
            -- A holder whose lease passed (its worker died) no longer counts: its slot
            -- is free, and the claim that takes the run over holds it again.
            SELECT count(*) INTO held FROM kagzi.runs r
            WHERE r.namespace = p_ns AND r.workflow_type = p_types[i] AND r.holds_type_slot AND r.status = 'RUNNING'
              AND r.available_at > now()
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
-- +goose StatementEnd
