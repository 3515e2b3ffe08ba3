package kagzi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kagzi/kagzi/internal/gopool"
	"github.com/kagzi/kagzi/internal/store"
)

// Context is the context a workflow function runs with. It is a context.Context,
// cancelled when the run is cancelled or passes its deadline, when this worker loses
// the run's lease, or when the worker shuts down (context.Cause tells which); and it
// carries the run's identity, a logger, and the durable Sleep.
//
// A Context belongs to one execution of one run: use it only from the goroutine it
// was given to (the workflow function's, or a branch's, see Go), and do not keep it
// after that function returns.
type Context struct {
	context.Context
	x  *execution
	sc *scope
}

// scope gives step keys to the workflow function or to one branch of it. A branch's
// keys carry the key of the Go (or Map item) that started it as a prefix, so they
// depend on call positions only, never on completion order.
type scope struct {
	prefix string
	branch bool
	mu     sync.Mutex
	counts map[string]int
	// pos counts the calls of the scope that take a position (all but Patched).
	pos int
	// cancel ends a branch's context (a sibling failed); nil for the root.
	cancel context.CancelCauseFunc
	// inStep holds the key of the step whose body runs now on the scope's goroutine
	// (nil: none). A durable call on the scope's Context meanwhile comes from inside
	// that body, and is refused (see usable).
	inStep atomic.Pointer[string]
}

// usable checks that call (Step, Sleep, ...) may be made with c: a Context the worker
// gave to a workflow function or a branch, not nil or zero, and not used from inside
// the body of one of its steps. A step's body gets a plain context.Context; a durable
// call made from it with the workflow's Context would be recorded under keys that
// depend on whether the body ran, so it is refused and records nothing.
func (c *Context) usable(call, name string) error {
	if c == nil || c.x == nil || c.sc == nil {
		return invalidArgument("%s %q: nil or zero *kagzi.Context; use the one the workflow function (or branch) was given", call, name)
	}
	if step := c.sc.inStep.Load(); step != nil {
		return fmt.Errorf("%w: %w: %s %q called with the workflow's Context from inside the body of step %s; "+
			"durable calls belong to the workflow function, between steps", ErrInvalidArgument, ErrInsideStep, call, name, *step)
	}
	return nil
}

// RunID returns the id of the run being executed.
func (c *Context) RunID() string {
	if c == nil || c.x == nil {
		return ""
	}
	return c.x.run.RunID.String()
}

// WorkflowID returns the run's workflow id, its idempotency key.
func (c *Context) WorkflowID() string {
	if c == nil || c.x == nil {
		return ""
	}
	return c.x.run.WorkflowID
}

// WorkflowType returns the name the workflow was defined with.
func (c *Context) WorkflowType() string {
	if c == nil || c.x == nil {
		return ""
	}
	return c.x.run.WorkflowType
}

// Attempt returns the execution attempt of the whole workflow, 1 for the first.
// Resuming after a sleep or a crash is not a new attempt.
func (c *Context) Attempt() int {
	if c == nil || c.x == nil {
		return 0
	}
	return c.x.run.Attempt
}

// Logger returns a logger that tags every record with the run's ids (slog.Default
// for a nil or zero Context).
func (c *Context) Logger() *slog.Logger {
	if c == nil || c.x == nil {
		return slog.Default()
	}
	return c.x.log()
}

// Sleep pauses the run durably for d. The wake time is fixed and recorded the first
// time the sleep runs: a crash or a restart during the sleep does not restart the
// clock, and a replay after the wake time does not sleep again.
//
// A sleep no longer than the worker's MaxInProcessSleep waits in process, holding
// its slot. A longer one releases the run: it becomes SLEEPING, holds no slot and no
// goroutine, and a worker resumes it at its wake time by calling the workflow
// function again from the top. The call then does not return: the workflow's
// goroutine unwinds (deferred calls run) and the rest of the function runs when the
// run resumes. Sleep returns an error only for an invalid name or duration, before
// anything is recorded.
func (c *Context) Sleep(name string, d time.Duration) error {
	if d < 0 {
		return invalidArgument("sleep %q: negative duration %v", name, d)
	}
	return c.sleep(name, nil, d)
}

