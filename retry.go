package kagzi

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Retry is a retry policy: how many attempts a step (or a whole run) gets and how
// long to wait between them. Build one with Attempts, Exponential, Linear, NoRetry
// or Forever, and refine it with its methods; each returns a new policy. An invalid
// value (a negative duration, a NaN coefficient, zero attempts) makes the policy
// invalid, and the call that uses it rejects it with ErrInvalidArgument before
// anything runs: Step for a step's policy, Start and NewWorker for a workflow defined
// with it (WithWorkflowRetry), NewWorker for WorkerConfig's. So does an initial interval greater than
// an explicitly set maximum, in whichever order Initial and Max were called.
//
// The wait before attempt n+1 is Initial × Backoff^(n-1), capped at Max, then spread
// by ±Jitter. An error carrying a RetryAfter (see Error) waits that long instead.
type Retry struct {
	set          bool
	attempts     int // 0: forever
	initial      time.Duration
	max          time.Duration // the cap; see maxWait
	maxSet       bool          // max was set with Max, not defaulted
	backoff      float64
	jitter       float64
	nonRetryable []string
	err          error
}

// DefaultRetry is the policy used where no step, workflow or worker names one:
// 3 attempts, waiting 1s then 2s (±20%).
var DefaultRetry = Exponential(3)

// defaultMaxWait is the cap on waits when Max is not called.
const defaultMaxWait = 5 * time.Minute

// Exponential allows n attempts in all, waiting 1s before the second and doubling
// each time, up to 5 minutes, with 20% jitter.
func Exponential(n int) Retry {
	r := Retry{set: true, attempts: n, initial: time.Second, max: defaultMaxWait, backoff: 2, jitter: 0.2}
	if n < 1 {
		r.err = invalidArgument("retry: %d attempts; a policy needs at least 1 (use Forever for no limit)", n)
	}
	return r
}

// Attempts allows n attempts in all with the default exponential backoff; it is
// Exponential(n).
func Attempts(n int) Retry { return Exponential(n) }

// Linear allows n attempts in all, waiting d between them (d may exceed the default
// 5 minute cap, which then rises to d).
func Linear(n int, d time.Duration) Retry {
	return Exponential(n).Initial(d).Backoff(1).Jitter(0)
}

// NoRetry allows a single attempt: the first error fails the step (or run).
func NoRetry() Retry { return Exponential(1) }

// Forever retries without limit, with the default exponential backoff (up to 5
// minutes between attempts). Only a non-retryable error, a deadline or a cancel ends
// it.
func Forever() Retry {
	r := Exponential(1)
	r.attempts = 0
	return r
}

// Initial sets the wait before the second attempt. Without an explicit Max, an
// initial interval above the default 5 minute cap raises the cap to the initial
// interval (so Exponential(n).Initial(10*time.Minute) waits 10 minutes each time).
// With an explicit Max, an initial interval greater than it makes the policy
// invalid (see Err), whether Max was called before or after Initial.
func (r Retry) Initial(d time.Duration) Retry {
	if d < 0 {
		r.err = errors.Join(r.err, invalidArgument("retry: negative initial interval %v", d))
	}
	r.initial = d
	return r
}

// Max caps the wait between attempts (default 5 minutes). A cap below the initial
// interval makes the policy invalid (see Err), whether Initial was called before or
// after Max.
func (r Retry) Max(d time.Duration) Retry {
	if d < 0 {
		r.err = errors.Join(r.err, invalidArgument("retry: negative maximum interval %v", d))
	}
	r.max = d
	r.maxSet = true
	return r
}

// maxWait is the effective cap: Max when it was set, else the default cap or the
// initial interval, whichever is longer.
func (r Retry) maxWait() time.Duration {
	if !r.maxSet && r.initial > r.max {
		return r.initial
	}
	return r.max
}

// Backoff sets the coefficient each wait is multiplied by (1 = constant waits).
func (r Retry) Backoff(f float64) Retry {
	if math.IsNaN(f) || math.IsInf(f, 0) || f < 1 {
		r.err = errors.Join(r.err, invalidArgument("retry: backoff coefficient %v; it must be a finite number ≥ 1", f))
	}
	r.backoff = f
	return r
}

// Jitter spreads each wait by up to ±f of itself (0 to 1), so that runs that failed
// together do not retry together.
func (r Retry) Jitter(f float64) Retry {
	if math.IsNaN(f) || f < 0 || f > 1 {
		r.err = errors.Join(r.err, invalidArgument("retry: jitter %v; it must be within 0..1", f))
	}
	r.jitter = f
	return r
}

// NonRetryable lists error codes (ErrorDetail.Code, set by returning an *Error)
// that fail at once, without further attempts.
func (r Retry) NonRetryable(codes ...string) Retry {
	r.nonRetryable = append(slices.Clone(r.nonRetryable), codes...)
	return r
}

// MaxAttempts returns the number of attempts allowed, 0 for no limit.
func (r Retry) MaxAttempts() int { return r.attempts }

