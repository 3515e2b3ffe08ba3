package kagzi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	goruntime "runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kagzi/kagzi/internal/store"
)

// An execution is one execution of a claimed run on a worker: the workflow function
// called from the top, its steps replayed from the run's history or run and
// recorded, until the function returns or the run must stop here. This file holds
// its state, its lease and its writes; execute.go runs it and writes how it ended.

// Why an execution stopped before the workflow function returned.
type exitReason int

const (
	exitNone              exitReason = iota
	exitSuspended                    // the run is asleep (or was cancelled) in the database; nothing to write
	exitCancelled                    // the run was cancelled; end it CANCELLED
	exitLeaseLost                    // another worker holds the run; write nothing
	exitShutdown                     // the worker is shutting down; hand the run back
	exitDeadline                     // the run passed its deadline; end it FAILED
	exitNonDeterministic             // a replay asked for another step than its history holds; end it FAILED
	exitRecoveryExhausted            // the run was taken over more than MaxTakeovers times; end it FAILED
)

// Causes of the cancellation of a run's context.
var (
	errLeaseLost   = errors.New("kagzi: lease lost: another worker holds the run")
	errShutdown    = errors.New("kagzi: worker shutting down")
	errRunDeadline = fmt.Errorf("kagzi: the run passed its deadline: %w", ErrDeadlineExceeded)
	// errRecoveryExhausted: the claim took the run over once more than the worker's
	// MaxTakeovers allows; it is failed without running.
	errRecoveryExhausted = fmt.Errorf("kagzi: the run was taken over too many times: %w", ErrRecoveryExhausted)
)

// execution is one execution of a claimed run.
type execution struct {
	rt     *runtime
	def    *definition
	run    store.ClaimedRun // run.Steps is the history's
	hist   *history
	cancel context.CancelCauseFunc
	ctx    context.Context
	// logger is made on first use (see log): most runs never log.
	loggerOnce sync.Once
	logger     *slog.Logger
	// dbOffset is the database's clock minus ours, measured at the claim.
	dbOffset time.Duration
	// leaseUntil (see monoNow) is when the run's lease ends at the earliest, by our
	// monotonic clock measured from before the statement that set it (the claim, a
	// heartbeat, a renewal): writes are not retried past it, and nothing with effects
	// outside the database begins past it without renewing it (ensureLease).
	leaseUntil atomic.Int64
	// branches counts the branches (Go, Map) running now: while any does, the run
	// cannot be released, so sleeps and backoffs wait in process.
	branches atomic.Int32
	// finishing: the workflow function returned and the run's slot was released
	// while its end is written (guarded by the worker's mu).
	finishing bool
	// suspect: the run was taken over MaxTakeovers times, and was held before it
	// started; alone: it runs alone in its worker; launched: when it started (solo.go).
	suspect, alone bool
	launched       time.Time
	// ahead: the run was claimed ahead and waits for a slot, since aheadSince
	// (ahead.go; guarded by the worker's mu); short: it was claimed without limits (its
	// type had none when its claim read it: see Worker.limitsSet).
	ahead      bool
	aheadSince time.Time
	short      bool

	// pending is the run's last completed step while its record is held back (see
	// holdRecord); flushMu serializes writing it, so that whoever needs it durable
	// waits for it. Both guard pending.
	flushMu sync.Mutex
	pending *store.StepWrite
	// holdTimer writes pending after holdLimit if nothing else has by then.
	holdTimer *time.Timer

	mu   sync.Mutex
	exit exitReason
	// goexitStep is the key of the step whose body called runtime.Goexit on the
	// function's goroutine ("": none seen).
	goexitStep string
	// nondeterminism is the detail of the failure when exit is exitNonDeterministic.
	nondeterminism *ErrorDetail
}

// newExecution prepares the execution of a run its worker just claimed: sent is when
// the claim was sent (the lease runs from then, by our clock), claimedAt when its
// answer came. A run cancelled, past its deadline or taken over too often starts
// with its context cancelled, and does not run.
func newExecution(rt *runtime, def *definition, run store.ClaimedRun, sent, claimedAt time.Time) *execution {
	x := &execution{rt: rt, def: def, run: run, hist: newHistory(run.Steps), dbOffset: run.DBNow.Sub(claimedAt)}
	x.run.Steps = nil
	ctx, cancel := context.WithCancelCause(rt.beginExecution(run))
	if run.Deadline != nil {
		// The deadline is the database's clock; the timer runs on ours.
		dctx, stop := context.WithDeadlineCause(ctx, run.Deadline.Add(-x.dbOffset), errRunDeadline)
		cancelRun := cancel
		ctx, cancel = dctx, func(cause error) { cancelRun(cause); stop() }
	}
	x.ctx, x.cancel = ctx, cancel
	x.extendLease(sent, rt.cfg.LeaseDuration)
	switch {
	case run.CancelRequested:
		cancel(ErrCancelled)
	case run.Deadline != nil && !run.Deadline.After(run.DBNow):
		cancel(errRunDeadline)
	case exhausted(run, rt.cfg.MaxTakeovers):
		cancel(errRecoveryExhausted) // it killed its process alone (see solo.go)
	}
	return x
}

