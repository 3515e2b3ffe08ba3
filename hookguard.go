package kagzi

import (
	"context"
	"log/slog"
	"runtime/debug"
)

// guardedHooks calls the client's Hooks and recovers their panics: a hook is
// telemetry, and its bug must neither fail the run it observes (a panic in StepBegin
// ran on the workflow's goroutine and failed the run as the workflow's own panic) nor
// end the process (one in ExecutionBegin, on a worker goroutine, did). A panic is
// logged at Error with its stack, and the operation goes on with the context the hook
// was given.
type guardedHooks struct {
	h      Hooks
	logger *slog.Logger
}

// guardHooks returns h guarded (nil: none).
func guardHooks(h Hooks, logger *slog.Logger) Hooks {
	if h == nil {
		return nil
	}
	return guardedHooks{h: h, logger: logger}
}

// recovered logs a hook's panic; call it deferred.
func (g guardedHooks) recovered(method string) {
	if r := recover(); r != nil {
		g.logger.Error("kagzi: a hook panicked; the operation goes on without it", "hook", method,
			"panic", r, "stack", string(debug.Stack()))
	}
}

func (g guardedHooks) StartBegin(ctx context.Context, e *StartEvent) (out context.Context) {
	out = ctx
	defer g.recovered("StartBegin")
	return g.h.StartBegin(ctx, e)
}

func (g guardedHooks) StartEnd(ctx context.Context, e *StartEvent) {
	defer g.recovered("StartEnd")
	g.h.StartEnd(ctx, e)
}

func (g guardedHooks) ExecutionBegin(ctx context.Context, e *ExecutionEvent) (out context.Context) {
	out = ctx
	defer g.recovered("ExecutionBegin")
	return g.h.ExecutionBegin(ctx, e)
}

func (g guardedHooks) ExecutionEnd(ctx context.Context, e *ExecutionEvent) {
	defer g.recovered("ExecutionEnd")
	g.h.ExecutionEnd(ctx, e)
}

func (g guardedHooks) StepBegin(ctx context.Context, e *StepEvent) (out context.Context) {
	out = ctx
	defer g.recovered("StepBegin")
	return g.h.StepBegin(ctx, e)
}

func (g guardedHooks) StepEnd(ctx context.Context, e *StepEvent) {
	defer g.recovered("StepEnd")
	g.h.StepEnd(ctx, e)
}

func (g guardedHooks) Sleep(ctx context.Context, e *SleepEvent) {
	defer g.recovered("Sleep")
	g.h.Sleep(ctx, e)
}

func (g guardedHooks) Signal(ctx context.Context, e *SignalEvent) {
	defer g.recovered("Signal")
	g.h.Signal(ctx, e)
}

func (g guardedHooks) Claim(ctx context.Context, e *ClaimEvent) {
	defer g.recovered("Claim")
	g.h.Claim(ctx, e)
}
