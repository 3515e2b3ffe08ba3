package kagzi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/kagzi/kagzi/internal/store"
)

// Hooks observe what Kagzi does, for tracing, metrics and tests: set one in
// Config.Hooks and every Start, execution, step attempt, sleep, signal and claim of
// the client (and of its workers) calls it. The core imports no telemetry library;
// github.com/kagzi/kagzi/kagziotel implements Hooks with OpenTelemetry, and
// github.com/kagzi/kagzi/kagzitest with test stubs.
//
// A ...Begin method returns the context the operation goes on with (carrying a span,
// say): it must be derived from the context it was given, with values only (no
// cancellation or deadline of its own). The matching ...End receives that context, or
// one derived from it, and the same event, filled in. Begin and End are always
// paired, on the same goroutine for steps and starts. The other methods report
// something that happened.
//
// Hooks run on Kagzi's hot path: keep them fast, and never block. They must be safe for
// concurrent use. A hook's panic is recovered and logged, and the operation goes on as
// if the hook had returned what it was given. They never see payloads (inputs, outputs,
// signal and event values), only names, ids, statuses, durations and error messages.
// Embed NopHooks in an implementation to implement only some methods, and to keep
// compiling when methods are added.
type Hooks interface {
	// StartBegin is called before a run is inserted by Start, StartTx, StartByName,
	// StartChild or Fork (not for a schedule's tick). It may add propagation fields to
	// e.Carrier (a W3C traceparent, say): the carrier is stored with the run and handed
	// to ExecutionBegin of every execution of it, on any worker, after any sleep or crash.
	StartBegin(ctx context.Context, e *StartEvent) context.Context
	// StartEnd is called once the insert returned: e.AlreadyExists and e.Err are set.
	StartEnd(ctx context.Context, e *StartEvent)
	// ExecutionBegin is called when a worker has claimed a run, before it calls the
	// workflow function: a run claimed ahead of a free slot (WorkerConfig.ClaimAhead)
	// waits for one in between, and a run claimed cancelled, past its deadline or
	// taken over too often ends without calling it. ctx carries nothing of the
	// caller's: restore the trace from e.Carrier. The returned context is the run's:
	// the workflow function, its steps and their hooks get contexts derived from it.
	ExecutionBegin(ctx context.Context, e *ExecutionEvent) context.Context
	// ExecutionEnd is called when the execution ended: e.Outcome says how. It is called
	// after the end was written to the database, so the next execution of the run (on
	// this worker or another) may have begun already.
	ExecutionEnd(ctx context.Context, e *ExecutionEvent)
	// StepBegin is called before each attempt of a step runs its function (a replayed
	// step has no attempt and calls nothing). The returned context is the one the
	// step function gets. StepBegin may set e.Replace to run instead of the function.
	StepBegin(ctx context.Context, e *StepEvent) context.Context
	// StepEnd is called when the attempt's function returned (or timed out), before
	// the attempt is recorded: e.Status, e.Err and e.Duration are set.
	StepEnd(ctx context.Context, e *StepEvent)
	// Sleep is called when a run starts a new sleep, durable or in process (not on a
	// replay).
	Sleep(ctx context.Context, e *SleepEvent)
	// Signal is called when a signal is sent (by a client), received, waited for or
	// timed out (by a run).
	Signal(ctx context.Context, e *SignalEvent)
	// Claim is called after each claim statement of a worker.
	Claim(ctx context.Context, e *ClaimEvent)
}

// NopHooks implements Hooks and does nothing. Embed it in a Hooks implementation to
// implement only some methods.
type NopHooks struct{}

// StartBegin returns ctx.
func (NopHooks) StartBegin(ctx context.Context, _ *StartEvent) context.Context { return ctx }

// StartEnd does nothing.
func (NopHooks) StartEnd(context.Context, *StartEvent) {}

// ExecutionBegin returns ctx.
func (NopHooks) ExecutionBegin(ctx context.Context, _ *ExecutionEvent) context.Context { return ctx }

// ExecutionEnd does nothing.
func (NopHooks) ExecutionEnd(context.Context, *ExecutionEvent) {}

// StepBegin returns ctx.
func (NopHooks) StepBegin(ctx context.Context, _ *StepEvent) context.Context { return ctx }

// StepEnd does nothing.
func (NopHooks) StepEnd(context.Context, *StepEvent) {}

// Sleep does nothing.
func (NopHooks) Sleep(context.Context, *SleepEvent) {}

