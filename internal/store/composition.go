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

// ResultStep records a step whose outcome came from outside the run: a child's start
// (its output names the child) or result, a signal wait that timed out, a Patched
// answer.
type ResultStep struct {
	Fence
	Key  string
	Name string
	Kind vocab.StepKind
	// Status is COMPLETED with Output, or FAILED with Error.
	Status   vocab.StepStatus
	Position *int
	Output   []byte
	Error    []byte
}

// recordResultStep records a ResultStep; a step recorded before is kept, unless it
// was a signal wait still WAITING.
var recordResultStep = named(`
WITH `+ownerSQL+`, step AS (
	INSERT INTO kagzi.steps AS s (run_id, step_key, name, kind, status, output, error, attempts, position)
	SELECT @run_id, @step_key, @name, @kind, @status, @output, @error, 1, @position FROM owner
	ON CONFLICT (run_id, step_key) DO UPDATE SET status = excluded.status, output = excluded.output,
		error = excluded.error, updated_at = now()
	WHERE s.status = 'WAITING'
)
SELECT count(*) FROM owner`,
	append(fenceArgs[*ResultStep](),
		arg("step_key", "text", func(w *ResultStep) string { return w.Key }),
		arg("name", "text", func(w *ResultStep) string { return w.Name }),
		arg("kind", "text", func(w *ResultStep) string { return string(w.Kind) }),
		arg("status", "text", func(w *ResultStep) string { return string(w.Status) }),
		arg("output", "jsonb", func(w *ResultStep) []byte { return w.Output }),
		arg("error", "jsonb", func(w *ResultStep) []byte { return w.Error }),
		arg("position", "integer", func(w *ResultStep) *int { return w.Position }))...)

// RecordResultStep records a step whose outcome came from outside the run; see
// ResultStep. It returns ErrLeaseLost when the fence no longer holds.
func RecordResultStep(ctx context.Context, db DBTX, w ResultStep) error {
	var owned int
	if err := db.QueryRow(ctx, recordResultStep.sql, recordResultStep.args(&w)...).Scan(&owned); err != nil {
		return err
	}
	if owned == 0 {
		return ErrLeaseLost
	}
	return nil
}

// recordMarker records (or overwrites) a record the engine keeps about the run under
// a key of its own: no position (replays skip it), kind PATCH, the key as its name.
var recordMarker = named(`
WITH `+ownerSQL+`
INSERT INTO kagzi.steps AS s (run_id, step_key, name, kind, status, output, attempts)
SELECT @run_id, @step_key, @step_key, 'PATCH', 'COMPLETED', @output, 1 FROM owner
ON CONFLICT (run_id, step_key) DO UPDATE SET output = excluded.output, updated_at = now()
RETURNING 1`,
	append(fenceArgs[*ResultStep](),
		arg("step_key", "text", func(w *ResultStep) string { return w.Key }),
		arg("output", "jsonb", func(w *ResultStep) []byte { return w.Output }))...)

// RecordMarker records output under key for the run, replacing what an earlier
// execution recorded there (only Fence, Key and Output of w are used). It returns
// ErrLeaseLost when the fence no longer holds.
func RecordMarker(ctx context.Context, db DBTX, w ResultStep) error {
	var one int
	err := db.QueryRow(ctx, recordMarker.sql, recordMarker.args(&w)...).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrLeaseLost
	}
	return err
}

// RunOutcome is a run's status and result, for a parent waiting on its child.
type RunOutcome struct {
	Status vocab.RunStatus
	Output []byte
	Error  []byte
}

// runOutcomeSQL reads a run's status and result: those of the last run of its chain
// when it continued as new.
const runOutcomeSQL = `
		WITH RECURSIVE chain AS (
			SELECT run_id, status, output, error, continued_as_run_id, 1 AS n FROM kagzi.runs_all WHERE run_id = $1
			UNION ALL
			SELECT r.run_id, r.status, r.output, r.error, r.continued_as_run_id, c.n + 1
			FROM chain c JOIN kagzi.runs_all r ON r.run_id = c.continued_as_run_id
		)
		SELECT status, output, error FROM chain ORDER BY n DESC LIMIT 1`

// outcomeSetupSQL is sent before runOutcomeSQL: its recursive walk over the live runs
// and every history partition is estimated costly when a partition was never analyzed
// (autovacuum off, or not yet), past jit_above_cost, and PostgreSQL compiled it: seconds
// of compiling, under load, for a read of a few rows by primary key.
const outcomeSetupSQL = `SELECT set_config('jit', 'off', true)`

