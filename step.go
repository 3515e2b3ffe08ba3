package kagzi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
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
// The first execution gets fn's value as it is, a replay the recorded JSON decoded:
// T must round-trip through the client's codec (encoding/json by default), or the two
// differ (an unexported field kept the first time is zero after a replay).
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
	s, err := ctx.newStepCall(name, fn == nil, opts)
	if err != nil {
		return zero, err
	}
	if rec, ok := s.recorded(); ok {
		if rec.Status == StepCompleted {
			return decodeStepOutput[T](s.x, s.key, rec.Output)
		}
		return zero, stepError(s.key, rec)
	}
	// The body may depend on what the previous step returned: that must be durable
	// before the body runs (see holdRecord).
	if err := ctx.flush(); err != nil {
		return zero, err
	}
	for {
		s.attempts++
		started := time.Now()
		res := runAttempt(s, fn)
		w := store.StepWrite{Fence: s.x.run.Fence, Key: s.key, Name: s.name, Position: s.pos,
			StartedAt: started, FinishedAt: time.Now()}
		fnErr := res.err
		if fnErr == nil {
			w.Output, fnErr = s.encodeOutput(res.out, typeName[T]())
		}
		if fnErr == nil {
			stored, err := s.completed(w)
			switch {
			case err != nil:
				return zero, err
			case stored != nil: // recorded before by this run: the recorded output wins
				return decodeStepOutput[T](s.x, s.key, stored)
			}
			return res.out, nil
		}
		if err := s.failed(w, fnErr, res.timedOut); err != nil {
			return zero, err
		}
	}
}

// stepCall is one call of Step, apart from its type parameter.
type stepCall struct {
	ctx       *Context
	x         *execution
	name, key string
	pos       int
	opts      stepOptions
	policy    Retry
	attempts  int // made so far, recorded ones included
}

// newStepCall checks a call of Step and numbers it.
func (c *Context) newStepCall(name string, nilFn bool, opts []StepOption) (*stepCall, error) {
	if err := c.usable("Step", name); err != nil {
		return nil, err
	}
	if nilFn {
		return nil, invalidArgument("step %q: nil function", name)
	}
	key, pos, err := c.nextKey(name, KindStep)
	if err != nil {
		return nil, err
	}
	s := &stepCall{ctx: c, x: c.x, name: name, key: key, pos: pos}
	for _, opt := range opts {
		if opt == nil {
			return nil, invalidArgument("step %q: nil StepOption", name)
		}
		opt(&s.opts)
	}
	if s.opts.timeout < 0 {
		return nil, invalidArgument("step %q: negative timeout %v", name, s.opts.timeout)
	}
	s.policy = s.opts.retry.or(c.x.def.retry).or(c.x.rt.cfg.DefaultRetry).or(DefaultRetry)
	if err := s.policy.Err(); err != nil {
		return nil, fmt.Errorf("step %q: %w", name, err)
	}
	c.checkAlive()
	return s, nil
}

// recorded returns the step's record when the run's history holds its outcome
// (COMPLETED or FAILED): the step does not run again. A step RETRYING continues with
// its next attempt (the backoff was served while the run waited).
func (s *stepCall) recorded() (store.StepRecord, bool) {
	rec, ok := s.x.hist.get(s.key)
	if !ok {
		return rec, false
	}
	switch rec.Status {
	case StepCompleted, StepFailed:
		return rec, true
	case StepRetrying:
		s.attempts = rec.Attempts
	}
	return rec, false
}

// stepResult is what one attempt of a step's body returned.
type stepResult[T any] struct {
	out       T
	err       error
	timedOut  bool
	abandoned bool
}

// runAttempt runs one attempt of the step's body, within the run's lease (see
// ensureLease), as the hooks see it. An attempt interrupted by the run's context
// (cancel, deadline, lost lease, shutdown) does not return: it does not count.
func runAttempt[T any](s *stepCall, fn func(context.Context) (T, error)) stepResult[T] {
	c, x := s.ctx, s.x
	c.ensureLease() // a frozen worker must not run a body another worker recorded
	att := c.beginAttempt(s.key, s.name, s.attempts)
	c.sc.inStep.Store(&s.key)
	returned := false
	defer func() {
		if !returned {
			// The body called runtime.Goexit on this goroutine (callStep recovers
			// panics): the unwind goes on, and the function's or branch's end fails it.
			c.sc.inStep.Store(nil)
			x.mu.Lock()
			x.goexitStep = s.key
			x.mu.Unlock()
			att.end(goexited("the body of step "+s.key), false)
		}
	}()
	res := callStep(att.ctx, stepBody(att, fn), s.opts.timeout, x.rt.stepGoroutines)
	returned = true
	c.sc.inStep.Store(nil)
	att.end(res.err, res.timedOut)
	if res.abandoned {
		n := x.rt.abandoned.Add(1)
		x.log().Warn("kagzi: step ignored its timeout; its goroutine is abandoned",
			"step", s.key, "timeout", s.opts.timeout, "abandoned_total", n)
	}
	if c.Err() != nil {
		c.checkAlive() // interrupted, not failed
	}
	return res
}

