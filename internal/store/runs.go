// Package store owns every SQL statement Kagzi runs against PostgreSQL. Each function
// holds its statement next to the Go that runs it; no other package writes SQL.
//
// Every write a worker makes for a run is fenced: it names the run and the lease
// epoch the worker claimed it with, and matches no row once another claim has bumped
// the epoch. Such writes return ErrLeaseLost.
//
// Not every effect of these statements is in them: the trigger kagzi.runs_changed
// (function kagzi.run_changed, in migrations/00001_baseline.sql) fires on every UPDATE
// that changes a run's status or cancel_requested, whichever statement here makes it.
// A child's end sets wake_pending on its parent and wakes it if it sleeps; a run
// cancelled, or failed on its deadline (error code DEADLINE_EXCEEDED), cancels its
// active children, recursively. Both notify on the channel 'kagzi' (WakeTopic,
// DoneTopic, CancelTopic). A statement that changes either column, or a test that
// counts notifications, has to count the trigger's work too.
package store

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/kagzi/kagzi/internal/vocab"
)

// Channel is the one LISTEN/NOTIFY channel Kagzi uses. Payloads are "topic|extra";
// see WakeTopic, DoneTopic and CancelTopic.
const Channel = "kagzi"

// WakeTopic is notified when a run of the type becomes (or will become) claimable;
// the extra part is its available_at in Unix milliseconds.
//
// The topic is "w|<length>:<namespace>|<type>", the length being the namespace's in
// bytes, so that it names one (namespace, type) pair even when either holds '|':
// without it namespace "a|b" with type "c" and namespace "a" with type "b|c" would
// share "w|a|b|c". The SQL that notifies builds the same string (octet_length, a
// byte count as len is); the extra part holds no '|', so the notifier's split at the
// last '|' still yields the whole topic.
func WakeTopic(namespace, workflowType string) string {
	return "w|" + strconv.Itoa(len(namespace)) + ":" + namespace + "|" + workflowType
}

// DoneTopic is notified when the run reaches a terminal status; the extra part is the status.
func DoneTopic(runID uuid.UUID) string { return "d|" + runID.String() }

// DeadlineTopic is notified when a run of the namespace with a deadline starts; the
// extra part is the deadline in Unix milliseconds. Workers fail the runs whose deadline
// passed while they waited (see FailOverdueRuns).
func DeadlineTopic(namespace string) string { return "t|" + namespace }

// CancelTopic is notified when a cancel is requested for a running run of the namespace;
// the extra part is the run id.
func CancelTopic(namespace string) string { return "c|" + namespace }

// Errors returned by this package.
var (
	ErrNotFound = errors.New("not found")
)

// DBTX is what the store needs of a connection: a pool, a single connection or a transaction.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Run is one row of kagzi.runs.
type Run struct {
	RunID           uuid.UUID
	Namespace       string
	WorkflowID      string
	WorkflowType    string
	Status          vocab.RunStatus
	Input           []byte
	Output          []byte
	Error           []byte
	Attempt         int
	AvailableAt     time.Time
	LockedBy        *string
	LeaseEpoch      int64
	CancelRequested bool
	Deadline        *time.Time
	CreatedAt       time.Time
	StartedAt       *time.Time
	FinishedAt      *time.Time
	UpdatedAt       time.Time
	// ScheduleID and ScheduleTick name the schedule and tick that fired the run; nil
	// for runs started by Start.
	ScheduleID   *string
	ScheduleTick *time.Time
	// ParentRunID and ParentStepKey name the run and step that started this child run.
	ParentRunID   *uuid.UUID
	ParentStepKey *string
	// Version is the workflow version the run started with (nil until pinned).
	Version *string
	// ForkedFromRunID and ForkedFromStep name the run and step a fork was copied from.
	ForkedFromRunID *uuid.UUID
	ForkedFromStep  *string
	// Takeovers counts the claims that took the run over after its worker's lease
	// passed (see claimSQL).
	Takeovers int
	// Attributes is the run's searchable attributes, a JSON object (nil: none).
	Attributes []byte
	// Priority, FlowKey (its concurrency key) and DebounceKey: see migration 00003.
	Priority    int
	FlowKey     *string
	DebounceKey *string
	// ContinuedFromRunID and ContinuedAsRunID link the runs of a workflow id that
	// continued as new (see ContinueRun).
	ContinuedFromRunID *uuid.UUID
	ContinuedAsRunID   *uuid.UUID
}

