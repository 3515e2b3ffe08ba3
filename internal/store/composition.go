package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/kagzi/kagzi/internal/vocab"
)

// RecordChildStep records the step that started a child run: its output names the
// child. Fenced like RecordStep.
func RecordChildStep(ctx context.Context, db DBTX, runID uuid.UUID, epoch int64, key, name string, position int, output []byte) error {
	var owned int
	err := db.QueryRow(ctx, `
		WITH `+ownerCTE+`, step AS (
			INSERT INTO kagzi.steps (run_id, step_key, name, kind, status, output, attempts, position)
			SELECT $1, $3, $4, 'CHILD', 'COMPLETED', $5, 1, $6 FROM owner
			ON CONFLICT (run_id, step_key) DO NOTHING
		)
		SELECT count(*) FROM owner`, runID, epoch, key, name, output, position).Scan(&owned)
	if err != nil {
		return err
	}
	if owned == 0 {
		return ErrLeaseLost
	}
	return nil
}

// RecordResultStep records a step whose outcome came from outside the run (a child's
// result, a signal wait that timed out): COMPLETED with an output, or FAILED with an
// error. Fenced.
func RecordResultStep(ctx context.Context, db DBTX, runID uuid.UUID, epoch int64, key, name string, kind vocab.StepKind, status vocab.StepStatus,
	position *int, output, errDetail []byte) error {
	var owned int
	err := db.QueryRow(ctx, `
		WITH `+ownerCTE+`, step AS (
			INSERT INTO kagzi.steps AS s (run_id, step_key, name, kind, status, output, error, attempts, position)
			SELECT $1, $3, $4, $5, $6, $7, $8, 1, $9 FROM owner
			ON CONFLICT (run_id, step_key) DO UPDATE SET status = excluded.status, output = excluded.output,
				error = excluded.error, updated_at = now()
			WHERE s.status = 'WAITING'
		)
		SELECT count(*) FROM owner`, runID, epoch, key, name, kind, status, output, errDetail, position).Scan(&owned)
	if err != nil {
		return err
	}
	if owned == 0 {
		return ErrLeaseLost
	}
	return nil
}

// RunOutcome is a run's status and result, for a parent waiting on its child.
type RunOutcome struct {
	Status vocab.RunStatus
	Output []byte
	Error  []byte
}

// GetRunOutcome reads a run's status and result.
func GetRunOutcome(ctx context.Context, db DBTX, runID uuid.UUID) (RunOutcome, error) {
	var o RunOutcome
	err := db.QueryRow(ctx, `SELECT status, output, error FROM kagzi.runs WHERE run_id = $1`, runID).
		Scan(&o.Status, &o.Output, &o.Error)
	if errors.Is(err, pgx.ErrNoRows) {
		return o, ErrNotFound
	}
	return o, err
}

// WaitWrite suspends a run until something from outside happens (a child ends, a
// signal arrives) or until WakeAt (a timeout, or a safety re-check).
type WaitWrite struct {
	RunID  uuid.UUID
	Epoch  int64
	WakeAt time.Time
	// Signal, when set, lets a signal of this name wake the run at once.
	Signal string
}

// SuspendForWait puts a running run to sleep until WakeAt (or its deadline), like
// Suspend, and records what it waits for. A run whose cancel was requested ends
// CANCELLED. Fenced; returns the new status.
func SuspendForWait(ctx context.Context, db DBTX, w WaitWrite) (vocab.RunStatus, error) {
	var status vocab.RunStatus
	var ignored string
	var signal *string
	if w.Signal != "" {
		signal = &w.Signal
	}
	err := db.QueryRow(ctx, `
		WITH upd AS (
			UPDATE kagzi.runs r SET
				status = CASE WHEN r.cancel_requested THEN 'CANCELLED' ELSE 'SLEEPING' END,
				finished_at = CASE WHEN r.cancel_requested THEN now() END,
				-- A signal or a child's end that came while the run was deciding to wait
				-- set wake_pending: this UPDATE sees it (it re-reads the row it waited
				-- for), and the run stays claimable.
				available_at = CASE WHEN r.wake_pending THEN now() ELSE least($3, r.deadline_at) END,
				waiting_signal = $4, wake_pending = false,
				locked_by = NULL, updated_at = now()
			WHERE r.run_id = $1 AND r.lease_epoch = $2 AND r.status = 'RUNNING'
			RETURNING r.run_id, r.namespace, r.workflow_type, r.status, r.available_at
		)
		SELECT status, (`+notifyRunSQL+`)::text FROM upd`, w.RunID, w.Epoch, w.WakeAt, signal).Scan(&status, &ignored)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrLeaseLost
	}
	return status, err
}

// SendSignal stores a signal for an active run of the namespace and wakes the run if
// it sleeps waiting for that signal. It returns the run's status (a terminal status
// means nothing was stored) or ErrNotFound.
func SendSignal(ctx context.Context, db DBTX, namespace string, runID uuid.UUID, name string, payload []byte) (vocab.RunStatus, error) {
	var status vocab.RunStatus
	var ignored *string
	err := db.QueryRow(ctx, `
		WITH target AS (
			SELECT run_id, status FROM kagzi.runs WHERE namespace = $1 AND run_id = $2
		), ins AS (
			INSERT INTO kagzi.signals (run_id, name, payload)
			SELECT run_id, $3, $4 FROM target WHERE status IN ('PENDING', 'RUNNING', 'SLEEPING')
			RETURNING run_id
		), wake AS (
			-- Always touch the run row: a run about to wait reads wake_pending under the
			-- same row lock (see SuspendForWait).
			UPDATE kagzi.runs r SET wake_pending = true,
				available_at = CASE WHEN r.status = 'SLEEPING' AND r.waiting_signal = $3 THEN now()
					ELSE r.available_at END
			FROM ins
			WHERE r.run_id = ins.run_id
			RETURNING r.run_id, r.namespace, r.workflow_type, r.status, r.available_at,
				r.status = 'SLEEPING' AND r.available_at <= now() AS woken
		)
		SELECT t.status, (SELECT (`+notifyRunSQL+`)::text FROM wake WHERE woken) FROM target t`,
		namespace, runID, name, payload).Scan(&status, &ignored)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrNotFound
	}
	return status, err
}