// GetRunOutcome reads a run's status and result: those of the last run of its chain
// when it continued as new (see ContinueRun).
func GetRunOutcome(ctx context.Context, db DBTX, runID uuid.UUID) (RunOutcome, error) {
	var o RunOutcome
	rows, err := queryAfter(ctx, db, outcomeSetupSQL, runOutcomeSQL, runID)
	err = firstRow{rows: rows, err: err}.Scan(&o.Status, &o.Output, &o.Error)
	if errors.Is(err, pgx.ErrNoRows) {
		return o, ErrNotFound
	}
	return o, err
}

// WaitWrite suspends a run until something from outside happens (a child ends, a
// signal arrives) or until WakeAt (a timeout, or a safety re-check).
type WaitWrite struct {
	Fence
	WakeAt time.Time
	// Signal, when set, lets a signal of this name wake the run at once.
	Signal string
}

// suspendForWait puts a running run to sleep until @wake_at (or its deadline) and
// records what it waits for. A signal or a child's end that came while the run was
// deciding to wait set wake_pending: this UPDATE sees it (it re-reads the row it
// waited for), and the run stays claimable.
var suspendForWait = named(`
WITH upd AS (
	UPDATE kagzi.runs r SET `+releaseSQL("SLEEPING", "CASE WHEN r.wake_pending THEN now() ELSE @wake_at END")+`,
		waiting_signal = @signal, wake_pending = false
	WHERE r.run_id = @run_id AND r.lease_epoch = @epoch AND r.lease_token IS NOT DISTINCT FROM @token AND r.status = 'RUNNING'
	  AND `+slotHeldRSQL+`
	RETURNING `+releasedColumns+`
)
SELECT status, (`+notifyRunSQL+`)::text FROM upd`,
	append(fenceArgs[*WaitWrite](),
		arg("wake_at", "timestamptz", func(w *WaitWrite) time.Time { return w.WakeAt }),
		arg("signal", "text", func(w *WaitWrite) *string {
			if w.Signal == "" {
				return nil
			}
			return &w.Signal
		}))...)

// SuspendForWait puts a running run to sleep until WakeAt (or its deadline), like
// Suspend, and records what it waits for; see suspendForWait. A run whose cancel was
// requested ends CANCELLED. It returns the new status.
func SuspendForWait(ctx context.Context, db DBTX, w WaitWrite) (vocab.RunStatus, error) {
	var status vocab.RunStatus
	var notified string
	err := db.QueryRow(ctx, suspendForWait.sql, suspendForWait.args(&w)...).Scan(&status, &notified)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrLeaseLost
	}
	return status, err
}

// SignalSend is a signal sent to a run of a namespace.
type SignalSend struct {
	Namespace string
	RunID     uuid.UUID
	Name      string
	Payload   []byte
	// Key, when set, is the signal's idempotency key: a run stores one signal per key.
	Key *string
}

// sendSignal stores a signal for an active run of the namespace, unless the run
// already has a signal of its key, and wakes the run if it sleeps waiting for that
// signal. It returns the run's status, whether the key was there already, the run it
// continued as, if it did, and whether it raced with the run's end (see below).
//
// The run's row is updated (its wake_pending set) before the signal is inserted, and
// only while the run is active, so that the signal commits with the row locked: an end
// of the run, or its continue-as-new (whose move of the untaken signals to the next run
// could not see a signal not yet committed), waits for the signal; a signal that waited
// for them finds the run no longer active and stores nothing. (A SELECT ... FOR NO KEY
// UPDATE of the row before the update, in the same statement, deadlocked two senders
// to one run now and then.) When the update found the run ended while the statement's
// snapshot still has it active, raced is true and nothing was stored: the caller sends
// again, and the next statement sees the end.
var sendSignal = named(`
WITH dup AS (
	SELECT 1 FROM kagzi.signals_all s WHERE s.run_id = @run_id AND s.key = @key::text
), wake AS (
	-- Always touch the run row: a run about to wait reads wake_pending under the
	-- same row lock (see SuspendForWait).
	UPDATE kagzi.runs r SET wake_pending = true,
		available_at = CASE WHEN r.status = 'SLEEPING' AND r.waiting_signal = @name THEN now()
			ELSE r.available_at END
	WHERE r.namespace = @namespace AND r.run_id = @run_id AND r.status IN ('PENDING', 'RUNNING', 'SLEEPING')
	  AND NOT EXISTS (SELECT 1 FROM dup)
	RETURNING r.run_id, r.namespace, r.workflow_type, r.status, r.available_at,
		r.status = 'SLEEPING' AND r.available_at <= now() AS woken
), ins AS (
	INSERT INTO kagzi.signals (run_id, name, payload, key)
	SELECT run_id, @name, @payload, @key::text FROM wake
	ON CONFLICT (run_id, key) WHERE key IS NOT NULL DO NOTHING
	RETURNING run_id
), seen AS (
	SELECT status, continued_as_run_id FROM kagzi.runs_all WHERE namespace = @namespace AND run_id = @run_id
)
SELECT coalesce((SELECT status FROM wake), t.status),
	EXISTS (SELECT 1 FROM dup) OR (@key::text IS NOT NULL AND NOT EXISTS (SELECT 1 FROM ins)
		AND EXISTS (SELECT 1 FROM wake)),
	t.continued_as_run_id,
	NOT EXISTS (SELECT 1 FROM wake) AND NOT EXISTS (SELECT 1 FROM dup) AND t.status IN ('PENDING', 'RUNNING', 'SLEEPING'),
	(SELECT (`+notifyRunSQL+`)::text FROM wake WHERE woken)
FROM seen t`,
	arg("namespace", "text", func(s *SignalSend) string { return s.Namespace }),
	arg("run_id", "uuid", func(s *SignalSend) uuid.UUID { return s.RunID }),
	arg("name", "text", func(s *SignalSend) string { return s.Name }),
	arg("payload", "jsonb", func(s *SignalSend) []byte { return s.Payload }),
	arg("key", "text", func(s *SignalSend) *string { return s.Key }))