const runColumns = `run_id, namespace, workflow_id, workflow_type, status, input, output, error,
	attempt, available_at, locked_by, lease_epoch, cancel_requested, deadline_at, created_at,
	started_at, finished_at, updated_at, schedule_id, schedule_tick, parent_run_id, parent_step_key,
	version, forked_from_run_id, forked_from_step, takeovers, attributes, priority, flow_key, debounce_key,
	continued_from_run_id, continued_as_run_id`

// newestByWorkflowIDSQL selects (runColumns and a rank) the run of a workflow id that
// a lookup by id means: its active run, else, where finished (a condition) holds, its
// newest finished run. Each branch reads its own partial index
// (runs_one_active_per_workflow_id, runs_finished_by_workflow_id): no index covers
// both, so that starts and claims, which rewrite active rows, maintain one index
// fewer. ns and id are the placeholders of the namespace and the workflow id. The
// finished runs are read from the live table and the history (runs_all); with
// finished "", the statement reads active runs only, and does not name the history
// (whose partitions a cached plan would lock at every execution).
func newestByWorkflowIDSQL(ns, id, finished string) string {
	if finished == "" {
		return `
	SELECT ` + runColumns + `, 0 AS rank FROM kagzi.runs
	WHERE namespace = ` + ns + ` AND workflow_id = ` + id + ` AND status IN ('PENDING', 'RUNNING', 'SLEEPING')`
	}
	return `
	SELECT * FROM (
		(SELECT ` + runColumns + `, 0 AS rank FROM kagzi.runs
		 WHERE namespace = ` + ns + ` AND workflow_id = ` + id + ` AND status IN ('PENDING', 'RUNNING', 'SLEEPING'))
		UNION ALL
		(SELECT ` + runColumns + `, 1 FROM kagzi.runs_all
		 WHERE namespace = ` + ns + ` AND workflow_id = ` + id + ` AND status IN ('COMPLETED', 'FAILED', 'CANCELLED')
		   AND ` + finished + `
		 ORDER BY created_at DESC LIMIT 1)
	) newest ORDER BY rank LIMIT 1`
}

// GetRun reads one run of the namespace: in the live table, and only when it is not
// there in the history, so that reading a live run (a Wait's every look) names no
// partition of the history. A run archived between the two reads is in the history
// at the second; one restored between them (a rerun) is looked for live once more.
func GetRun(ctx context.Context, db DBTX, namespace string, runID uuid.UUID) (Run, error) {
	for _, table := range []string{"kagzi.runs", "kagzi.runs_history", "kagzi.runs"} {
		r, err := scanRun(db.QueryRow(ctx, `SELECT `+runColumns+` FROM `+table+`
		WHERE namespace = $1 AND run_id = $2`, namespace, runID))
		if !errors.Is(err, pgx.ErrNoRows) {
			return r, err
		}
	}
	return Run{}, ErrNotFound
}

// RunEnd is what a wait needs of a run: whether and how it ended.
type RunEnd struct {
	RunID            uuid.UUID
	WorkflowID       string
	Status           vocab.RunStatus
	Output           []byte // COMPLETED
	Error            []byte // FAILED
	ContinuedAsRunID *uuid.UUID
}

