package kagzi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
)

// CodeCompensationFailed is the ErrorDetail.Code of a run that failed because a
// compensation of its Saga failed for good (see Saga.Compensate).
const CodeCompensationFailed = "COMPENSATION_FAILED"

// ErrCompensationFailed: a compensation of a Saga failed for good, so the effects of
// the workflow are not all undone. A *SagaError with failed compensations wraps it,
// and so does the *WorkflowError of the run it failed (CodeCompensationFailed).
var ErrCompensationFailed = errors.New("kagzi: compensation failed")

// compensationPrefix starts the step name of every compensation, so that the steps
// that undo are told apart from the steps they undo in the run's history.
const compensationPrefix = "compensate/"

// Saga collects the compensations of a workflow, the steps that undo what it did, and
// runs them in reverse order when the workflow fails.
//
// After each step whose effect must be undone if the workflow fails later, register
// its compensation with Add. When the workflow fails, return Compensate's error:
//
//	saga := kagzi.NewSaga(ctx)
//	flight, err := kagzi.Step(ctx, "book-flight", bookFlight)
//	if err != nil {
//		return Trip{}, saga.Compensate(err) // nothing to undo yet
//	}
//	err = saga.Add("cancel-flight", func(c context.Context) error { return cancelFlight(c, flight) },
//		kagzi.WithRetry(kagzi.Forever()))
//	if err != nil {
//		return Trip{}, err
//	}
//	hotel, err := kagzi.Step(ctx, "book-hotel", bookHotel)
//	if err != nil {
//		return Trip{}, saga.Compensate(err) // runs compensate/cancel-flight
//	}
//
// A Saga lives in memory and records nothing itself: Add only remembers the
// compensation. That is replay-safe because a resumed run calls the workflow function
// again from the top, so the same Adds happen again, in the same order, with the
// values the memoized steps return. Each compensation runs as a Step named
// "compensate/" + its name, so it is recorded like any step (ListSteps, hooks) and a
// compensation that completed never runs again.
//
// A Saga belongs to the goroutine of the Context it was made with (the workflow
// function's or a branch's): call Add and Compensate from there, not from inside a
// step's body and not from several branches, whose order would not be deterministic.
type Saga struct {
	ctx *Context

	mu           sync.Mutex
	items        []compensation
	names        map[string]bool
	compensating bool
}

// compensation is one registered compensation.
type compensation struct {
	name string
	fn   func(context.Context) error
	opts []StepOption
}

// NewSaga returns an empty Saga for the workflow (or branch) whose Context ctx is. A
// nil or zero ctx gives a Saga whose Add and Compensate return ErrInvalidArgument.
func NewSaga(ctx *Context) *Saga {
	return &Saga{ctx: ctx, names: map[string]bool{}}
}