// SleepUntil is Sleep until the time t.
func (c *Context) SleepUntil(name string, t time.Time) error {
	return c.sleep(name, &t, 0)
}

func (c *Context) sleep(name string, until *time.Time, d time.Duration) error {
	key, pos, err := c.nextKey(name, KindSleep)
	if err != nil {
		return err
	}
	x := c.x
	c.checkAlive()
	threshold := x.w.cfg.MaxInProcessSleep
	if !c.canSuspend() {
		threshold = time.Duration(1<<63 - 1) // branches run on: wait in process
	}
	if rec, ok := x.step(key); ok && rec.WakeAt != nil {
		remaining := rec.WakeAt.Sub(x.dbNow())
		switch {
		case remaining <= 0:
			return nil
		case remaining <= threshold:
			c.waitInProcess(remaining)
			return nil
		}
		wake := *rec.WakeAt
		c.suspend(store.SleepWrite{RunID: x.run.RunID, Epoch: x.run.LeaseEpoch, WakeAt: &wake})
		return nil // not reached
	}
	remaining := d
	if until != nil {
		remaining = until.Sub(x.dbNow())
	}
	w := store.SleepWrite{RunID: x.run.RunID, Epoch: x.run.LeaseEpoch, Key: key, Name: name, Position: pos,
		WakeAt: until, Duration: d}
	c.hookSleep(key, name, remaining, remaining > threshold)
	if remaining > threshold {
		c.suspend(w)
	}
	var wake, dbNow time.Time
	c.write(func(ctx context.Context) (err error) {
		wake, dbNow, err = store.RecordSleep(ctx, x.w.db, w)
		return err
	})
	x.setStep(key, store.StepRecord{Kind: KindSleep, Status: StepCompleted, WakeAt: &wake})
	if remaining := wake.Sub(dbNow); remaining > 0 {
		c.waitInProcess(remaining)
	}
	return nil
}

// kindCall names the call that asks for a key of the kind, for errors.
func kindCall(kind StepKind) string {
	switch kind {
	case KindSleep:
		return "Sleep"
	case KindSignal:
		return "WaitSignal"
	case KindEvent:
		return "SetEvent"
	case KindChild:
		return "StartChild"
	case kindBranch:
		return "Go/Map"
	}
	return "Step"
}

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

// execution is one execution of a claimed run on a worker.
type execution struct {
	w      *Worker
	def    *definition
	run    store.ClaimedRun
	cancel context.CancelCauseFunc
	ctx    context.Context
	// goroutines runs the workflow function (the worker's pool when it claimed the run).
	goroutines *gopool.Pool
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
	// while its end is written (guarded by w.mu).
	finishing bool

	// pending is the run's last completed step while its record is held back (see
	// holdRecord); flushMu serializes writing it, so that whoever needs it durable
	// waits for it. Both guard pending.
	flushMu sync.Mutex
	pending *store.StepWrite
	// holdTimer writes pending after holdLimit if nothing else has by then.
	holdTimer *time.Timer

	mu   sync.Mutex
	exit exitReason
	// nondeterminism is the detail of the failure when exit is exitNonDeterministic.
	nondeterminism *ErrorDetail
	// positions indexes the recorded steps by scope prefix + "@" + position, and
	// maxPosition holds the highest recorded position of each scope prefix.
	positions   map[string]store.StepRecord
	maxPosition map[string]int
	// stepsMu guards run.Steps, which branches read and write concurrently.
	stepsMu sync.Mutex
}

// log returns the logger that tags every record with the run's ids. It is built on
// first use: a logger with attributes costs a dozen allocations, and most runs never
// log.
func (x *execution) log() *slog.Logger {
	x.loggerOnce.Do(func() {
		x.logger = x.w.logger.With("run_id", x.run.RunID, "workflow_id", x.run.WorkflowID,
			"workflow_type", x.run.WorkflowType)
	})
	return x.logger
}

func (x *execution) dbNow() time.Time { return time.Now().Add(x.dbOffset) }

func (x *execution) step(key string) (store.StepRecord, bool) {
	x.stepsMu.Lock()
	defer x.stepsMu.Unlock()
	rec, ok := x.run.Steps[key]
	return rec, ok
}