// SignalSent is what SendSignal learned of the run.
type SignalSent struct {
	// Status is the run's status: a terminal one, unless Duplicate, means nothing
	// was stored.
	Status vocab.RunStatus
	// Duplicate: the signal's key was stored before; nothing stored now.
	Duplicate bool
	// ContinuedAs is the run the run continued as (continue-as-new), if it did.
	ContinuedAs *uuid.UUID
}

// SendSignal stores a signal for an active run; see sendSignal. It returns
// ErrNotFound for an unknown run.
func SendSignal(ctx context.Context, db DBTX, s SignalSend) (SignalSent, error) {
	for {
		var sent SignalSent
		var raced bool
		var ignored *string
		err := db.QueryRow(ctx, sendSignal.sql, sendSignal.args(&s)...).Scan(&sent.Status, &sent.Duplicate,
			&sent.ContinuedAs, &raced, &ignored)
		if errors.Is(err, pgx.ErrNoRows) {
			return sent, ErrNotFound
		}
		if err != nil || !raced {
			return sent, err
		}
		// The run ended (or continued as new) while the statement ran: look again.
	}
}

// SignalKeyMoved tells whether a later run of the chain of a run that continued as new
// (runID) holds a signal of key: one the run had not taken, which moved with its key
// to the next run, or one sent to a later run directly. Either way a signal of that
// key reached the chain.
func SignalKeyMoved(ctx context.Context, db DBTX, runID uuid.UUID, key string) (bool, error) {
	var moved bool
	rows, err := queryAfter(ctx, db, outcomeSetupSQL, `
		WITH RECURSIVE chain AS (
			SELECT continued_as_run_id AS run_id, 1 AS n FROM kagzi.runs_all WHERE run_id = $1
			UNION ALL
			SELECT r.continued_as_run_id, c.n + 1 FROM chain c JOIN kagzi.runs_all r ON r.run_id = c.run_id
			WHERE c.run_id IS NOT NULL
		)
		SELECT EXISTS (SELECT 1 FROM chain c JOIN kagzi.signals_all s ON s.run_id = c.run_id AND s.key = $2)`,
		runID, key)
	err = firstRow{rows: rows, err: err}.Scan(&moved)
	return moved, err
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

// SignalTake is a WaitSignal step's attempt to receive a signal.
type SignalTake struct {
	Fence
	Key, Name string
	Position  int
	// Timeout, when positive, is fixed from the first attempt on.
	Timeout time.Duration
}

// takeSignal receives the oldest pending signal of the name for a WaitSignal step:
// it marks the signal consumed by the step and records the step COMPLETED with its
// payload; with no signal pending, it records the step WAITING with its timeout
// (fixed the first time: a restart does not extend it). A step that already received
// its signal (a try whose answer the connection lost, then tried again) takes no other
// and returns the one it received: the second try took the next pending signal of the
// name and recorded nothing of it (the step was COMPLETED), a signal lost; with none
// pending, the run slept its hour before its replay found the first.
var takeSignal = named(`
WITH `+ownerSQL+`, done AS (
	SELECT status, output FROM kagzi.steps WHERE run_id = @run_id AND step_key = @step_key AND status <> 'WAITING'
), sig AS (
	UPDATE kagzi.signals SET consumed_by = @step_key
	WHERE id = (
		SELECT id FROM kagzi.signals
		WHERE run_id = @run_id AND name = @name AND consumed_by IS NULL AND EXISTS (SELECT 1 FROM owner)
		  AND NOT EXISTS (SELECT 1 FROM done)
		ORDER BY id LIMIT 1
		FOR UPDATE)
	RETURNING payload
), step AS (
	INSERT INTO kagzi.steps AS s (run_id, step_key, name, kind, status, output, wake_at, attempts, position)
	SELECT @run_id, @step_key, @name, 'SIGNAL',
		CASE WHEN EXISTS (SELECT 1 FROM sig) THEN 'COMPLETED' ELSE 'WAITING' END,
		(SELECT payload FROM sig), now() + @timeout_ms * interval '1 millisecond', 0, @position
	FROM owner
	ON CONFLICT (run_id, step_key) DO UPDATE SET
		status = excluded.status, output = excluded.output, updated_at = now()
	WHERE s.status = 'WAITING'
	RETURNING status, output, wake_at
)
SELECT (SELECT count(*) FROM owner), coalesce((SELECT status FROM step), (SELECT status FROM done)),
	coalesce((SELECT output FROM step), (SELECT output FROM done)),
	coalesce((SELECT wake_at FROM step), (SELECT wake_at FROM kagzi.steps WHERE run_id = @run_id AND step_key = @step_key)),
	now()`,
	append(fenceArgs[*SignalTake](),
		arg("step_key", "text", func(w *SignalTake) string { return w.Key }),
		arg("name", "text", func(w *SignalTake) string { return w.Name }),
		arg("timeout_ms", "bigint", func(w *SignalTake) *int64 {
			if w.Timeout <= 0 {
				return nil
			}
			ms := w.Timeout.Milliseconds()
			return &ms
		}),
		arg("position", "integer", func(w *SignalTake) int { return w.Position }))...)

// TakeSignal tries to receive a signal for a WaitSignal step; see takeSignal.
func TakeSignal(ctx context.Context, db DBTX, t SignalTake) (SignalWait, error) {
	var w SignalWait
	var owned int
	var status *vocab.StepStatus
	err := db.QueryRow(ctx, takeSignal.sql, takeSignal.args(&t)...).Scan(&owned, &status, &w.Payload, &w.TimeoutAt, &w.DBNow)
	if err != nil {
		return w, err
	}
	if owned == 0 {
		return w, ErrLeaseLost
	}
	w.Received = status != nil && *status == vocab.StepCompleted
	return w, nil
}

// EventWrite publishes an event of a run and records the step that did it.
type EventWrite struct {
	Fence
	StepKey  string
	Key      string
	Position int
	Value    []byte
}

// setEvent publishes a run's event and records the step that did it, in one fenced
// statement, and tells waiters.
var setEvent = named(`
WITH `+ownerSQL+`, ev AS (
	INSERT INTO kagzi.events (run_id, key, value)
	SELECT @run_id, @key, @value FROM owner
	ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value, updated_at = now()
	RETURNING run_id
), step AS (
	INSERT INTO kagzi.steps (run_id, step_key, name, kind, status, output, attempts, position)
	SELECT @run_id, @step_key, @key, 'EVENT', 'COMPLETED', @value, 1, @position FROM owner
	ON CONFLICT (run_id, step_key) DO NOTHING
)
SELECT (SELECT count(*) FROM owner), (SELECT pg_notify('`+Channel+`', 'e|' || run_id || '|')::text FROM ev)`,
	append(fenceArgs[*EventWrite](),
		arg("step_key", "text", func(w *EventWrite) string { return w.StepKey }),
		arg("key", "text", func(w *EventWrite) string { return w.Key }),
		arg("value", "jsonb", func(w *EventWrite) []byte { return w.Value }),
		arg("position", "integer", func(w *EventWrite) int { return w.Position }))...)

// SetEvent publishes a run's event; see setEvent.
func SetEvent(ctx context.Context, db DBTX, w EventWrite) error {
	var owned int
	if err := db.QueryRow(ctx, setEvent.sql, setEvent.args(&w)...).Scan(&owned, new(*string)); err != nil {
		return err
	}
	if owned == 0 {
		return ErrLeaseLost
	}
	return nil
}

// EventTopic is notified when a run sets an event, with no extra part: a waiter looks
// its key up again. (The key was the extra part, and a key holding '|', which names
// may, was split into the topic: its waiters were never woken, found from outside.)
func EventTopic(runID uuid.UUID) string { return "e|" + runID.String() }

// GetEvent reads an event of a run of the namespace. It returns ErrNotFound when the
// run does not exist in the namespace, and a nil value when the event is not set.
func GetEvent(ctx context.Context, db DBTX, namespace string, runID uuid.UUID, key string) (json.RawMessage, error) {
	var value []byte
	var exists bool
	err := db.QueryRow(ctx, `
		SELECT true, (SELECT value FROM kagzi.events_all e WHERE e.run_id = r.run_id AND e.key = $3)
		FROM kagzi.runs_all r WHERE r.namespace = $1 AND r.run_id = $2`, namespace, runID, key).Scan(&exists, &value)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	return value, err
}