// Err returns why the policy is invalid, or nil. The error wraps ErrInvalidArgument.
func (r Retry) Err() error {
	if r.maxSet && r.initial > r.max && r.max >= 0 {
		return errors.Join(r.err, invalidArgument("retry: initial interval %v is greater than the maximum interval %v", r.initial, r.max))
	}
	return r.err
}

// String describes the policy for people: its attempts, waits and jitter ("unset"
// for the zero Retry).
func (r Retry) String() string {
	if !r.set {
		return "unset"
	}
	n := "forever"
	if r.attempts > 0 {
		n = fmt.Sprint(r.attempts, " attempts")
	}
	return fmt.Sprintf("%s, %v×%g up to %v, jitter %g", n, r.initial, r.backoff, r.maxWait(), r.jitter)
}

// or returns r when it is set, else other.
func (r Retry) or(other Retry) Retry {
	if r.set {
		return r
	}
	return other
}

// next decides what follows a failed attempt (numbered from 1) with the given error
// detail: retry after delay, or give up. An error whose code the policy lists as
// non-retryable is marked so in d: it stopped the retries by its nature, as an error
// marked NonRetryable does (an error whose attempts ran out is not marked).
func (r Retry) next(attempt int, d *ErrorDetail) (delay time.Duration, retry bool) {
	if slices.Contains(r.nonRetryable, d.Code) {
		d.NonRetryable = true
	}
	if d.NonRetryable {
		return 0, false
	}
	if r.attempts > 0 && attempt >= r.attempts {
		return 0, false
	}
	if d.RetryAfter > 0 {
		return d.RetryAfter, true
	}
	wait := float64(r.initial) * math.Pow(r.backoff, float64(attempt-1))
	if limit := r.maxWait(); wait > float64(limit) || math.IsInf(wait, 0) {
		wait = float64(limit)
	}
	if r.jitter > 0 {
		wait *= 1 + r.jitter*(2*rand.Float64()-1)
	}
	// A wait past what a Duration holds (a maximum near math.MaxInt64, jittered up)
	// would convert to a negative one, that is no wait at all.
	if wait >= math.MaxInt64 {
		return time.Duration(math.MaxInt64), true
	}
	return time.Duration(wait), true
}

// Error is an error that says how Kagzi should record and retry it. Return one (or
// wrap one) from a step or a workflow to set the recorded code, ask for a wait
// before the next attempt, or forbid retries.
type Error struct {
	// Code classifies the error, for Retry.NonRetryable and for workflow code that
	// reacts to a failed step (see StepError). Default: STEP_ERROR or WORKFLOW_ERROR.
	Code string
	// Message is the recorded text. Default: Err's text.
	Message string
	// NonRetryable fails the step (or run) at once.
	NonRetryable bool
	// RetryAfter, when positive, is the wait before the next attempt, instead of the
	// policy's backoff.
	RetryAfter time.Duration
	// Metadata is recorded with the error.
	Metadata map[string]string
	// Err is the underlying error, if any.
	Err error
}

// Error returns the message.
func (e *Error) Error() string {
	switch {
	case e.Message != "":
		return e.Message
	case e.Err != nil:
		return e.Err.Error()
	}
	return e.Code
}

// Unwrap returns the underlying error, and ErrNonRetryable for a non-retryable one.
func (e *Error) Unwrap() []error {
	var errs []error
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	if e.NonRetryable {
		errs = append(errs, ErrNonRetryable)
	}
	return errs
}

// RetryAfter wraps err so that the next attempt waits d, whatever the policy's
// backoff says (a rate limit's Retry-After, say).
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &Error{Err: err, RetryAfter: d}
}

// StepError is the error Step returns once a step failed for good (its attempts are
// exhausted, or the error was non-retryable). It is built from the recorded detail,
// so that a replay of the run returns the same error as the first execution: branch
// on its Code, not on the identity of the error the step function returned, which a
// replay cannot restore. It unwraps to ErrNonRetryable when the detail says so.
type StepError struct {
	// Key is the step's key, "name#occurrence".
	Key string
	// Detail is the recorded error of the last attempt.
	Detail ErrorDetail
	// Attempts is the number of attempts made.
	Attempts int
}

// Error names the step, its attempts and the recorded error.
func (e *StepError) Error() string {
	return fmt.Sprintf("kagzi: step %s failed after %d attempt(s): %s", e.Key, e.Attempts, e.Detail.Message)
}

// Unwrap returns ErrNonRetryable for a non-retryable failure, and ErrDeadlineExceeded
// for a timeout.
func (e *StepError) Unwrap() []error {
	var errs []error
	if e.Detail.NonRetryable {
		errs = append(errs, ErrNonRetryable)
	}
	if e.Detail.Code == CodeDeadlineExceeded {
		errs = append(errs, ErrDeadlineExceeded)
	}
	return errs
}

// ErrorCode returns the Code of the first *Error, *StepError or *WorkflowError in
// err's chain, or "".
func ErrorCode(err error) string {
	var e *Error
	var se *StepError
	var we *WorkflowError
	switch {
	case errors.As(err, &se):
		return se.Detail.Code
	case errors.As(err, &we):
		return we.Detail.Code
	case errors.As(err, &e):
		return e.Code
	}
	return ""
}
