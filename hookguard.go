package kagzi

import (
	"context"
	"log/slog"
	"runtime/debug"
	"sync/atomic"
	"time"
)

// guardedHook calls one of the client's Hooks and recovers its panics: a hook is
// telemetry, and its bug must neither fail the run it observes (a panic in StepBegin
// ran on the workflow's goroutine and failed the run as the workflow's own panic) nor
// end the process (one in ExecutionBegin, on a worker goroutine, did). Each hook of a
// MultiHooks is guarded on its own, so that the others (a tracer's spans, kagzitest's
// stubs) go on. A Begin that panicked returns the context it was given, marked, and
// the matching End of that hook is skipped: it would end what its Begin did not
// begin. A panic is logged at Error with its stack, at most once every 10 s for each
// method of a hook.
type guardedHook struct {
	h      Hooks
	logger *slog.Logger
	// Per method (see hookMethods): when its last panic was logged (unix nanoseconds),
	// and how many were not logged since.
	lastLog  [len(hookMethods)]atomic.Int64
	withheld [len(hookMethods)]atomic.Int64
}

// hookMethods names the methods of Hooks, by their index in guardedHook's counters.
var hookMethods = [...]string{"StartBegin", "StartEnd", "ExecutionBegin", "ExecutionEnd", "StepBegin", "StepEnd",
	"Sleep", "Signal", "Claim"}

const (
	mStartBegin = iota
	mStartEnd
	mExecutionBegin
	mExecutionEnd
	mStepBegin
	mStepEnd
	mSleep
	mSignal
	mClaim
)

// beganNothing marks the context a guarded hook's panicking Begin returned, for the
// End of that Begin's method (m) only: the contexts of the run carry it into the Begin
// and End pairs nested in the execution (its steps, its children's starts), which
// are ended as they began.
type beganNothing struct {
	g *guardedHook
	m int
}

// guardHooks returns h with each of its hooks guarded (nil: none).
func guardHooks(h Hooks, logger *slog.Logger) Hooks {
	switch h := h.(type) {
	case nil:
		return nil
	case multiHooks:
		out := make(multiHooks, len(h))
		for i, e := range h {
			out[i] = guardHooks(e, logger)
		}
		return out
	default:
		return &guardedHook{h: h, logger: logger}
	}
}

// recovered logs a hook's panic and reports whether there was one; call it from a
// deferred function.
func (g *guardedHook) recovered(m int, r any) bool {
	if r == nil {
		return false
	}
	now := time.Now().UnixNano()
	if last := g.lastLog[m].Load(); now-last < int64(10*time.Second) || !g.lastLog[m].CompareAndSwap(last, now) {
		g.withheld[m].Add(1)
		return true
	}
	g.logger.Error("kagzi: a hook panicked; the operation goes on without it", "hook", hookMethods[m],
		"panic", r, "stack", string(debug.Stack()), "panics_not_logged_since", g.withheld[m].Swap(0))
	return true
}

// skipped reports whether ctx is marked by a panicking Begin (method m) of this hook.
func (g *guardedHook) skipped(ctx context.Context, m int) bool {
	return ctx != nil && ctx.Value(beganNothing{g, m}) != nil
}

func (g *guardedHook) StartBegin(ctx context.Context, e *StartEvent) (out context.Context) {
	defer func() {
		if g.recovered(mStartBegin, recover()) {
			out = context.WithValue(ctx, beganNothing{g, mStartBegin}, true)
		}
	}()
	return g.h.StartBegin(ctx, e)
}

func (g *guardedHook) StartEnd(ctx context.Context, e *StartEvent) {
	if g.skipped(ctx, mStartBegin) {
		return
	}
	defer func() { g.recovered(mStartEnd, recover()) }()
	g.h.StartEnd(ctx, e)
}

func (g *guardedHook) ExecutionBegin(ctx context.Context, e *ExecutionEvent) (out context.Context) {
	defer func() {
		if g.recovered(mExecutionBegin, recover()) {
			out = context.WithValue(ctx, beganNothing{g, mExecutionBegin}, true)
		}
	}()
	return g.h.ExecutionBegin(ctx, e)
}

func (g *guardedHook) ExecutionEnd(ctx context.Context, e *ExecutionEvent) {
	if g.skipped(ctx, mExecutionBegin) {
		return
	}
	defer func() { g.recovered(mExecutionEnd, recover()) }()
	g.h.ExecutionEnd(ctx, e)
}

func (g *guardedHook) StepBegin(ctx context.Context, e *StepEvent) (out context.Context) {
	defer func() {
		if g.recovered(mStepBegin, recover()) {
			out = context.WithValue(ctx, beganNothing{g, mStepBegin}, true)
		}
	}()
	return g.h.StepBegin(ctx, e)
}

func (g *guardedHook) StepEnd(ctx context.Context, e *StepEvent) {
	if g.skipped(ctx, mStepBegin) {
		return
	}
	defer func() { g.recovered(mStepEnd, recover()) }()
	g.h.StepEnd(ctx, e)
}

func (g *guardedHook) Sleep(ctx context.Context, e *SleepEvent) {
	defer func() { g.recovered(mSleep, recover()) }()
	g.h.Sleep(ctx, e)
}

func (g *guardedHook) Signal(ctx context.Context, e *SignalEvent) {
	defer func() { g.recovered(mSignal, recover()) }()
	g.h.Signal(ctx, e)
}

func (g *guardedHook) Claim(ctx context.Context, e *ClaimEvent) {
	defer func() { g.recovered(mClaim, recover()) }()
	g.h.Claim(ctx, e)
}
