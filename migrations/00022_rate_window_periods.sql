-- +goose Up
-- A rate window records the period its slots were cut with (period_ms). A limit's
-- period changed at runtime (SetLimits) was applied to slots cut with the old one:
-- a shorter period forgot recent starts (10 starts in 0.3 s under 5 per second), a
-- longer one held runs about twice as long as it said. A window whose period is not
-- the limit's is cut again (kagzi.flow_rate_recut) before it is read or counted in.
-- Rows from before this migration have no period and are taken as cut with the
-- limit's.

ALTER TABLE kagzi.flow_rates ADD COLUMN period_ms bigint;

-- kagzi.flow_rate_recut cuts a rate window's counted starts, in eleven slots of a
-- tenth of p_old_ms from p_start, into eleven slots of a tenth of p_new_ms whose last
-- holds p_at. Each slot's starts are put at the slot's end (or p_at, if sooner): no
-- earlier than they were made, so they count in every window they counted in, and
-- longer, never less. Those that fall before the new window are kept in its first
-- slot (they count one new period more than they need): a claim that read the limits
-- before a change cuts the window back to the old period, and the next claim to the
-- new one, and starts dropped on the way would be lost to the longer period.
-- +goose StatementBegin
CREATE FUNCTION kagzi.flow_rate_recut(p_start timestamptz, p_slots integer[], p_old_ms bigint, p_new_ms bigint,
    p_at timestamptz, OUT window_start timestamptz, OUT slots integer[])
    LANGUAGE plpgsql IMMUTABLE AS $$
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
-- +goose StatementEnd

-- kagzi.flow_rate_room and kagzi.flow_rate_add as in 00003, with the window cut again
-- when its period is not the limit's (and the period recorded).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION kagzi.flow_rate_room(p_ns text, p_type text, p_key text, p_rate integer, p_period_ms bigint)
    RETURNS integer LANGUAGE plpgsql AS $$
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
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION kagzi.flow_rate_add(p_ns text, p_type text, p_key text, p_period_ms bigint, p_n integer)
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
-- +goose StatementEnd

-- kagzi.flow_rate_next is when a full rate window admits a start again: when its oldest
-- counted slot leaves the window (NULL: it is not full, or has no row); a window cut
-- with another period is read as kagzi.flow_rate_room would cut it again.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION kagzi.flow_rate_next(p_ns text, p_type text, p_key text, p_rate integer, p_period_ms bigint)
    RETURNS timestamptz LANGUAGE plpgsql STABLE AS $$
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
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION kagzi.flow_rate_room(p_ns text, p_type text, p_key text, p_rate integer, p_period_ms bigint)
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION kagzi.flow_rate_add(p_ns text, p_type text, p_key text, p_period_ms bigint, p_n integer)
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION kagzi.flow_rate_next(p_ns text, p_type text, p_key text, p_rate integer, p_period_ms bigint)
    RETURNS timestamptz LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT w.window_start + (u.first_used - 1 + 11) * ((p_period_ms / 10.0) * interval '1 millisecond')
    FROM kagzi.flow_rates w,
        LATERAL (SELECT min(o) AS first_used, sum(s) AS used FROM unnest(w.slots) WITH ORDINALITY AS u(s, o)
                 WHERE s > 0) u
    WHERE w.namespace = p_ns AND w.workflow_type = p_type AND w.flow_key = p_key AND u.used >= p_rate);
END $$;
-- +goose StatementEnd

DROP FUNCTION kagzi.flow_rate_recut(timestamptz, integer[], bigint, bigint, timestamptz);
ALTER TABLE kagzi.flow_rates DROP COLUMN period_ms;
