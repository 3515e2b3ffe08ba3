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
	retry   Retry
}

// WithStepTimeout bounds each attempt of the step: its context is cancelled after d,
// and the attempt is recorded TIMED_OUT (code DEADLINE_EXCEEDED); the retry policy
// then applies. A step function that ignores its context is still reported timed out
// at the deadline: its goroutine is abandoned (counted by Worker.AbandonedSteps and
// logged) and its late result discarded. (WithRunTimeout bounds a whole run.)
func WithStepTimeout(d time.Duration) StepOption { return func(o *stepOptions) { o.timeout = d } }

// WithTimeout is WithStepTimeout.
//
// Deprecated: use WithStepTimeout, which says what it bounds beside WithRunTimeout.
func WithTimeout(d time.Duration) StepOption { return WithStepTimeout(d) }

// WithRetry sets the step's retry policy, overriding the workflow's, the worker's and
// the library's default (in that order of precedence).
func WithRetry(r Retry) StepOption { return func(o *stepOptions) { o.retry = r } }

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
// When fn returns an error (or panics, or times out), the attempt is recorded and the
// retry policy decides: another attempt after a backoff, or failure. A backoff up to
// the worker's MaxInProcessSleep waits in process; a longer one releases the run
// (PENDING until the next attempt is due, no slot held) and unwinds the workflow
// goroutine like a long Sleep. When the step fails for good, Step returns a
// *StepError built from the recorded detail, and so does every replay of the run.
//
// When the run's context is cancelled while fn runs (the run was cancelled or passed
// its deadline, its lease was lost, the worker is shutting down), the attempt is not
// recorded and Step does not return: the workflow goroutine unwinds, see Context.
func Step[T any](ctx *Context, name string, fn func(context.Context) (T, error), opts ...StepOption) (T, error) {
	var zero T
	if err := ctx.usable("Step", name); err != nil {
		return zero, err
	}
	if fn == nil {
		return zero, invalidArgument("step %q: nil function", name)
	}
	x := ctx.x
	key, pos, err := ctx.nextKey(name, KindStep)
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
	policy := o.retry.or(x.def.retry).or(x.rt.cfg.DefaultRetry).or(DefaultRetry)
	if err := policy.Err(); err != nil {
		return zero, fmt.Errorf("step %q: %w", name, err)
	}
	ctx.checkAlive()
	attempts := 0
	if rec, ok := x.hist.get(key); ok {
		switch rec.Status {
		case StepCompleted:
			return decodeStepOutput[T](x, key, rec.Output)
		case StepFailed:
			return zero, stepError(key, rec)
		case StepRetrying:
			attempts = rec.Attempts // the backoff was served while the run waited
		}
	}

	// The body may depend on what the previous step returned: that must be durable
	// before the body runs (see holdRecord).
	if err := ctx.flush(); err != nil {
		return zero, err
	}
	for {
		attempts++
		ctx.ensureLease() // a frozen worker must not run a body another worker recorded
		started := time.Now()
		att := ctx.beginAttempt(key, name, attempts)
		ctx.sc.inStep.Store(&key)
		res := callStep(att.ctx, stepBody(att, fn), o.timeout)
		ctx.sc.inStep.Store(nil)
		att.end(res.err, res.timedOut)
		finished := time.Now()
		if res.abandoned {
			n := x.rt.abandoned.Add(1)
			x.log().Warn("kagzi: step ignored its timeout; its goroutine is abandoned",
				"step", key, "timeout", o.timeout, "abandoned_total", n)
		}
		if ctx.Err() != nil {
			// Interrupted, not failed: the attempt does not count.
			ctx.checkAlive()
		}
		w := store.StepWrite{Fence: x.run.Fence, Key: key, Name: name, Position: pos,
			StartedAt: started, FinishedAt: finished}
		fnErr := res.err
		if fnErr == nil {
			b, err := json.Marshal(res.out)
			var codecErr error
			if err == nil {
				b, codecErr = x.rt.payloads.encode(b)
			}
			switch {
			case err != nil:
				fnErr = NonRetryable(fmt.Errorf("output of step %s (%s) does not encode as JSON: %w", key, typeName[T](), err))
			case codecErr != nil:
				fnErr = NonRetryable(fmt.Errorf("output of step %s: %w", key, codecErr))
			case len(b) > x.rt.payloads.maxBytes:
				fnErr = NonRetryable(fmt.Errorf("output of step %s is %d bytes, over the limit of %d", key, len(b), x.rt.payloads.maxBytes))
			default:
				w.Output = b
			}
		}
		if fnErr == nil {
			w.Status, w.StepStatus = StepCompleted, StepCompleted
			if ctx.holdRecord(w) {
				x.hist.set(key, store.StepRecord{Kind: KindStep, Status: StepCompleted, Output: w.Output, Attempts: attempts})
				return res.out, nil
			}
			stored, err := ctx.recordStep(w)
			if err != nil {
				return zero, err
			}
			if stored != nil { // recorded before by this run: the recorded output wins
				return decodeStepOutput[T](x, key, stored)
			}
			x.hist.set(key, store.StepRecord{Kind: KindStep, Status: StepCompleted, Output: w.Output, Attempts: attempts})
			return res.out, nil
		}

		d := stepDetail(fnErr, res.timedOut, key)
		w.Status = StepFailed
		if res.timedOut {
			w.Status = StepTimedOut
		}
		delay, retry := policy.next(attempts, &d)
		w.Error = encodeDetail(d)
		if !retry {
			w.StepStatus = StepFailed
			if _, err := ctx.recordStep(w); err != nil {
				return zero, err
			}
			rec := store.StepRecord{Kind: KindStep, Status: StepFailed, Error: w.Error, Attempts: attempts}
			x.hist.set(key, rec)
			return zero, stepError(key, rec)
		}
		w.StepStatus = StepRetrying
		if delay > x.rt.cfg.MaxInProcessSleep && ctx.canSuspend() {
			w.RetryIn = &delay
			if _, err := ctx.recordStep(w); err != nil {
				return zero, err
			}
			ctx.stop(exitSuspended)
		}
		if _, err := ctx.recordStep(w); err != nil {
			return zero, err
		}
		x.log().Debug("kagzi: step attempt failed; retrying", "step", key, "attempt", attempts, "retry_in", delay)
		ctx.waitInProcess(delay)
	}
}