// Signal does nothing.
func (NopHooks) Signal(context.Context, *SignalEvent) {}

// Claim does nothing.
func (NopHooks) Claim(context.Context, *ClaimEvent) {}

// RunRef identifies the run an event is about.
type RunRef struct {
	Namespace    string
	RunID        string
	WorkflowID   string
	WorkflowType string
}

// StartEvent describes a start (see Hooks.StartBegin).
type StartEvent struct {
	// RunRef names the run to insert; when the workflow id was taken (AlreadyExists),
	// StartEnd names the existing run instead.
	RunRef
	// ParentRunID is set for a child run (StartChild).
	ParentRunID string
	// Carrier starts empty; StartBegin adds propagation fields, stored with the run
	// (plain JSON: the payload codec does not apply to it). Nothing is stored when it
	// stays empty.
	Carrier map[string]string
	// Time is when the start began.
	Time time.Time
	// Set for StartEnd.
	AlreadyExists bool
	Err           error
}

// ExecutionOutcome says how an execution of a run ended.
type ExecutionOutcome string

// Execution outcomes.
const (
	OutcomeCompleted  ExecutionOutcome = "COMPLETED"   // the run completed
	OutcomeFailed     ExecutionOutcome = "FAILED"      // the run failed for good
	OutcomeCancelled  ExecutionOutcome = "CANCELLED"   // the run was cancelled
	OutcomeSuspended  ExecutionOutcome = "SUSPENDED"   // the run sleeps or waits (a long sleep, a backoff, a signal, a child); it resumes later, on any worker
	OutcomeRetrying   ExecutionOutcome = "RETRYING"    // the workflow function failed; its next attempt is scheduled
	OutcomeHandedBack ExecutionOutcome = "HANDED_BACK" // the worker shut down and handed the run back
	OutcomeLeaseLost  ExecutionOutcome = "LEASE_LOST"  // another worker took the run over; nothing more was recorded here
	OutcomeUnrecorded ExecutionOutcome = "UNRECORDED"  // the end could not be recorded; the run is claimed again after its lease
)

// ExecutionEvent describes one execution of a run on a worker (see
// Hooks.ExecutionBegin).
type ExecutionEvent struct {
	RunRef
	// WorkerID is the worker executing the run.
	WorkerID string
	// Attempt is the workflow-level attempt (Context.Attempt).
	Attempt int
	// Carrier is what StartBegin stored with the run (nil when nothing was).
	Carrier map[string]string
	// AvailableAt is when the run became claimable (its start time, wake time, retry
	// time or, for a run taken over, the expiry of the previous lease), and ClaimedAt
	// when this worker claimed it: the difference is the claim latency. Both are the
	// database's clock.
	AvailableAt time.Time
	ClaimedAt   time.Time
	// RecordedSteps counts the steps recorded before this execution: 0 for a first
	// execution, more for a resumed run (they are replayed).
	RecordedSteps int
	// Begin is when the execution began, at the claim's answer (the worker's clock).
	Begin time.Time
	// Set for ExecutionEnd.
	Outcome  ExecutionOutcome
	Duration time.Duration
	// Error is the recorded error of a FAILED or RETRYING outcome.
	Error *ErrorDetail
	// ContinuedAsRunID is set, with the outcome COMPLETED, when the run continued as
	// new: the run started in the same transaction, which took over its workflow id.
	ContinuedAsRunID string
}

// StepEvent describes one attempt of a step (see Hooks.StepBegin).
type StepEvent struct {
	RunRef
	// Key is the step's key ("charge#1"), Name its name.
	Key  string
	Name string
	// Attempt is the attempt's number, 1 for the first.
	Attempt int
	// Replace, when StepBegin sets it, runs instead of the step's function for this
	// attempt: it returns the output as JSON (decoded into the step's output type) or
	// the attempt's error. For tests (kagzitest stubs, fails and crashes steps with it).
	Replace func(ctx context.Context) (output []byte, err error)
	// Begin is when the attempt began.
	Begin time.Time
	// Set for StepEnd: COMPLETED, FAILED, TIMED_OUT or INTERRUPTED.
	Status   StepStatus
	Err      error
	Duration time.Duration
}

// SleepEvent describes a new durable sleep (see Hooks.Sleep).
type SleepEvent struct {
	RunRef
	Key  string
	Name string
	// WakeAt is when the run wakes (the database's clock, as far as the worker knows it).
	WakeAt time.Time
	// Durable reports that the run is released until WakeAt; a short sleep waits in
	// process instead.
	Durable bool
}

