package kagzi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kagzi/kagzi/internal/store"
)

// Context is the context a workflow function runs with. It is a context.Context,
// cancelled when the run is cancelled or passes its deadline, when this worker loses
// the run's lease, or when the worker shuts down (context.Cause tells which); and it
// carries the run's identity, a logger, and the durable Sleep.
//
// A Context belongs to one execution of one run: use it only from the goroutine it
// was given to (the workflow function's, or a branch's, see Go), and do not keep it
// after that function returns: a durable call made with it then is ErrInvalidArgument.
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
	// parent is the scope a branch was started from, at the position at of its calls
	// (nil for the root): a branch's history went past a point when its parent's did
	// past the branch's start (see nextPatch).
	parent *scope
	at     int
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
	// ended: the scope's function (the workflow function or the branch) returned or
	// unwound; its Context is no longer usable.
	ended atomic.Bool
}

// usable checks that call (Step, Sleep, ...) may be made with c: a Context the worker
// gave to a workflow function or a branch, not nil or zero, whose function has not
// returned, and not used from inside the body of one of its steps. A step's body gets a
// plain context.Context; a durable call made from it with the workflow's Context would
// be recorded under keys that depend on whether the body ran, so it is refused and
// records nothing.
func (c *Context) usable(call, name string) error {
	if c == nil || c.x == nil || c.sc == nil {
		return invalidArgument("%s %q: nil or zero *kagzi.Context; use the one the workflow function (or branch) was given", call, name)
	}
	if c.sc.ended.Load() {
		return invalidArgument("%s %q: the Context's workflow function (or branch) has returned; "+
			"a Context must not be kept after it", call, name)
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

// SleepUntil is Sleep until the time t, at the latest the end of year 9999 (later
// is ErrInvalidArgument: PostgreSQL's timestamps end in year 294276, and a wake time
// centuries away is a mistake).
func (c *Context) SleepUntil(name string, t time.Time) error {
	if t.After(maxWakeTime) {
		return invalidArgument("sleep %q: wake time %v is after %v", name, t, maxWakeTime)
	}
	return c.sleep(name, &t, 0)
}

// maxWakeTime is the latest wake time of SleepUntil.
var maxWakeTime = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)

func (c *Context) sleep(name string, until *time.Time, d time.Duration) error {
	key, pos, err := c.nextKey(name, KindSleep)
	if err != nil {
		return err
	}
	x := c.x
	c.checkAlive()
	threshold := x.rt.cfg.MaxInProcessSleep
	if !c.canSuspend() {
		threshold = time.Duration(1<<63 - 1) // branches run on: wait in process
	}
	if rec, ok := x.hist.get(key); ok && rec.WakeAt != nil {
		remaining := rec.WakeAt.Sub(x.dbNow())
		switch {
		case remaining <= 0:
			return nil
		case remaining <= threshold:
			c.waitInProcess(remaining)
			return nil
		}
		wake := *rec.WakeAt
		return c.suspend(store.SleepWrite{Fence: x.run.Fence, WakeAt: &wake})
	}
	remaining := d
	if until != nil {
		remaining = until.Sub(x.dbNow())
	}
	w := store.SleepWrite{Fence: x.run.Fence, Key: key, Name: name, Position: pos, WakeAt: until, Duration: d}
	c.hookSleep(key, name, remaining, remaining > threshold)
	if remaining > threshold {
		return c.suspend(w)
	}
	var wake, dbNow time.Time
	if err := c.write(func(ctx context.Context, db *writer) (err error) {
		wake, dbNow, err = db.recordSleep(ctx, w)
		return err
	}); err != nil {
		return err
	}
	x.hist.set(key, store.StepRecord{Kind: KindSleep, Status: StepCompleted, WakeAt: &wake})
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
	case KindAttributes:
		return "SetAttributes"
	case KindChild:
		return "StartChild"
	case kindBranch:
		return "Go/Map"
	}
	return "Step"
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
	if strings.ContainsRune(name, '#') {
		// '#' ends a name in its key (name#occurrence, and a branch's steps are
		// branch#n/name#m): a name with one could spell another scope's key and
		// replay that step's output.
		return "", 0, invalidArgument("%s %q: a step name cannot contain '#'", kindCall(kind), name)
	}
	key, pos = c.sc.next(name)
	if c.x.hist.fresh() { // a fresh run: no history to check against
		return key, pos, nil
	}
	if d := c.x.hist.check(c.sc.prefix, key, pos, name, kind, c.x.run.RunID); d != nil {
		c.x.mu.Lock()
		c.x.nondeterminism = d
		c.x.mu.Unlock()
		c.stop(exitNonDeterministic)
	}
	return key, pos, nil
}

