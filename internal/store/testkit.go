package store

import (
	"context"
	"time"
)

// The statements of this file serve kagzitest, the test kit for users' workflow
// tests: they move the database's notion of waiting times, never in production.

// idleTimerSQL tells whether anything in the namespace is running or claimable now
// (busy): a due run of a type and version that the test's worker registers ($2, $3,
// also while it restarts) or another worker of the namespace that is not OFFLINE (a
// test's own worker, another Env's); a due run no worker can claim (a child another
// service runs, a run pinned to a version no worker runs) waits for no timer of the
// test's. Otherwise it tells when the earliest timer is due: a PENDING run's start or
// retry time, a sleep's wake time, a deadline, a signal wait's timeout, a rate
// window's next admission. The hourly re-check of a run waiting for a child or a
// signal is not a timer (the child's timers, or the signal, wake it), unless the
// signal is already there or the child already ended: then the re-check is what
// wakes the run. A run due now that a flow-control limit holds back (see RunHold) is
// not claimable: held by its key's concurrency limit, it waits for a holder to stop,
// which the holder's own timers bring about; held by a rate limit, it waits for the
// window to admit it again, which is a timer.
const idleTimerSQL = `
WITH active AS (
	SELECT run_id, workflow_type, version, status, available_at, deadline_at, waiting_signal, flow_key, started_at
	FROM kagzi.runs
	WHERE namespace = $1 AND status IN ('PENDING', 'RUNNING', 'SLEEPING') AND available_at IS NOT NULL
), due AS (
	SELECT h.key_full OR coalesce(h.rate_next > now() OR h.key_rate_next > now(), false) AS held,
		CASE WHEN NOT h.key_full THEN greatest(h.rate_next, h.key_rate_next) END AS admitted_at
	FROM active a
	LEFT JOIN kagzi.flow_limits l ON l.namespace = $1 AND l.workflow_type = a.workflow_type
	CROSS JOIN LATERAL (SELECT
		-- A key's limits hold back first starts only; the type's rate every claim.
		coalesce(a.status = 'PENDING' AND a.started_at IS NULL AND a.flow_key IS NOT NULL
			AND l.key_concurrency IS NOT NULL AND (
				SELECT count(*) FROM kagzi.runs r
				WHERE r.namespace = $1 AND r.workflow_type = a.workflow_type AND r.flow_key = a.flow_key
				  AND r.started_at IS NOT NULL AND r.status IN ('PENDING', 'RUNNING', 'SLEEPING')) >= l.key_concurrency,
			false) AS key_full,
		CASE WHEN l.rate IS NOT NULL
			THEN kagzi.flow_rate_next($1, a.workflow_type, '', l.rate, l.rate_period_ms) END AS rate_next,
		CASE WHEN l.key_rate IS NOT NULL AND a.status = 'PENDING' AND a.started_at IS NULL AND a.flow_key IS NOT NULL
			THEN kagzi.flow_rate_next($1, a.workflow_type, a.flow_key, l.key_rate, l.key_rate_period_ms) END AS key_rate_next
	) h
	WHERE a.status <> 'RUNNING' AND a.available_at <= now() AND EXISTS (
		SELECT 1 FROM (
			SELECT o.t, o.v FROM unnest($2::text[], $3::text[]) AS o(t, v)
			UNION ALL
			SELECT r.t, r.v FROM kagzi.workers k, unnest(k.workflow_types, k.workflow_versions) AS r(t, v)
			WHERE k.namespace = $1 AND k.status <> 'OFFLINE'
		) reg
		WHERE reg.t = a.workflow_type AND (a.version IS NULL OR a.version = reg.v))
)
SELECT
	EXISTS (SELECT 1 FROM active WHERE status = 'RUNNING') OR EXISTS (SELECT 1 FROM due WHERE NOT held),
	(SELECT min(t) FROM (
		SELECT a.available_at AS t FROM active a
		WHERE a.status = 'PENDING' OR a.available_at = a.deadline_at
		   OR EXISTS (SELECT 1 FROM kagzi.steps s
		              WHERE s.run_id = a.run_id AND s.kind = 'SLEEP' AND s.wake_at = a.available_at)
		   OR EXISTS (SELECT 1 FROM kagzi.signals g
		              WHERE g.run_id = a.run_id AND g.name = a.waiting_signal AND g.consumed_by IS NULL)
		   OR EXISTS (SELECT 1 FROM kagzi.runs c
		              WHERE c.parent_run_id = a.run_id AND c.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
		                AND NOT EXISTS (SELECT 1 FROM kagzi.steps r
		                                WHERE r.run_id = a.run_id AND r.step_key = c.parent_step_key || '/result'))
		UNION ALL
		SELECT admitted_at FROM due WHERE held
		UNION ALL
		SELECT deadline_at FROM active WHERE deadline_at IS NOT NULL
		UNION ALL
		SELECT s.wake_at FROM kagzi.steps s JOIN active a ON a.run_id = s.run_id
		WHERE a.status = 'SLEEPING' AND s.status = 'WAITING' AND s.wake_at IS NOT NULL
	) timers WHERE t > now()),
	now()`