// ActiveRunID returns the active run of a workflow id, or ErrNotFound.
func ActiveRunID(ctx context.Context, db DBTX, namespace, workflowID string) (uuid.UUID, error) {
	var id uuid.UUID
	err := db.QueryRow(ctx, `SELECT run_id FROM (`+newestByWorkflowIDSQL("$1", "$2", "true")+`) r`,
		namespace, workflowID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return uuid.Nil, ErrNotFound
	}
	return id, err
}

// SignalWait is the state of a WaitSignal step after TakeSignal.
type SignalWait struct {
	// Received: the step is COMPLETED with Payload.
	Received bool
	Payload  []byte
	// TimeoutAt is when the wait times out (nil: never), fixed at the first wait.
	TimeoutAt *time.Time
	DBNow     time.Time
}

// TakeSignal tries to receive the oldest pending signal of the name for a WaitSignal
// step, in one fenced statement: it marks the signal consumed by the step and
// records the step COMPLETED with its payload; with no signal pending, it records the
// step WAITING with its timeout (fixed the first time: a restart does not extend it).
func TakeSignal(ctx context.Context, db DBTX, runID uuid.UUID, epoch int64, key, name string, position int, timeout time.Duration) (SignalWait, error) {
	var (
		w      SignalWait
		owned  int
		status *string
	)
	var timeoutMS *int64
	if timeout > 0 {
		ms := timeout.Milliseconds()
		timeoutMS = &ms
	}
	err := db.QueryRow(ctx, `
		WITH `+ownerCTE+`, sig AS (
			UPDATE kagzi.signals SET consumed_by = $3
			WHERE id = (
				SELECT id FROM kagzi.signals
				WHERE run_id = $1 AND name = $4 AND consumed_by IS NULL AND EXISTS (SELECT 1 FROM owner)
				ORDER BY id LIMIT 1
				FOR UPDATE)
			RETURNING payload
		), step AS (
			INSERT INTO kagzi.steps AS s (run_id, step_key, name, kind, status, output, wake_at, attempts, position)
			SELECT $1, $3, $4, 'SIGNAL',
				CASE WHEN EXISTS (SELECT 1 FROM sig) THEN 'COMPLETED' ELSE 'WAITING' END,
				(SELECT payload FROM sig), now() + $5 * interval '1 millisecond', 0, $6
			FROM owner
			ON CONFLICT (run_id, step_key) DO UPDATE SET
				status = excluded.status, output = excluded.output, updated_at = now()
			WHERE s.status = 'WAITING'
			RETURNING status, output, wake_at
		)
		SELECT (SELECT count(*) FROM owner), (SELECT status FROM step), (SELECT output FROM step),
			coalesce((SELECT wake_at FROM step), (SELECT wake_at FROM kagzi.steps WHERE run_id = $1 AND step_key = $3)),
			now()`,
		runID, epoch, key, name, timeoutMS, position).Scan(&owned, &status, &w.Payload, &w.TimeoutAt, &w.DBNow)
	if err != nil {
		return w, err
	}
	if owned == 0 {
		return w, ErrLeaseLost
	}
	w.Received = status != nil && *status == "COMPLETED"
	return w, nil
}

// SetEvent publishes a run's event and records the step that did it, in one fenced
// statement, and tells waiters.
func SetEvent(ctx context.Context, db DBTX, runID uuid.UUID, epoch int64, stepKey, key string, position int, value []byte) error {
	var owned int
	err := db.QueryRow(ctx, `
		WITH `+ownerCTE+`, ev AS (
			INSERT INTO kagzi.events (run_id, key, value)
			SELECT $1, $4, $5 FROM owner
			ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value, updated_at = now()
			RETURNING run_id
		), step AS (
			INSERT INTO kagzi.steps (run_id, step_key, name, kind, status, output, attempts, position)
			SELECT $1, $3, $4, 'EVENT', 'COMPLETED', $5, 1, $6 FROM owner
			ON CONFLICT (run_id, step_key) DO NOTHING
		)
		SELECT (SELECT count(*) FROM owner),
			(SELECT pg_notify('`+Channel+`', 'e|' || run_id || '|' || $4)::text FROM ev)`,
		runID, epoch, stepKey, key, value, position).Scan(&owned, new(*string))
	if err != nil {
		return err
	}
	if owned == 0 {
		return ErrLeaseLost
	}
	return nil
}

// EventTopic is notified when a run sets an event; the extra part is the event's key.
func EventTopic(runID uuid.UUID) string { return "e|" + runID.String() }

// GetEvent reads an event of a run of the namespace. It returns ErrNotFound when the
// run does not exist in the namespace, and a nil value when the event is not set.
func GetEvent(ctx context.Context, db DBTX, namespace string, runID uuid.UUID, key string) (json.RawMessage, error) {
	var value []byte
	var exists bool
	err := db.QueryRow(ctx, `
		SELECT true, (SELECT value FROM kagzi.events e WHERE e.run_id = r.run_id AND e.key = $3)
		FROM kagzi.runs r WHERE r.namespace = $1 AND r.run_id = $2`, namespace, runID, key).Scan(&exists, &value)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	return value, err
}