// log returns the logger that tags every record with the run's ids. It is built on
// first use: a logger with attributes costs a dozen allocations, and most runs never
// log.
func (x *execution) log() *slog.Logger {
	x.loggerOnce.Do(func() {
		x.logger = x.rt.logger.With("run_id", x.run.RunID, "workflow_id", x.run.WorkflowID,
			"workflow_type", x.run.WorkflowType)
	})
	return x.logger
}

func (x *execution) dbNow() time.Time { return time.Now().Add(x.dbOffset) }

func (x *execution) exitReason() exitReason {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.exit
}

// goexitWhere tells where a goroutine of the function called runtime.Goexit: the
// body of a step, if one was running, else the workflow function (or a branch).
func (x *execution) goexitWhere() string {
	x.mu.Lock()
	defer x.mu.Unlock()
	step := x.goexitStep
	x.goexitStep = ""
	if step != "" {
		return "the body of step " + step
	}
	return "the workflow function or branch"
}

// stop ends the execution of the workflow function (or of this branch) here: it
// records why and unwinds the goroutine (deferred calls run). A lost lease also
// cancels the run's context, so that every branch stops writing.
func (c *Context) stop(reason exitReason) {
	x := c.x
	x.mu.Lock()
	if x.exit == exitNone {
		x.exit = reason
	}
	x.mu.Unlock()
	if reason == exitLeaseLost {
		x.cancel(errLeaseLost)
	}
	goruntime.Goexit()
}

// checkAlive stops the execution if the run's context was cancelled, and the branch
// if only its own context was (its Future reports errBranchCancelled).
func (c *Context) checkAlive() {
	if c.x.ctx.Err() != nil {
		c.stop(reasonFor(context.Cause(c.x.ctx)))
	}
	if c.Err() != nil {
		goruntime.Goexit()
	}
}

// waitInProcess waits d, or until the run's (or branch's) context ends.
func (c *Context) waitInProcess(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-c.Done():
		c.checkAlive()
	}
}

// monoBase anchors lease times to the monotonic clock, so that a change of the wall
// clock (NTP) never moves a lease.
var monoBase = time.Now()

// monoNow is the monotonic time since monoBase, in nanoseconds; see execution.leaseUntil.
func monoNow() int64 { return int64(time.Since(monoBase)) }

// extendLease records that the lease was set to last d from sent, the moment its
// statement was sent (so no later than the database's now() in it).
func (x *execution) extendLease(sent time.Time, d time.Duration) {
	x.leaseUntil.Store(int64(sent.Sub(monoBase) + d))
}

// ensureLease makes sure the run's lease holds before something with effects outside
// the database begins: a step's body, a child's start, a signal taken, an event set.
// A worker that froze after it claimed the run (SIGSTOP, a VM pause, a long GC pause)
// may find on waking that another worker took the run over, even finished it, while
// its heartbeat has not noticed yet; a step recorded by the other worker must not run
// again here. While the lease holds by our own clock (measured from before the
// statement that set it, so never later than the database's), this costs a clock
// read. Past it, the lease is renewed at once with a fenced statement; when another
// worker holds the run, the execution stops (lease lost) and nothing begins.
func (c *Context) ensureLease() {
	x := c.x
	if monoNow() < x.leaseUntil.Load() {
		return
	}
	var cancelRequested bool
	sent := time.Now()
	err := x.writeNow(func(ctx context.Context, db *writer) (err error) {
		cancelRequested, err = db.renewLease(ctx, x.run.Fence, x.rt.cfg.LeaseDuration)
		return err
	})
	if err != nil {
		if !errors.Is(err, errLeaseLost) {
			x.log().Warn("kagzi: cannot renew a lease that passed; the run is left to another worker", "error", err)
		}
		c.stop(exitLeaseLost)
	}
	x.extendLease(sent, x.rt.cfg.LeaseDuration)
	if cancelRequested {
		x.cancel(ErrCancelled)
		c.checkAlive()
	}
}

// A fencedWrite is one write of the execution, made through the worker's writer
// (which picks the committer or the pool for it).
type fencedWrite func(ctx context.Context, db *writer) error

// write makes a fenced write for workflow code, after the held-back step record (see
// holdRecord): when the lease is lost it stops the execution instead of returning.
func (c *Context) write(op fencedWrite) error {
	err := c.x.write(op)
	if errors.Is(err, errLeaseLost) {
		c.stop(exitLeaseLost)
	}
	return err
}

// suspend puts the run to sleep in the database and stops the execution. When the
// database refuses the write (not a lost lease, which stops the execution), it returns
// the error and the execution goes on: the run is still RUNNING, and its workflow
// function gets the error from the call that wanted to sleep.
func (c *Context) suspend(s store.SleepWrite) error {
	if err := c.write(func(ctx context.Context, db *writer) error {
		_, err := db.suspend(ctx, s)
		return err
	}); err != nil {
		return err
	}
	c.stop(exitSuspended)
	return nil // not reached
}

