package kagzi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/kagzi/kagzi/internal/store"
)

// StepOption configures one call of Step.
type StepOption func(*stepOptions)

type stepOptions struct {
	timeout time.Duration
}

// WithTimeout bounds one attempt of the step: its context is cancelled after d, and
// the attempt is recorded TIMED_OUT. A step function that ignores its context is
// still reported timed out at the deadline; its late result is discarded.
func WithTimeout(d time.Duration) StepOption { return func(o *stepOptions) { o.timeout = d } }

// Step runs fn as a memoized step of the workflow and returns its output.
//
// The first time the run reaches the step, fn runs and its output is recorded
// (JSON-encoded) in one write, fenced by the run's lease. When the run is resumed
// later (after a sleep, a crash, a restart) and reaches the step again, Step returns
// the recorded output without calling fn and without a database round trip.
//
// Names may repeat: the key of a step is its name plus its occurrence in the run
// ("send#1", "send#2"), so steps in loops work as long as the workflow calls them in
// the same order every time.
//
// When fn returns an error, the failed attempt is recorded and Step returns the
// error. When the run's context is cancelled while fn runs (the run was cancelled,
// its lease was lost, the worker is shutting down), the attempt is not recorded and
// Step does not return: the workflow goroutine unwinds, see Context.
func Step[T any](ctx *Context, name string, fn func(context.Context) (T, error), opts ...StepOption) (T, error) {
	var zero T
	if ctx == nil || ctx.x == nil {
		return zero, invalidArgument("step %q: nil or foreign context", name)
	}
	if fn == nil {
		return zero, invalidArgument("step %q: nil function", name)
	}
	x := ctx.x
	key, err := x.nextKey(name)
	if err != nil {
		return zero, err
	}
	var o stepOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.timeout < 0 {
		return zero, invalidArgument("step %q: negative timeout %v", name, o.timeout)
	}
	x.checkAlive()
	if rec, ok := x.run.Steps[key]; ok && rec.Status == string(StepCompleted) {
		return decodeStepOutput[T](x, key, rec.Output)
	}

	started := time.Now()
	out, fnErr, timedOut := callStep(x.ctx, fn, o.timeout)
	finished := time.Now()
	if x.ctx.Err() != nil {
		// Interrupted, not failed: the attempt does not count.
		x.stop(reasonFor(context.Cause(x.ctx)))
	}

	w := store.StepWrite{RunID: x.run.RunID, Epoch: x.run.LeaseEpoch, Key: key, Name: name,
		StartedAt: started, FinishedAt: finished, Status: string(StepCompleted)}
	if fnErr == nil {
		b, err := json.Marshal(out)
		switch {
		case err != nil:
			fnErr = NonRetryable(fmt.Errorf("output of step %s (%s) does not encode as JSON: %w", key, typeName[T](), err))
		case len(b) > x.w.client.maxBytes:
			fnErr = NonRetryable(fmt.Errorf("output of step %s is %d bytes, over the limit of %d", key, len(b), x.w.client.maxBytes))
		default:
			w.Output = b
		}
	}
	if fnErr != nil {
		code := CodeStepError
		var pe *panicError
		switch {
		case timedOut:
			code, w.Status = CodeDeadlineExceeded, string(StepTimedOut)
		case errors.As(fnErr, &pe):
			code = CodePanic
		}
		if w.Status == string(StepCompleted) {
			w.Status = string(StepFailed)
		}
		d := errorOf(fnErr, code, key)
		if pe != nil {
			d.Metadata = map[string]string{"stack": pe.stack}
		}
		w.Output, w.Error = nil, encodeDetail(d)
	}

	err = x.write(func(ctx context.Context) error {
		_, err := store.RecordStep(ctx, x.w.client.pool, w)
		return err
	})
	switch {
	case errors.Is(err, store.ErrStepRecorded):
		// Recorded before by this run: the recorded output wins.
		var stored []byte
		err = x.write(func(ctx context.Context) (err error) {
			stored, err = store.GetStepOutput(ctx, x.w.client.pool, x.run.RunID, key)
			return err
		})
		if err == nil {
			return decodeStepOutput[T](x, key, stored)
		}
	case err == nil && fnErr == nil:
		x.run.Steps[key] = store.StepRecord{Kind: string(KindStep), Status: string(StepCompleted), Output: w.Output}
		return out, nil
	case err == nil:
		return zero, fnErr
	}
	// The database rejected the record itself (for example a string with a NUL
	// byte, which jsonb cannot hold): the step cannot be recorded, ever.
	return zero, NonRetryable(fmt.Errorf("kagzi: step %s of run %s cannot be recorded: %w", key, x.run.RunID, err))
}

func decodeStepOutput[T any](x *execution, key string, b []byte) (T, error) {
	var out T
	if err := json.Unmarshal(b, &out); err != nil {
		return out, NonRetryable(fmt.Errorf("kagzi: recorded output of step %s of run %s does not decode into %s: %w",
			key, x.run.RunID, typeName[T](), err))
	}
	return out, nil
}

// panicError is a recovered panic with its stack.
type panicError struct {
	value any
	stack string
}

func (e *panicError) Error() string { return fmt.Sprintf("panic: %v", e.value) }

// callStep runs fn, turning a panic into an error. With a timeout, fn runs in its own
// goroutine with a context that ends at the deadline, and callStep returns at the
// deadline even if fn ignores it; fn's late result is then discarded.
func callStep[T any](ctx context.Context, fn func(context.Context) (T, error), timeout time.Duration) (out T, err error, timedOut bool) {
	call := func(ctx context.Context) (out T, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = &panicError{value: r, stack: string(debug.Stack())}
			}
		}()
		return fn(ctx)
	}
	if timeout == 0 {
		out, err = call(ctx)
		return out, err, false
	}
	sctx, cancel := context.WithTimeoutCause(ctx, timeout, context.DeadlineExceeded)
	defer cancel()
	type result struct {
		out T
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := call(sctx)
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		if r.err != nil && errors.Is(context.Cause(sctx), context.DeadlineExceeded) && ctx.Err() == nil {
			return r.out, fmt.Errorf("step timed out after %v: %w", timeout, r.err), true
		}
		return r.out, r.err, false
	case <-sctx.Done():
		if ctx.Err() != nil {
			var zero T
			return zero, ctx.Err(), false
		}
		var zero T
		return zero, fmt.Errorf("step timed out after %v: %w", timeout, context.DeadlineExceeded), true
	}
}