// IdleTimer reports whether a run of the namespace is running, or claimable now by the
// test's worker (of types, each of the version at its index) or another that is not
// OFFLINE (busy) and, when none is, the earliest timer (nil: none) and the database's
// clock.
func IdleTimer(ctx context.Context, db DBTX, namespace string, types, versions []string) (busy bool, next *time.Time, dbNow time.Time, err error) {
	err = db.QueryRow(ctx, idleTimerSQL, namespace, types, versions).Scan(&busy, &next, &dbNow)
	return busy, next, dbNow, err
}

// shiftTimeSQL moves every waiting time of the namespace's unfinished runs $2
// microseconds earlier: start, wake and retry times (available_at, except the leases
// of RUNNING runs), deadlines, debounce keys' maximum waits (debounce_until, the
// latest start a later start of the key may push the run to), the wake times and
// timeouts of their steps, and the windows of the namespace's rate limits. The
// workers of the runs' types are told the new times, and the namespace's sweeps of
// deadlines the earliest deadline.
var shiftTimeSQL = `
WITH runs AS (
	UPDATE kagzi.runs SET
		available_at = CASE WHEN status = 'RUNNING' THEN available_at
			ELSE available_at - $2 * interval '1 microsecond' END,
		deadline_at = deadline_at - $2 * interval '1 microsecond',
		debounce_until = debounce_until - $2 * interval '1 microsecond'
	WHERE namespace = $1 AND status IN ('PENDING', 'RUNNING', 'SLEEPING') AND available_at IS NOT NULL
	RETURNING run_id, namespace, workflow_type, status, available_at, deadline_at
), steps AS (
	UPDATE kagzi.steps s SET wake_at = s.wake_at - $2 * interval '1 microsecond'
	FROM runs r
	WHERE s.run_id = r.run_id AND s.wake_at IS NOT NULL
	RETURNING 1
), rates AS (
	-- The rate windows, so that the starts they counted are $2 older too.
	UPDATE kagzi.flow_rates SET window_start = window_start - $2 * interval '1 microsecond'
	WHERE namespace = $1
	RETURNING 1
), wake AS (
	SELECT namespace, workflow_type, min(available_at) AS available_at FROM runs
	WHERE status <> 'RUNNING'
	GROUP BY namespace, workflow_type
)
SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM steps),
	(SELECT count(pg_notify('` + Channel + `', 'w|' || octet_length(namespace) || ':' || namespace || '|' || workflow_type || '|'
		|| (extract(epoch FROM available_at) * 1000)::bigint)) FROM wake),
	-- The workers' sweeps of deadlines, whose timers ran on the time before the shift
	-- (a run no worker of the test claims, a child another service runs, ends only
	-- by a sweep): at the earliest deadline now.
	(SELECT ` + notifyDeadlineSQL("$1::text", "min(deadline_at)") + ` FROM runs)`

// ShiftTime moves the waiting times of the namespace's unfinished runs d earlier, as
// if d had passed; see shiftTimeSQL. It returns how many runs it moved.
func ShiftTime(ctx context.Context, db DBTX, namespace string, d time.Duration) (runs int64, err error) {
	var steps, notified int64
	var deadlines *string
	err = db.QueryRow(ctx, shiftTimeSQL, namespace, d.Microseconds()).Scan(&runs, &steps, &notified, &deadlines)
	return runs, err
}