// Add registers fn as the compensation called name, to run if the workflow fails
// after this point. Call it once the step it undoes has completed (or before that
// step, when fn also undoes a step that failed half-way). The options are Step's:
// WithRetry gives the compensation its own retry policy (compensations usually
// deserve a patient one), WithStepTimeout bounds each attempt.
//
// Add refuses, with an error wrapping ErrInvalidArgument that registers nothing: a
// nil Saga or one made from a nil or zero Context; a call from inside a step's body
// (also ErrInsideStep); a name that is empty, not valid UTF-8, holds control
// characters or makes the step name "compensate/"+name longer than 255 bytes; a name
// already registered in this Saga; a nil fn or option; a negative timeout or an
// invalid retry policy; and any Add once Compensate has started.
func (s *Saga) Add(name string, fn func(context.Context) error, opts ...StepOption) error {
	if s == nil || s.ctx == nil {
		return invalidArgument("saga: Add(%q) on a nil Saga or one made from a nil Context; use kagzi.NewSaga(ctx)", name)
	}
	if err := s.ctx.usable("Saga.Add", name); err != nil {
		return err
	}
	if err := validName("compensation name", name); err != nil {
		return fmt.Errorf("saga: %w", err)
	}
	if n := len(compensationPrefix) + len(name); n > 255 {
		return invalidArgument("saga: compensation %q: the step name %q is longer than 255 bytes", name, compensationPrefix+name)
	}
	if fn == nil {
		return invalidArgument("saga: compensation %q: nil function", name)
	}
	var o stepOptions
	for _, opt := range opts {
		if opt == nil {
			return invalidArgument("saga: compensation %q: nil option", name)
		}
		opt(&o)
	}
	if o.timeout < 0 {
		return invalidArgument("saga: compensation %q: negative timeout %v", name, o.timeout)
	}
	if err := o.retry.Err(); o.retry.set && err != nil {
		return fmt.Errorf("saga: compensation %q: %w", name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.compensating:
		return invalidArgument("saga: Add(%q) after Compensate started; register compensations before the workflow fails", name)
	case s.names[name]:
		return invalidArgument("saga: compensation %q registered twice; give each its own name", name)
	}
	s.names[name] = true
	s.items = append(s.items, compensation{name: name, fn: fn, opts: opts})
	return nil
}

// Compensate runs the registered compensations in reverse order of registration,
// each as a durable step named "compensate/"+name with its own options, and returns
// a *SagaError that wraps cause, the failure that made the workflow give up. Return
// that error from the workflow function: the run fails with it.
//
// A compensation that completed before (the run was resumed after a crash, a long
// retry backoff or a sleep) returns its recorded outcome without running again. A
// compensation that fails for good does not stop the others: the rest still run, and
// the SagaError lists it in Failed and wraps ErrCompensationFailed.
//
// The run then fails, and is not retried by the workflow's retry policy (the error is
// non-retryable: its effects are undone). When every compensation completed, its
// recorded error is cause's (the code of the step that failed, say), marked
// NonRetryable, with Metadata["compensated"] listing the compensations that ran as a
// JSON array (the text of one: Metadata values are strings). When one failed, its code
// is CodeCompensationFailed, its subject the first failed compensation's step key, and
// its Metadata holds cause's "cause_code", "cause_subject" and "cause_message", and the
// JSON arrays "compensated" and "failed"; Wait's *WorkflowError then wraps
// ErrCompensationFailed.
//
// A cancelled run does not compensate: cancelling (or passing the run's deadline)
// unwinds the workflow goroutine, also in the middle of Compensate, and the
// compensations not yet completed do not run.
//
// Compensate refuses, running nothing, a nil cause, a nil Saga or one made from a nil
// or zero Context, a call from inside a step's body, and a second call: the error
// wraps ErrInvalidArgument (and cause, when there is one).
func (s *Saga) Compensate(cause error) error {
	refuse := func(format string, args ...any) error {
		err := invalidArgument(format, args...)
		if cause != nil {
			return fmt.Errorf("%w (compensating after: %w)", err, cause)
		}
		return err
	}
	switch {
	case s == nil || s.ctx == nil:
		return refuse("saga: Compensate on a nil Saga or one made from a nil Context; use kagzi.NewSaga(ctx)")
	case cause == nil:
		return refuse("saga: Compensate(nil); pass the error that makes the workflow fail")
	}
	if err := s.ctx.usable("Saga.Compensate", ""); err != nil {
		return fmt.Errorf("%w (compensating after: %w)", err, cause)
	}
	s.mu.Lock()
	if s.compensating {
		s.mu.Unlock()
		return refuse("saga: Compensate called twice; it runs the compensations once")
	}
	s.compensating = true
	items := s.items
	s.mu.Unlock()

	e := &SagaError{Cause: cause}
	var failedNames []string
	for i := len(items) - 1; i >= 0; i-- {
		c := items[i]
		_, err := Step(s.ctx, compensationPrefix+c.name, func(ctx context.Context) (struct{}, error) {
			return struct{}{}, c.fn(ctx)
		}, c.opts...)
		if err != nil {
			e.Failed = append(e.Failed, err)
			failedNames = append(failedNames, c.name)
			continue
		}
		e.Compensated = append(e.Compensated, c.name)
	}
	e.detail = s.detail(e, failedNames)
	return e
}

// detail is the ErrorDetail the run records when the workflow returns e.
func (s *Saga) detail(e *SagaError, failedNames []string) *ErrorDetail {
	c := failureDetail(e.Cause, CodeWorkflowError, s.ctx.WorkflowType())
	if len(e.Failed) == 0 {
		d := c
		d.NonRetryable = true
		d.Metadata = maps.Clone(c.Metadata)
		if d.Metadata == nil {
			d.Metadata = map[string]string{}
		}
		d.Metadata["compensated"] = jsonList(e.Compensated)
		return &d
	}
	subject := s.ctx.WorkflowType()
	var se *StepError
	if errors.As(e.Failed[0], &se) {
		subject = se.Key
	}
	return &ErrorDetail{Code: CodeCompensationFailed, Message: e.Error(), NonRetryable: true, Subject: subject,
		Metadata: map[string]string{
			"cause_code":    c.Code,
			"cause_subject": c.Subject,
			"cause_message": c.Message,
			"compensated":   jsonList(e.Compensated),
			"failed":        jsonList(failedNames),
		}}
}

func jsonList(names []string) string {
	if names == nil {
		names = []string{}
	}
	b, _ := json.Marshal(names)
	return string(b)
}

// SagaError is the error Saga.Compensate returns: the failure that made the workflow
// compensate, and how the compensations went. It is non-retryable (errors.Is
// ErrNonRetryable), and wraps ErrCompensationFailed when a compensation failed for
// good.
//
// errors.Is and errors.As see Cause, not the compensations' errors: when the workflow
// gave up because a step failed, errors.As(err, &stepErr) finds that step's
// *StepError and ErrorCode(err) its code. The failed compensations' errors are in
// Failed (each a *StepError, as Step returns it).
type SagaError struct {
	// Cause is the error Compensate was called with.
	Cause error
	// Compensated names the compensations that completed, in the order they ran.
	Compensated []string
	// Failed holds the error of each compensation that failed for good, in the order
	// they ran.
	Failed []error

	detail *ErrorDetail // what the run records for it (nil for a SagaError made by hand)
}

// Error says what failed and how the compensations went.
func (e *SagaError) Error() string {
	switch {
	case len(e.Failed) == 0 && len(e.Compensated) == 0:
		return fmt.Sprintf("kagzi: saga had nothing to compensate after: %v", e.Cause)
	case len(e.Failed) == 0:
		return fmt.Sprintf("kagzi: saga compensated %s after: %v", strings.Join(e.Compensated, ", "), e.Cause)
	}
	msgs := make([]string, len(e.Failed))
	for i, err := range e.Failed {
		msgs[i] = err.Error()
	}
	return fmt.Sprintf("kagzi: %d compensation(s) failed: %s; compensating after: %v",
		len(e.Failed), strings.Join(msgs, "; "), e.Cause)
}

// Unwrap returns Cause, ErrCompensationFailed when a compensation failed, and
// ErrNonRetryable. The failed compensations' own errors are in Failed.
func (e *SagaError) Unwrap() []error {
	var errs []error
	if e.detail != nil {
		// Found first by the engine (errorOf looks for a *detailError before anything
		// else): the run records this detail.
		errs = append(errs, &detailError{detail: *e.detail})
	}
	if e.Cause != nil {
		errs = append(errs, e.Cause)
	}
	if len(e.Failed) > 0 {
		errs = append(errs, ErrCompensationFailed)
	}
	return append(errs, ErrNonRetryable)
}