// recordStep writes a step attempt. When the step already has a recorded output, it
// returns that output. An error means the database rejected the record itself (for
// example a string with a NUL byte, which jsonb cannot hold): the step cannot be
// recorded, ever, and the error is non-retryable.
func (c *Context) recordStep(w store.StepWrite) (stored []byte, err error) {
	x := c.x
	err = c.write(func(ctx context.Context, db *writer) error {
		_, err := db.recordStep(ctx, w)
		return err
	})
	if errors.Is(err, store.ErrStepRecorded) {
		err = c.write(func(ctx context.Context, db *writer) (err error) {
			stored, err = db.stepOutput(ctx, x.run.RunID, w.Key)
			return err
		})
		if err == nil {
			return stored, nil
		}
	}
	if err != nil {
		return nil, NonRetryable(fmt.Errorf("kagzi: step %s of run %s cannot be recorded: %w", w.Key, x.run.RunID, err))
	}
	return nil, nil
}

func stepError(key string, rec store.StepRecord) *StepError {
	e := &StepError{Key: key, Attempts: rec.Attempts}
	if d := decodeDetail(rec.Error); d != nil {
		e.Detail = *d
	}
	return e
}

func decodeStepOutput[T any](x *execution, key string, b []byte) (T, error) {
	var out T
	if err := x.rt.payloads.unmarshalPayload(b, &out); err != nil {
		return out, NonRetryable(fmt.Errorf("kagzi: recorded output of step %s of run %s does not decode into %s: %w",
			key, x.run.RunID, typeName[T](), err))
	}
	return out, nil
}

// callStep runs fn, turning a panic into an error. With a timeout, fn runs in its own
// goroutine with a context that ends at the deadline, and callStep returns at the
// deadline even if fn ignores it (abandoned); fn's late result is then discarded.
func callStep[T any](ctx context.Context, fn func(context.Context) (T, error), timeout time.Duration) (res struct {
	out       T
	err       error
	timedOut  bool
	abandoned bool
}) {
	call := func(ctx context.Context) (out T, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = &panicError{value: r, stack: string(debug.Stack())}
			}
		}()
		return fn(ctx)
	}
	if timeout == 0 {
		res.out, res.err = call(ctx)
		return res
	}
	sctx, cancel := context.WithTimeoutCause(ctx, timeout, ErrDeadlineExceeded)
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
		res.out, res.err = r.out, r.err
		if r.err != nil && ctx.Err() == nil && errors.Is(context.Cause(sctx), ErrDeadlineExceeded) {
			res.err, res.timedOut = fmt.Errorf("step timed out after %v: %w", timeout, r.err), true
		}
	case <-sctx.Done():
		if ctx.Err() != nil {
			res.err = ctx.Err()
			return res
		}
		// Give fn a moment to notice its context; past that, abandon it.
		select {
		case r := <-done:
			res.out, res.err = r.out, r.err
			if r.err == nil {
				var zero T
				res.out, res.err = zero, fmt.Errorf("step timed out after %v: %w", timeout, ErrDeadlineExceeded)
			}
		case <-time.After(10 * time.Millisecond):
			res.err, res.abandoned = fmt.Errorf("step timed out after %v (and ignored it): %w", timeout, ErrDeadlineExceeded), true
		}
		res.timedOut = true
	}
	return res
}