// SignalAction says what happened to a signal.
type SignalAction string

// Signal actions.
const (
	SignalSent     SignalAction = "SENT"      // a client sent it
	SignalReceived SignalAction = "RECEIVED"  // a run's WaitSignal received it
	SignalWaiting  SignalAction = "WAITING"   // a run sleeps until it arrives
	SignalTimedOut SignalAction = "TIMED_OUT" // a run's WaitSignal timed out
)

// SignalEvent describes a signal sent to or awaited by a run (see Hooks.Signal).
type SignalEvent struct {
	// RunRef names the run; a client's send knows only Namespace and RunID.
	RunRef
	Name   string
	Action SignalAction
	// Key is the WaitSignal step's key (not for SENT).
	Key string
	// Begin and Duration time a send.
	Begin    time.Time
	Duration time.Duration
	Err      error
}

// ClaimEvent describes one claim statement of a worker (see Hooks.Claim).
type ClaimEvent struct {
	Namespace string
	WorkerID  string
	Types     []string
	// Requested is how many runs the worker asked for (its free slots, and the runs
	// it claims ahead of them: WorkerConfig.ClaimAhead), Claimed how many it got.
	Requested int
	Claimed   int
	Duration  time.Duration
	Err       error
	// Eager reports a run claimed by the insert of its own start (eager start): no
	// claim statement ran, Requested and Claimed are 1 and Duration is zero.
	Eager bool
}

// MultiHooks returns Hooks that call each of hooks in turn: Begin methods in order
// (each gets the context the one before returned), End methods in reverse order.
// Nil entries are skipped.
func MultiHooks(hooks ...Hooks) Hooks {
	var m multiHooks
	for _, h := range hooks {
		if h != nil {
			m = append(m, h)
		}
	}
	if len(m) == 1 {
		return m[0]
	}
	return m
}

type multiHooks []Hooks

func (m multiHooks) StartBegin(ctx context.Context, e *StartEvent) context.Context {
	for _, h := range m {
		ctx = h.StartBegin(ctx, e)
	}
	return ctx
}

func (m multiHooks) StartEnd(ctx context.Context, e *StartEvent) {
	for i := len(m) - 1; i >= 0; i-- {
		m[i].StartEnd(ctx, e)
	}
}

func (m multiHooks) ExecutionBegin(ctx context.Context, e *ExecutionEvent) context.Context {
	for _, h := range m {
		ctx = h.ExecutionBegin(ctx, e)
	}
	return ctx
}

func (m multiHooks) ExecutionEnd(ctx context.Context, e *ExecutionEvent) {
	for i := len(m) - 1; i >= 0; i-- {
		m[i].ExecutionEnd(ctx, e)
	}
}

func (m multiHooks) StepBegin(ctx context.Context, e *StepEvent) context.Context {
	for _, h := range m {
		ctx = h.StepBegin(ctx, e)
	}
	return ctx
}

func (m multiHooks) StepEnd(ctx context.Context, e *StepEvent) {
	for i := len(m) - 1; i >= 0; i-- {
		m[i].StepEnd(ctx, e)
	}
}

func (m multiHooks) Sleep(ctx context.Context, e *SleepEvent) {
	for _, h := range m {
		h.Sleep(ctx, e)
	}
}

func (m multiHooks) Signal(ctx context.Context, e *SignalEvent) {
	for _, h := range m {
		h.Signal(ctx, e)
	}
}

func (m multiHooks) Claim(ctx context.Context, e *ClaimEvent) {
	for _, h := range m {
		h.Claim(ctx, e)
	}
}

// The call sites of the hooks in the core. Each is a no-op, without allocation, when
// the client has no hooks.

// hookStartBegin calls StartBegin for a run about to be inserted and stores the
// carrier it fills in n.
func (c *Client) hookStartBegin(ctx context.Context, n *store.NewRun) (context.Context, *StartEvent) {
	if c.hooks == nil {
		return ctx, nil
	}
	e := &StartEvent{RunRef: RunRef{Namespace: n.Namespace, RunID: n.RunID.String(), WorkflowID: n.WorkflowID,
		WorkflowType: n.WorkflowType}, Carrier: map[string]string{}, Time: time.Now()}
	if n.ParentRunID != nil {
		e.ParentRunID = n.ParentRunID.String()
	}
	ctx = c.hooks.StartBegin(ctx, e)
	if len(e.Carrier) > 0 {
		n.Carrier, _ = json.Marshal(e.Carrier)
	}
	return ctx, e
}

