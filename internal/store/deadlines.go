package store

import (
	"context"
	"time"
)

// failOverdueSQL fails, in the namespace $1, up to $2 runs whose deadline passed while
// they waited: PENDING, SLEEPING, or RUNNING past their lease (a worker that died or
// froze), or RUNNING past their deadline by more than their worker's heartbeat
// interval (at least $3 milliseconds: a worker that froze holding its lease, whose
// late writes are fenced out). A run that a worker executes has its own deadline
// timer, which ends it at its deadline; these are the runs no worker could claim in
// time (every slot busy, or no worker of the type) or whose worker cannot act. Each
// ends FAILED with the same error detail a worker records (code DEADLINE_EXCEEDED), which
// the trigger runs_changed reads to cancel the run's children, and its waiters are
// notified. Rows another transaction holds are skipped (a claim: the claiming worker
// fails the run itself). It also returns the earliest deadline still to come among the
// namespace's unfinished runs, and whether the limit left overdue runs behind.
const failOverdueSQL = `
WITH due AS (
	SELECT run_id FROM kagzi.runs
	WHERE namespace = $1 AND deadline_at IS NOT NULL AND deadline_at <= now()
	  AND status IN ('PENDING', 'RUNNING', 'SLEEPING')
	  AND (status IN ('PENDING', 'SLEEPING')
	       OR (status = 'RUNNING' AND (available_at <= now() OR deadline_at + ` + runningGraceSQL + ` <= now())))
	ORDER BY deadline_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
), failed AS (
	UPDATE kagzi.runs r SET status = 'FAILED', finished_at = now(), locked_by = NULL, updated_at = now(),
		error = jsonb_build_object('code', 'DEADLINE_EXCEEDED', 'message', 'the run passed its deadline',
			'non_retryable', true, 'subject', r.workflow_type)
	FROM due
	WHERE r.run_id = due.run_id
	RETURNING r.run_id
)
SELECT (SELECT count(pg_notify('` + Channel + `', 'd|' || run_id || '|FAILED')) FROM failed),
	least((SELECT min(deadline_at) FROM kagzi.runs
		WHERE namespace = $1 AND deadline_at IS NOT NULL AND deadline_at > now()
		  AND status IN ('PENDING', 'RUNNING', 'SLEEPING')),
		-- The RUNNING runs past their deadline by less than their grace: when it has passed.
		(SELECT min(deadline_at + ` + runningGraceSQL + `) FROM kagzi.runs
		WHERE namespace = $1 AND deadline_at IS NOT NULL AND deadline_at <= now() AND status = 'RUNNING'
		  AND deadline_at + ` + runningGraceSQL + ` > now())),
	now()`

// runningGraceSQL is how long past its deadline a RUNNING run is left to its worker
// (whose own timer ends it at the deadline, but whose end may take a moment to
// write): the worker's heartbeat interval, at least $3 milliseconds (OverdueGrace). A
// live worker beats within that; a frozen one does not act.
const runningGraceSQL = `greatest($3::bigint, coalesce((SELECT w.heartbeat_interval_ms FROM kagzi.workers w
		WHERE w.namespace = kagzi.runs.namespace AND w.worker_id = kagzi.runs.locked_by), 0)) * interval '1 millisecond'`

// OverdueGrace is the least time past its deadline a RUNNING run is left to its
// worker, whose own timer ends it at the deadline, before any worker's sweep fails it:
// the worker's heartbeat interval when it is longer (see failOverdueSQL).
const OverdueGrace = time.Second

// FailOverdueRuns fails up to limit runs of the namespace whose deadline passed while
// they waited; see failOverdueSQL. next is the earliest deadline still to come (nil:
// none), dbNow the database's clock; when failed == limit, more may be overdue.
func FailOverdueRuns(ctx context.Context, db DBTX, namespace string, limit int) (failed int, next *time.Time, dbNow time.Time, err error) {
	err = db.QueryRow(ctx, failOverdueSQL, namespace, limit, OverdueGrace.Milliseconds()).Scan(&failed, &next, &dbNow)
	return failed, next, dbNow, err
}