// next numbers the scope's next call of name: its key, prefix + name#occurrence, and
// its position among the scope's calls (from 1).
func (sc *scope) next(name string) (key string, pos int) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.counts[name]++
	sc.pos++
	return sc.prefix + name + "#" + strconv.Itoa(sc.counts[name]), sc.pos
}

// nextPatch numbers the scope's next Patched of changeID (which takes no position),
// and tells whether the scope's history goes past the current position.
func (sc *scope) nextPatch(changeID string, h *history) (key string, replaying bool) {
	sc.mu.Lock()
	sc.counts["\x00patch:"+changeID]++
	key, replaying = sc.prefix+changeID+"#patch"+strconv.Itoa(sc.counts["\x00patch:"+changeID]), h.replaying(sc.prefix, sc.pos)
	sc.mu.Unlock()
	// In a branch, the history went past this point too when the scope that started
	// the branch (or one above it) recorded a call after the branch's start: the
	// branch may have run to its end under older code (found from outside: a branch's
	// new step ran on replay and changed a value the run had acted on). Not knowing
	// how far the branch went then, Patched answers false: the older code's path.
	for s := sc; !replaying && s.parent != nil; s = s.parent {
		replaying = h.replaying(s.parent.prefix, s.at)
	}
	return key, replaying
}

// Patched reports whether this run reached this point under code that has the
// change changeID: true for a run executing it for the first time, false for a run
// whose history already went past this point under older code. The answer is
// recorded, so every replay gets the same one, and it is the run's answer for the
// change: a later Patched of the same changeID in the run (guarding another place
// of the same change) answers as the first did. Use it to change a workflow without
// breaking runs in flight:
//
//	if ctx.Patched("charge-before-reserve") {
//		// new order of steps
//	} else {
//		// the old order, for runs that started before the deploy
//	}
//
// In a branch (Go, Map), the history also went past the point when the scope that
// started the branch recorded a call after the branch's start: Patched answers false
// there, since the branch may have run to its end under the older code.
//
// Patched takes no position among the workflow's calls, so adding it does not shift
// the steps recorded after it. An invalid changeID (empty, over 255 bytes, not UTF-8,
// with a control character), or a call on a nil Context, answers false, records
// nothing and logs an error: it cannot return one, so test new patches (kagzitest)
// before you deploy them.
func (c *Context) Patched(changeID string) bool {
	if err := c.usable("Patched", changeID); err != nil {
		c.Logger().Error("kagzi: Patched answers false and records nothing", "error", err)
		return false
	}
	if err := validName("change id", changeID); err != nil {
		c.x.log().Error("kagzi: invalid change id; Patched answers false", "error", err)
		return false
	}
	key, replaying := c.sc.nextPatch(changeID, c.x.hist)
	c.checkAlive()
	x := c.x
	if rec, ok := x.hist.get(key); ok {
		return string(rec.Output) == "true"
	}
	// One answer per change in a run: a later call of the same change, past the
	// history written by older code, answers as the run's first did.
	patched := !replaying
	if earlier, ok := x.hist.patched(changeID); ok {
		patched = earlier
	}
	answer := []byte(strconv.FormatBool(patched))
	c.write(func(ctx context.Context, db *writer) error {
		return db.recordResult(ctx, store.ResultStep{Fence: x.run.Fence, Key: key, Name: changeID,
			Kind: KindPatch, Status: StepCompleted, Output: answer})
	})
	x.hist.set(key, store.StepRecord{Name: changeID, Kind: KindPatch, Status: StepCompleted, Output: answer})
	return patched
}

// canSuspend reports whether the run may be released here: only from the workflow
// function's own goroutine, and only while no branch runs.
func (c *Context) canSuspend() bool {
	return !c.sc.branch && c.x.branches.Load() == 0
}

// errBranchCancelled ends a branch whose sibling failed (Map, fail-fast).
var errBranchCancelled = errors.New("kagzi: branch cancelled: a sibling failed")