// hookStartEnd calls StartEnd with the insert's result.
func (c *Client) hookStartEnd(ctx context.Context, e *StartEvent, r store.Run, inserted bool, err error) {
	if e == nil {
		return
	}
	if err == nil && !inserted {
		e.AlreadyExists = true
		e.RunID, e.WorkflowType = r.RunID.String(), r.WorkflowType
	}
	e.Err = err
	c.hooks.StartEnd(ctx, e)
}

// execEventKey holds a run's *ExecutionEvent in its context.
type execEventKey struct{}

// beginExecution calls ExecutionBegin for a claimed run and returns the base of the
// run's context.
func (rt *runtime) beginExecution(run store.ClaimedRun) context.Context {
	ctx := context.Background()
	h := rt.hooks
	if h == nil {
		return ctx
	}
	e := &ExecutionEvent{RunRef: RunRef{Namespace: run.Namespace, RunID: run.RunID.String(),
		WorkflowID: run.WorkflowID, WorkflowType: run.WorkflowType}, WorkerID: rt.workerID, Attempt: run.Attempt,
		AvailableAt: run.AvailableAt, ClaimedAt: run.DBNow, RecordedSteps: len(run.Steps), Begin: time.Now()}
	if len(run.Carrier) > 0 {
		_ = json.Unmarshal(run.Carrier, &e.Carrier)
	}
	ctx = h.ExecutionBegin(ctx, e)
	return context.WithValue(ctx, execEventKey{}, e)
}

// endExecution calls ExecutionEnd once for the execution.
func (rt *runtime) endExecution(x *execution, outcome ExecutionOutcome, detail []byte) {
	if rt.hooks == nil {
		return
	}
	e, _ := x.ctx.Value(execEventKey{}).(*ExecutionEvent)
	if e == nil || e.Outcome != "" {
		return
	}
	e.Outcome, e.Duration, e.Error = outcome, time.Since(e.Begin), decodeDetail(detail)
	rt.hooks.ExecutionEnd(x.ctx, e)
}

// outcomeOf maps the status a run was finished with, and the error of the write, to
// the outcome of its execution.
func outcomeOf(status RunStatus, err error) ExecutionOutcome {
	switch {
	case errors.Is(err, errLeaseLost):
		return OutcomeLeaseLost
	case err != nil:
		return OutcomeUnrecorded
	case status == StatusCompleted:
		return OutcomeCompleted
	case status == StatusFailed:
		return OutcomeFailed
	}
	return OutcomeCancelled
}

// hookClaim reports a claim statement.
func (w *Worker) hookClaim(ctx context.Context, requested, claimed int, began time.Time, err error) {
	if w.client.hooks == nil {
		return
	}
	w.client.hooks.Claim(ctx, &ClaimEvent{Namespace: w.client.ns, WorkerID: w.cfg.ID, Types: w.types,
		Requested: requested, Claimed: claimed, Duration: time.Since(began), Err: err})
}

// runRef names the run a Context executes.
func (c *Context) runRef() RunRef {
	r := c.x.run
	return RunRef{Namespace: r.Namespace, RunID: r.RunID.String(), WorkflowID: r.WorkflowID, WorkflowType: r.WorkflowType}
}

// stepAttempt is one attempt of a step as the hooks see it; with no hooks, ctx is the
// step's context and nothing else is set.
type stepAttempt struct {
	ctx   context.Context
	run   context.Context
	hooks Hooks
	e     *StepEvent
}

// beginAttempt calls StepBegin for an attempt of the step key.
func (c *Context) beginAttempt(key, name string, attempt int) stepAttempt {
	h := c.x.rt.hooks
	if h == nil {
		return stepAttempt{ctx: c.Context}
	}
	e := &StepEvent{RunRef: c.runRef(), Key: key, Name: name, Attempt: attempt, Begin: time.Now()}
	return stepAttempt{ctx: h.StepBegin(c.Context, e), run: c.Context, hooks: h, e: e}
}

// end calls StepEnd with the attempt's result.
func (a stepAttempt) end(err error, timedOut bool) {
	if a.e == nil {
		return
	}
	a.e.Duration, a.e.Err = time.Since(a.e.Begin), err
	switch {
	case a.run.Err() != nil:
		a.e.Status = StepInterrupted
	case timedOut:
		a.e.Status = StepTimedOut
	case err != nil:
		a.e.Status = StepFailed
	default:
		a.e.Status = StepCompleted
	}
	a.hooks.StepEnd(a.ctx, a.e)
}

