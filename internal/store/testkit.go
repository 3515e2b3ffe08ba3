package store

import (
	"context"
	"time"
)

// The statements of this file serve kagzitest, the test kit for users' workflow
// tests: they move the database's notion of waiting times, never in production.

// idleTimerSQL tells whether anything in the namespace is running or claimable now
// (busy), and otherwise when the earliest timer is due: a PENDING run's start or
// retry time, a sleep's wake time, a deadline, a signal wait's timeout. The
// hourly re-check of a run waiting for a child or a signal is not a timer (the
// child's timers, or the signal, wake it), unless the signal is already there or
// the child already ended: then the re-check is what wakes the run.
const idleTimerSQL = `
WITH active AS (
	SELECT run_id, status, available_at, deadline_at, waiting_signal FROM kagzi.runs
	WHERE namespace = $1 AND status IN ('PENDING', 'RUNNING', 'SLEEPING') AND available_at IS NOT NULL
)
SELECT
	EXISTS (SELECT 1 FROM active WHERE status = 'RUNNING' OR available_at <= now()),
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
		SELECT deadline_at FROM active WHERE deadline_at IS NOT NULL
		UNION ALL
		SELECT s.wake_at FROM kagzi.steps s JOIN active a ON a.run_id = s.run_id
		WHERE a.status = 'SLEEPING' AND s.status = 'WAITING' AND s.wake_at IS NOT NULL
	) timers),
	now()`

// IdleTimer reports whether a run of the namespace is running or claimable now
// (busy) and, when none is, the earliest timer (nil: none) and the database's clock.
func IdleTimer(ctx context.Context, db DBTX, namespace string) (busy bool, next *time.Time, dbNow time.Time, err error) {
	err = db.QueryRow(ctx, idleTimerSQL, namespace).Scan(&busy, &next, &dbNow)
	return busy, next, dbNow, err
}

// shiftTimeSQL moves every waiting time of the namespace's unfinished runs $2
// microseconds earlier: start, wake and retry times (available_at, except the leases
// of RUNNING runs), deadlines, and the wake times and timeouts of their steps. The
// workers of the runs' types are told the new times.
const shiftTimeSQL = `
WITH runs AS (
	UPDATE kagzi.runs SET
		available_at = CASE WHEN status = 'RUNNING' THEN available_at
			ELSE available_at - $2 * interval '1 microsecond' END,
		deadline_at = deadline_at - $2 * interval '1 microsecond'
	WHERE namespace = $1 AND status IN ('PENDING', 'RUNNING', 'SLEEPING') AND available_at IS NOT NULL
	RETURNING run_id, namespace, workflow_type, status, available_at
), steps AS (
	UPDATE kagzi.steps s SET wake_at = s.wake_at - $2 * interval '1 microsecond'
	FROM runs r
	WHERE s.run_id = r.run_id AND s.wake_at IS NOT NULL
	RETURNING 1
), wake AS (
	SELECT namespace, workflow_type, min(available_at) AS available_at FROM runs
	WHERE status <> 'RUNNING'
	GROUP BY namespace, workflow_type
)
SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM steps),
	(SELECT count(pg_notify('` + Channel + `', 'w|' || octet_length(namespace) || ':' || namespace || '|' || workflow_type || '|'
		|| (extract(epoch FROM available_at) * 1000)::bigint)) FROM wake)`

// ShiftTime moves the waiting times of the namespace's unfinished runs d earlier, as
// if d had passed; see shiftTimeSQL. It returns how many runs it moved.
func ShiftTime(ctx context.Context, db DBTX, namespace string, d time.Duration) (runs int64, err error) {
	var steps, notified int64
	err = db.QueryRow(ctx, shiftTimeSQL, namespace, d.Microseconds()).Scan(&runs, &steps, &notified)
	return runs, err
}