// LookAtRuns reads, in one statement, how the runs of runIDs stand in the live table
// (the runs of many waits at once: see the client's runLooks). Only ended runs carry
// their output or error; a run not in the live table (archived, removed) is missing
// from the result, and its waiter looks for it on its own.
func LookAtRuns(ctx context.Context, db DBTX, namespace string, runIDs []uuid.UUID) ([]RunEnd, error) {
	rows, err := db.Query(ctx, `SELECT run_id, workflow_id, status,
		CASE WHEN status = 'COMPLETED' THEN output END, CASE WHEN status = 'FAILED' THEN error END,
		continued_as_run_id
	FROM kagzi.runs WHERE namespace = $1 AND run_id = ANY($2)`, namespace, runIDs)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (RunEnd, error) {
		var e RunEnd
		var status string
		var contAs pgtype.UUID
		err := row.Scan(&e.RunID, &e.WorkflowID, &status, &e.Output, &e.Error, &contAs)
		e.Status, e.ContinuedAsRunID = vocab.RunStatus(status), uuidOrNil(contAs)
		return e, err
	})
}

// GetRunByWorkflowID reads the newest run of a workflow id, the active one first.
func GetRunByWorkflowID(ctx context.Context, db DBTX, namespace, workflowID string) (Run, error) {
	r, err := scanRun(db.QueryRow(ctx, `SELECT `+runColumns+` FROM (`+newestByWorkflowIDSQL("$1", "$2", "true")+`) r`,
		namespace, workflowID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Run{}, ErrNotFound
	}
	return r, err
}

// cancelSetSQL is what a cancel (CancelRun, CancelRuns) sets on a run r whose status
// before was t.status: a PENDING or SLEEPING run ends CANCELLED at once, a RUNNING one
// gets cancel_requested (its worker ends it).
const cancelSetSQL = `status = CASE WHEN t.status IN ('PENDING', 'SLEEPING') THEN 'CANCELLED' ELSE r.status END,
	finished_at = CASE WHEN t.status IN ('PENDING', 'SLEEPING') THEN now() ELSE r.finished_at END,
	cancel_requested = true, updated_at = now()`

// cancelRunSQL cancels a run. A PENDING or SLEEPING run ends CANCELLED at once; a
// RUNNING one gets cancel_requested, its worker is notified, and the worker ends it
// CANCELLED (a completion racing with the cancel loses: CompleteRun checks the flag).
// It returns the run's status before and after.
const cancelRunSQL = `
WITH live AS (
	SELECT run_id, status, cancel_requested FROM kagzi.runs WHERE namespace = $1 AND run_id = $2 FOR UPDATE
), target AS (
	SELECT * FROM live
	UNION ALL
	SELECT run_id, status, false FROM kagzi.runs_history
	WHERE namespace = $1 AND run_id = $2 AND NOT EXISTS (SELECT 1 FROM live)
), upd AS (
	UPDATE kagzi.runs r SET ` + cancelSetSQL + `
	FROM live t
	WHERE r.run_id = t.run_id AND t.status IN ('PENDING', 'SLEEPING', 'RUNNING')
	RETURNING r.run_id, r.namespace, r.status
)
SELECT t.status, coalesce(u.status, t.status),
	CASE WHEN u.status = 'CANCELLED' THEN pg_notify('` + Channel + `', 'd|' || u.run_id || '|CANCELLED')
	     WHEN u.status = 'RUNNING' THEN pg_notify('` + Channel + `', 'c|' || u.namespace || '|' || u.run_id)
	END IS NULL, t.cancel_requested
FROM target t LEFT JOIN upd u ON true`

// CancelRun cancels a run; see cancelRunSQL. requested tells that a cancel of the run
// was requested before (a RUNNING run that had not stopped yet).
func CancelRun(ctx context.Context, db DBTX, namespace string, runID uuid.UUID) (before, after vocab.RunStatus, requested bool, err error) {
	var ignored bool
	err = db.QueryRow(ctx, cancelRunSQL, namespace, runID).Scan(&before, &after, &ignored, &requested)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", false, ErrNotFound
	}
	return before, after, requested, err
}
