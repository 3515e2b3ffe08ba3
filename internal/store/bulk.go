package store

import (
	"context"
	"strconv"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi/internal/vocab"
)

// BulkOutcome is what a set-based cancel or rerun did to one run of its batch.
type BulkOutcome struct {
	RunID uuid.UUID
	// Before is the run's status when the statement locked it.
	Before vocab.RunStatus
	// CancelRequested is whether a cancel was requested before (cancels only).
	CancelRequested bool
	// Changed reports that the statement changed the run.
	Changed bool
}

// bulkNotifyGroup is how many run notifications share one NOTIFY payload (a newline,
// then one per line; see internal/notifier). A cancel topic holds the namespace (at
// most 255 bytes), so 25 of them stay under Postgres's 8000-byte payload limit.
const bulkNotifyGroup = 25

// cancelRunsSQL is cancelRunSQL for a batch of runs of the namespace ($2): each
// PENDING or SLEEPING run ends CANCELLED at once, each RUNNING one gets
// cancel_requested and its worker is notified. It locks the runs it can in run_id
// order and SKIP LOCKED the others (a worker writing them): it never waits on a row
// while it holds others, so it cannot deadlock with a worker's merged writes. The
// runs it returns are those it locked; the caller cancels the rest one by one
// (CancelRun, which waits for the row).
var cancelRunsSQL = `
WITH target AS (
	SELECT run_id, status, cancel_requested FROM kagzi.runs
	WHERE namespace = $1 AND run_id = ANY($2::uuid[])
	ORDER BY run_id
	FOR UPDATE SKIP LOCKED
), upd AS (
	UPDATE kagzi.runs r SET ` + cancelSetSQL + `
	FROM target t
	WHERE r.run_id = t.run_id AND t.status IN ('PENDING', 'SLEEPING', 'RUNNING')
	RETURNING r.run_id, r.namespace, r.status
), notified AS (
	SELECT pg_notify('` + Channel + `', string_agg(E'\n' || CASE WHEN status = 'CANCELLED'
			THEN 'd|' || run_id || '|CANCELLED' ELSE 'c|' || namespace || '|' || run_id END, ''))
	FROM (SELECT *, row_number() OVER () AS ord FROM upd) u
	GROUP BY (ord - 1) / ` + strconv.Itoa(bulkNotifyGroup) + `
)
SELECT t.run_id, t.status, t.cancel_requested,
	u.run_id IS NOT NULL AND (u.status <> t.status OR NOT t.cancel_requested),
	(SELECT count(*) FROM notified)
FROM target t LEFT JOIN upd u ON u.run_id = t.run_id`

// CancelRuns cancels the runs of a batch that it can lock at once; see cancelRunsSQL.
// Runs it did not return were locked by another transaction, or are not in the
// namespace (any more).
func CancelRuns(ctx context.Context, db DBTX, namespace string, ids []uuid.UUID) ([]BulkOutcome, error) {
	rows, err := db.Query(ctx, cancelRunsSQL, namespace, ids)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (BulkOutcome, error) {
		var o BulkOutcome
		var notified int64
		err := row.Scan(&o.RunID, &o.Before, &o.CancelRequested, &o.Changed, &notified)
		return o, err
	})
}

// rerunRunsSQL is RerunRun for a batch of runs of the namespace ($2): each FAILED or
// CANCELLED run becomes PENDING, claimable now, with its attempt bumped, its error,
// cancel flag and deadline cleared and its steps that did not complete deleted. A run
// whose workflow id an active run holds is left alone, and of several runs of the
// batch with one workflow id only the newest is rerun (one active run per id). Runs
// are locked as in cancelRunsSQL (SKIP LOCKED). A start of one of the workflow ids
// that commits while this runs makes it fail with a unique violation; the caller
// then reruns the batch one run at a time.
const rerunRunsSQL = `
WITH target AS (
	SELECT run_id, status, workflow_id, created_at FROM kagzi.runs
	WHERE namespace = $1 AND run_id = ANY($2::uuid[])
	ORDER BY run_id
	FOR UPDATE SKIP LOCKED
), eligible AS (
	SELECT DISTINCT ON (t.workflow_id) t.run_id FROM target t
	WHERE t.status IN ('FAILED', 'CANCELLED')
	  -- Another run: the statement's snapshot may hold this one still RUNNING, when
	  -- its worker ended it after the snapshot and before the lock.
	  AND NOT EXISTS (SELECT 1 FROM kagzi.runs a
		WHERE a.namespace = $1 AND a.workflow_id = t.workflow_id AND a.run_id <> t.run_id
		  AND a.status IN ('PENDING', 'RUNNING', 'SLEEPING'))
	ORDER BY t.workflow_id, t.created_at DESC, t.run_id DESC
), cleared AS (
	DELETE FROM kagzi.steps s USING eligible e WHERE s.run_id = e.run_id AND s.status <> 'COMPLETED'
), upd AS (
	UPDATE kagzi.runs r SET ` + rerunSetSQL + `
	FROM eligible e
	WHERE r.run_id = e.run_id
	RETURNING r.run_id, r.namespace, r.workflow_type, r.available_at
), notified AS (
	SELECT pg_notify('` + Channel + `', 'w|' || octet_length(namespace) || ':' || namespace || '|' || workflow_type || '|'
		|| (extract(epoch FROM min(available_at)) * 1000)::bigint)
	FROM upd GROUP BY namespace, workflow_type
)
SELECT t.run_id, t.status, false, u.run_id IS NOT NULL, (SELECT count(*) FROM notified)
FROM target t LEFT JOIN upd u ON u.run_id = t.run_id`

// RerunRuns reruns the runs of a batch that it can lock at once; see rerunRunsSQL. It
// returns ErrActiveRunExists when a concurrent start took one of their workflow ids
// (nothing was changed). Archived runs of the batch that a rerun takes (FAILED or
// CANCELLED) move back into the live tables first, in the same transaction; the
// others stay in the history.
func RerunRuns(ctx context.Context, db Beginner, namespace string, ids []uuid.UUID) ([]BulkOutcome, error) {
	var out []BulkOutcome
	err := InTx(ctx, db, TxIdleLimit, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT run_id FROM kagzi.runs_history
			WHERE namespace = $1 AND run_id = ANY ($2) AND status IN ('FAILED', 'CANCELLED')`, namespace, ids)
		if err != nil {
			return err
		}
		rerunnable, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			return err
		}
		if _, err := RestoreRuns(ctx, tx, namespace, rerunnable); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, rerunRunsSQL, namespace, ids)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (BulkOutcome, error) {
			var o BulkOutcome
			var notified int64
			err := row.Scan(&o.RunID, &o.Before, &o.CancelRequested, &o.Changed, &notified)
			return o, err
		})
		return err
	})
	if isUniqueViolation(err) {
		return nil, ErrActiveRunExists
	}
	return out, err
}