// stepBody returns the function the attempt runs: fn, or the hook's Replace.
func stepBody[T any](a stepAttempt, fn func(context.Context) (T, error)) func(context.Context) (T, error) {
	if a.e == nil || a.e.Replace == nil {
		return fn
	}
	replace, key := a.e.Replace, a.e.Key
	return func(ctx context.Context) (T, error) {
		var out T
		b, err := replace(ctx)
		if err != nil {
			return out, err
		}
		if err := json.Unmarshal(b, &out); err != nil {
			return out, NonRetryable(fmt.Errorf("kagzi: the replacement output of step %s does not decode into %s: %w",
				key, typeName[T](), err))
		}
		return out, nil
	}
}

// hookSleep reports a new sleep of the run.
func (c *Context) hookSleep(key, name string, remaining time.Duration, durable bool) {
	h := c.x.rt.hooks
	if h == nil {
		return
	}
	h.Sleep(c.Context, &SleepEvent{RunRef: c.runRef(), Key: key, Name: name,
		WakeAt: c.x.dbNow().Add(remaining), Durable: durable})
}

// hookSignalWait reports what a run's WaitSignal did.
func (c *Context) hookSignalWait(key, name string, action SignalAction) {
	h := c.x.rt.hooks
	if h == nil {
		return
	}
	h.Signal(c.Context, &SignalEvent{RunRef: c.runRef(), Name: name, Key: key, Action: action})
}

// hookSignalSent reports a signal a client sent.
func (c *Client) hookSignalSent(ctx context.Context, runID uuid.UUID, name string, began time.Time, err error) {
	if c.hooks == nil {
		return
	}
	c.hooks.Signal(ctx, &SignalEvent{RunRef: RunRef{Namespace: c.ns, RunID: runID.String()}, Name: name,
		Action: SignalSent, Begin: began, Duration: time.Since(began), Err: err})
}

// withValuesOf returns ctx with the values (a span, say) of from, and ctx's deadline
// and cancellation. A child's start uses it so that the parent's trace reaches
// the child.
func withValuesOf(ctx, from context.Context) context.Context {
	return valuesFrom{Context: ctx, values: from}
}

type valuesFrom struct {
	context.Context
	values context.Context
}

func (v valuesFrom) Value(key any) any {
	if val := v.values.Value(key); val != nil {
		return val
	}
	return v.Context.Value(key)
}

// QueueStat is the state of the unfinished runs of one workflow type in a namespace,
// for metrics (kagziotel exports it as gauges).
type QueueStat struct {
	WorkflowType string
	// Ready counts the runs claimable now: the queue's depth. It includes runs whose
	// wake or retry time has come and runs whose worker's lease expired, and leaves out
	// those Held.
	Ready int64
	// Held counts the runs whose time has come that a concurrency limit holds back
	// (see Limits): of a key at its key limit, or beyond the room of their type's
	// limit. They are not claimable until a holder ends. A rate limit's held runs are
	// in Ready.
	Held int64
	// Running counts the runs a live worker holds.
	Running int64
	// Waiting counts the runs whose time has not come: delayed starts, sleeps,
	// backoffs, signal and child waits.
	Waiting int64
	// OldestReady is how long the oldest run whose time has come has waited (0: none is
	// Ready). Under a key limit it may be a held run's.
	OldestReady time.Duration
}

// QueueStats reports the unfinished runs of the client's namespace by workflow type:
// how many are ready (the queue's depth), running and waiting, and the age of the
// oldest ready run. One statement over the unfinished runs; meant for a metrics
// scrape, not for a hot path.
// With Config.ReadPool it reads from it (a replica may lag the primary).
func (c *Client) QueueStats(ctx context.Context) ([]QueueStat, error) {
	if err := c.usable("QueueStats"); err != nil {
		return nil, err
	}
	rows, err := store.QueueStats(ctx, c.read, c.ns)
	if err != nil {
		return nil, readError("kagzi: queue stats", err)
	}
	out := make([]QueueStat, len(rows))
	for i, r := range rows {
		out[i] = QueueStat{WorkflowType: r.WorkflowType, Ready: r.Ready, Held: r.Held, Running: r.Running,
			Waiting: r.Waiting, OldestReady: r.OldestReady}
	}
	return out, nil
}