func (x *execution) setStep(key string, rec store.StepRecord) {
	x.stepsMu.Lock()
	defer x.stepsMu.Unlock()
	x.run.Steps[key] = rec
}

func (x *execution) exitReason() exitReason {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.exit
}

// nextKey returns the key of the next step (or sleep, or branch...) called name in
// this scope, prefix + name#occurrence, and its position among the scope's calls. When
// the run's history has another step at that position, the code changed under the
// run: the execution stops and the run fails (non-deterministic).
func (c *Context) nextKey(name string, kind StepKind) (key string, pos int, err error) {
	if err := c.usable(kindCall(kind), name); err != nil {
		return "", 0, err
	}
	if err := validName("step name", name); err != nil {
		return "", 0, err
	}
	c.sc.mu.Lock()
	c.sc.counts[name]++
	c.sc.pos++
	key, pos = c.sc.prefix+name+"#"+strconv.Itoa(c.sc.counts[name]), c.sc.pos
	c.sc.mu.Unlock()
	if len(c.x.positions) == 0 { // a fresh run: no history to check against
		return key, pos, nil
	}
	if rec, ok := c.x.positions[c.sc.prefix+"@"+strconv.Itoa(pos)]; ok && (rec.Name != name || rec.Kind != kind) {
		c.x.mu.Lock()
		c.x.nondeterminism = &ErrorDetail{Code: CodeNonDeterministic, NonRetryable: true, Subject: key,
			Message: fmt.Sprintf("run %s is not deterministic: at position %d of scope %q its history has step %q (%s), "+
				"but the code now asks for %q (%s)", c.x.run.RunID, pos, strings.TrimSuffix(c.sc.prefix, "/"),
				rec.Name, rec.Kind, name, kind)}
		c.x.mu.Unlock()
		c.stop(exitNonDeterministic)
	}
	return key, pos, nil
}

// indexPositions builds positions and maxPosition from the claimed steps.
func (x *execution) indexPositions() {
	x.positions, x.maxPosition = map[string]store.StepRecord{}, map[string]int{}
	for key, rec := range x.run.Steps {
		if rec.Position == nil {
			continue
		}
		base := key[:strings.LastIndexByte(key, '#')]
		prefix := strings.TrimSuffix(base, rec.Name)
		x.positions[prefix+"@"+strconv.Itoa(*rec.Position)] = rec
		x.maxPosition[prefix] = max(x.maxPosition[prefix], *rec.Position)
	}
}

// Patched reports whether this run reached this point under code that has the
// change changeID: true for a run executing it for the first time, false for a run
// whose history already went past this point under older code. The answer is
// recorded, so every replay gets the same one. Use it to change a workflow without
// breaking runs in flight:
//
//	if ctx.Patched("charge-before-reserve") {
//		// new order of steps
//	} else {
//		// the old order, for runs that started before the deploy
//	}
//
// Patched takes no position among the workflow's calls, so adding it does not shift
// the steps recorded after it.
func (c *Context) Patched(changeID string) bool {
	if err := c.usable("Patched", changeID); err != nil {
		c.Logger().Error("kagzi: Patched answers false and records nothing", "error", err)
		return false
	}
	if err := validName("change id", changeID); err != nil {
		c.x.log().Error("kagzi: invalid change id; Patched answers false", "error", err)
		return false
	}
	c.sc.mu.Lock()
	c.sc.counts["\x00patch:"+changeID]++
	key := c.sc.prefix + changeID + "#patch" + strconv.Itoa(c.sc.counts["\x00patch:"+changeID])
	replaying := c.x.maxPosition[c.sc.prefix] > c.sc.pos
	c.sc.mu.Unlock()
	c.checkAlive()
	x := c.x
	if rec, ok := x.step(key); ok {
		return string(rec.Output) == "true"
	}
	answer := []byte("true")
	if replaying {
		answer = []byte("false")
	}
	c.write(func(ctx context.Context) error {
		return store.RecordResultStep(ctx, x.w.client.pool, x.run.RunID, x.run.LeaseEpoch, key, changeID,
			KindPatch, StepCompleted, nil, answer, nil)
	})
	x.setStep(key, store.StepRecord{Name: changeID, Kind: KindPatch, Status: StepCompleted, Output: answer})
	return !replaying
}