// flush makes the held-back step record durable (see holdRecord), as the fenced
// writes do before their own. A step about to run calls it: its body may depend on
// what the previous step returned.
func (c *Context) flush() error {
	err := c.x.flush()
	if errors.Is(err, errLeaseLost) {
		c.stop(exitLeaseLost)
	}
	return err
}

// write makes a fenced write after the held-back step record (see holdRecord); see
// writeNow.
func (x *execution) write(op fencedWrite) error {
	if err := x.flush(); err != nil {
		return err
	}
	return x.writeNow(op)
}

// writeNow makes a fenced write, retrying transient failures (a lost connection, a
// restarting database) with backoff while the lease lasts. It returns errLeaseLost
// when the lease was lost, or ran out before the write succeeded (another worker
// will take the run over), and the other errors (such as ErrStepRecorded or data the
// database rejects) as they are.
func (x *execution) writeNow(op fencedWrite) error {
	backoff := 50 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), x.rt.cfg.LeaseDuration)
		err := op(ctx, x.rt.db)
		cancel()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, store.ErrLeaseLost):
			return errLeaseLost
		case closedPool(err):
			// The application closed the pool: no write can succeed any more. The
			// execution stops writing nothing, as after a lost lease (the worker stops
			// too, and Run returns ErrClosed); the run's lease, or the look for dead
			// processes, lets another worker take it over.
			return errLeaseLost
		case !transient(err):
			return err
		}
		if monoNow()+int64(backoff) > x.leaseUntil.Load() {
			x.log().Warn("kagzi: giving up a write: the lease ran out", "error", err)
			return errLeaseLost
		}
		x.log().Warn("kagzi: write failed; retrying", "error", err, "retry_in", backoff)
		time.Sleep(backoff)
		backoff = min(backoff*2, time.Second)
	}
}

// holdRecord holds back the record of a step that just completed in the workflow's
// own scope, instead of writing it at once: the next write of the run carries it
// first, and when the workflow function returns instead, the run's end records it
// in the same statement (one write instead of two for the last step). Nothing runs
// in between that could observe the difference: the next step's body, a sleep, a
// child, a signal wait or the end all flush it first. A crash before it is written
// runs the step again, as a crash just before an immediate write would have.
// Steps in branches are written at once. A record is held back at most holdLimit:
// a workflow that goes on computing (or blocks) after a step has it written then,
// so the window in which a crash would run the step again stays short.
func (c *Context) holdRecord(w store.StepWrite) bool {
	if c.sc.branch || c.x.branches.Load() > 0 {
		return false
	}
	x := c.x
	x.flushMu.Lock()
	defer x.flushMu.Unlock()
	if x.pending != nil {
		return false
	}
	x.pending = &w
	if x.holdTimer == nil {
		x.holdTimer = time.AfterFunc(holdLimit, x.flushLate)
	} else {
		x.holdTimer.Reset(holdLimit)
	}
	return true
}

// holdLimit is the longest a step's record is held back; see holdRecord.
const holdLimit = 100 * time.Millisecond

// recordPending writes the held-back record p.
func (x *execution) recordPending(p *store.StepWrite) error {
	return x.writeNow(func(ctx context.Context, db *writer) error {
		_, err := db.recordStep(ctx, *p)
		return err
	})
}

// flushLate writes the held-back record when it was held for holdLimit. On failure
// it leaves the record pending: the next flush writes it again and reports the error.
func (x *execution) flushLate() {
	x.flushMu.Lock()
	defer x.flushMu.Unlock()
	p := x.pending
	if p == nil {
		return
	}
	if err := x.recordPending(p); err == nil || errors.Is(err, store.ErrStepRecorded) {
		x.pending = nil
	}
}

// takePending removes the held-back step record and returns it (nil: none).
func (x *execution) takePending() *store.StepWrite {
	x.flushMu.Lock()
	defer x.flushMu.Unlock()
	p := x.pending
	x.pending = nil
	if x.holdTimer != nil {
		x.holdTimer.Stop()
	}
	return p
}

// flush writes the held-back step record, if any; see holdRecord.
func (x *execution) flush() error {
	x.flushMu.Lock()
	defer x.flushMu.Unlock()
	p := x.pending
	if p == nil {
		return nil
	}
	if x.holdTimer != nil {
		x.holdTimer.Stop()
	}
	err := x.recordPending(p)
	switch {
	case err == nil, errors.Is(err, store.ErrStepRecorded):
		x.pending = nil
		return nil
	case errors.Is(err, errLeaseLost):
		return err
	}
	x.pending = nil
	return NonRetryable(fmt.Errorf("kagzi: step %s of run %s cannot be recorded: %w", p.Key, x.run.RunID, err))
}