// encodeOutput encodes a step's output as it is recorded; its errors fail the step
// for good, with CodeInvalidOutput (as a workflow's output that cannot be recorded)
// and wrapping ErrInvalidArgument.
func (s *stepCall) encodeOutput(out any, typ string) ([]byte, error) {
	invalid := func(err error) error {
		return &Error{Code: CodeInvalidOutput, NonRetryable: true, Err: fmt.Errorf("%w: %w", ErrInvalidArgument, err)}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, invalid(fmt.Errorf("output of step %s (%s) does not encode as JSON: %w", s.key, typ, err))
	}
	p := s.x.rt.payloads
	if p.codec == nil {
		if err := storableJSON("output of step "+s.key, b); err != nil {
			return nil, invalid(err)
		}
	}
	if b, err = p.encode(b); err != nil {
		return nil, invalid(fmt.Errorf("output of step %s: %w", s.key, err))
	}
	if len(b) > p.maxBytes {
		return nil, invalid(fmt.Errorf("output of step %s is %d bytes, over the limit of %d", s.key, len(b), p.maxBytes))
	}
	return b, nil
}

// completed records an attempt that succeeded (or holds its record back; see
// holdRecord). stored is the output recorded before by this run, if any.
func (s *stepCall) completed(w store.StepWrite) (stored []byte, err error) {
	w.Status, w.StepStatus = StepCompleted, StepCompleted
	if !s.ctx.holdRecord(w) {
		if stored, err = s.ctx.recordStep(w); err != nil || stored != nil {
			return stored, err
		}
	}
	s.x.hist.set(s.key, store.StepRecord{Kind: KindStep, Status: StepCompleted, Output: w.Output, Attempts: s.attempts})
	return nil, nil
}

// failed records an attempt that failed, and returns the step's *StepError when its
// policy gives up. Otherwise it waits out the backoff, in process or, for a long one,
// with the run released (the workflow goroutine then unwinds), and returns nil: the
// next attempt follows.
func (s *stepCall) failed(w store.StepWrite, fnErr error, timedOut bool) error {
	d := stepDetail(fnErr, timedOut, s.key)
	w.Status = StepFailed
	if timedOut {
		w.Status = StepTimedOut
	}
	delay, retry := s.policy.next(s.attempts, &d)
	w.Error = encodeDetail(d)
	if !retry {
		w.StepStatus = StepFailed
		if _, err := s.ctx.recordStep(w); err != nil {
			return err
		}
		rec := store.StepRecord{Kind: KindStep, Status: StepFailed, Error: w.Error, Attempts: s.attempts}
		s.x.hist.set(s.key, rec)
		return stepError(s.key, rec)
	}
	w.StepStatus = StepRetrying
	if delay > s.x.rt.cfg.MaxInProcessSleep && s.ctx.canSuspend() {
		w.RetryIn = &delay
		if _, err := s.ctx.recordStep(w); err != nil {
			return err
		}
		s.ctx.stop(exitSuspended)
	}
	if _, err := s.ctx.recordStep(w); err != nil {
		return err
	}
	s.x.log().Debug("kagzi: step attempt failed; retrying", "step", s.key, "attempt", s.attempts, "retry_in", delay)
	s.ctx.waitInProcess(delay)
	return nil
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

// callStep runs fn, turning a panic into an error (and, with a timeout, a call of
// runtime.Goexit; without, fn runs on the caller's goroutine, which Goexit unwinds: see
// runAttempt). With a timeout, fn runs in its own goroutine with a context that ends at
// the deadline, and callStep returns at the deadline even if fn ignores it (abandoned);
// fn's late result is then discarded. live counts fn's goroutine until it returns.
func callStep[T any](ctx context.Context, fn func(context.Context) (T, error), timeout time.Duration,
	live *atomic.Int64) (res stepResult[T]) {
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
	live.Add(1)
	go func() {
		defer live.Add(-1)
		sent := false
		defer func() {
			if !sent { // fn called runtime.Goexit: a failed attempt, as a panic is
				done <- result{err: goexited("a step body")}
			}
		}()
		out, err := call(sctx)
		sent = true
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