// canSuspend reports whether the run may be released here: only from the workflow
// function's own goroutine, and only while no branch runs.
func (c *Context) canSuspend() bool {
	return !c.sc.branch && c.x.branches.Load() == 0
}

// errBranchCancelled ends a branch whose sibling failed (Map, fail-fast).
var errBranchCancelled = errors.New("kagzi: branch cancelled: a sibling failed")

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
	runtime.Goexit()
}

// checkAlive stops the execution if the run's context was cancelled, and the branch
// if only its own context was (its Future reports errBranchCancelled).
func (c *Context) checkAlive() {
	if c.x.ctx.Err() != nil {
		c.stop(reasonFor(context.Cause(c.x.ctx)))
	}
	if c.Err() != nil {
		runtime.Goexit()
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
	err := x.writeNow(func(ctx context.Context) (err error) {
		cancelRequested, err = store.RenewLease(ctx, x.w.client.pool, x.run.RunID, x.run.LeaseEpoch, x.w.cfg.LeaseDuration)
		return err
	})
	if err != nil {
		if !errors.Is(err, errLeaseLost) {
			x.log().Warn("kagzi: cannot renew a lease that passed; the run is left to another worker", "error", err)
		}
		c.stop(exitLeaseLost)
	}
	x.extendLease(sent, x.w.cfg.LeaseDuration)
	if cancelRequested {
		x.cancel(ErrCancelled)
		c.checkAlive()
	}
}

// reasonFor maps the cause of the run context's cancellation to an exit reason.
func reasonFor(cause error) exitReason {
	switch {
	case errors.Is(cause, errLeaseLost):
		return exitLeaseLost
	case errors.Is(cause, errShutdown):
		return exitShutdown
	case errors.Is(cause, errRunDeadline):
		return exitDeadline
	case errors.Is(cause, errRecoveryExhausted):
		return exitRecoveryExhausted
	default:
		return exitCancelled
	}
}

func (c *Context) waitInProcess(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-c.Done():
		c.checkAlive()
	}
}

// suspend puts the run to sleep in the database and stops the execution.
func (c *Context) suspend(w store.SleepWrite) {
	c.write(func(ctx context.Context) error {
		_, err := store.Suspend(ctx, c.x.w.db, w)
		return err
	})
	c.stop(exitSuspended)
}

// write is execution.write for workflow code: when the lease is lost it stops the
// execution instead of returning.
func (c *Context) write(op func(context.Context) error) error {
	err := c.x.write(op)
	if errors.Is(err, errLeaseLost) {
		c.stop(exitLeaseLost)
	}
	return err
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

// flushLate writes the held-back record when it was held for holdLimit. On failure
// it leaves the record pending: the next flush writes it again and reports the error.
func (x *execution) flushLate() {
	x.flushMu.Lock()
	defer x.flushMu.Unlock()
	p := x.pending
	if p == nil {
		return
	}
	err := x.writeNow(func(ctx context.Context) error {
		_, err := store.RecordStep(ctx, x.w.db, *p)
		return err
	})
	if err == nil || errors.Is(err, store.ErrStepRecorded) {
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
	err := x.writeNow(func(ctx context.Context) error {
		_, err := store.RecordStep(ctx, x.w.db, *p)
		return err
	})
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

// write runs a fenced store write after the held-back step record (see
// holdRecord); see writeNow.
func (x *execution) write(op func(context.Context) error) error {
	if err := x.flush(); err != nil {
		return err
	}
	return x.writeNow(op)
}

// writeNow runs a fenced store write, retrying transient failures (a lost connection,
// a restarting database) with backoff while the lease lasts. It returns errLeaseLost
// when the lease was lost, or ran out before the write succeeded (another worker
// will take the run over), and the other errors (such as ErrStepRecorded or data
// the database rejects) as they are.
func (x *execution) writeNow(op func(context.Context) error) error {
	backoff := 50 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), x.w.cfg.LeaseDuration)
		err := op(ctx)
		cancel()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, store.ErrLeaseLost):
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

// transient reports whether a failed statement may succeed if tried again.
func transient(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return true // no answer from the server: connection lost, timeout
	}
	switch pgErr.Code[:2] {
	case "08", "40", "53", "57", "58": // connection, rollback, resources, shutdown, system
		return true
	}
	return false
}
