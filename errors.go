package kagzi

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Errors a caller can test for with errors.Is. Every error Kagzi returns for bad
// input wraps ErrInvalidArgument and changes nothing in the database.
var (
	// ErrNotFound: no run (or step, or schedule) with that id in the client's namespace.
	ErrNotFound = errors.New("kagzi: not found")
	// ErrAlreadyExists: the workflow id is held by a run of another workflow type or,
	// for StartChild with WithID, by a run that is not the child of that parent step;
	// from Worker.Run, another running worker of the client has the worker's ID.
	ErrAlreadyExists = errors.New("kagzi: already exists")
	// ErrNoWorker: a start with RequireWorker found no live (ONLINE or DRAINING)
	// worker in the namespace that registered the workflow type (and version).
	// Nothing was started.
	ErrNoWorker = errors.New("kagzi: no live worker registered the workflow type")
	// ErrInvalidArgument: the input was rejected before anything was written.
	ErrInvalidArgument = errors.New("kagzi: invalid argument")
	// ErrRunFinished: the run already ended (COMPLETED, FAILED or CANCELLED) and cannot
	// be changed.
	ErrRunFinished = errors.New("kagzi: run finished")
	// ErrCancelled: the run was cancelled. Wait returns it for a CANCELLED run.
	ErrCancelled = errors.New("kagzi: run cancelled")
	// ErrWorkflowFailed: the run ended FAILED. The error also unwraps to a *WorkflowError
	// that carries the recorded ErrorDetail.
	ErrWorkflowFailed = errors.New("kagzi: workflow failed")
	// ErrNonRetryable marks an error that must not be retried; see NonRetryable.
	ErrNonRetryable = errors.New("kagzi: non-retryable")
	// ErrNonDeterministic: the workflow code asked for another step than the run's
	// history holds at that position (the code changed under a run in flight).
	ErrNonDeterministic = errors.New("kagzi: non-deterministic workflow")
	// ErrDeadlineExceeded: a step attempt passed its timeout, or a run its deadline.
	ErrDeadlineExceeded = errors.New("kagzi: deadline exceeded")
	// ErrSchemaNotMigrated: Kagzi's tables are missing; run kagzi.Migrate first.
	ErrSchemaNotMigrated = errors.New("kagzi: schema not migrated (run kagzi.Migrate or the goose migrations first)")
	// ErrClosed: the client's pool was closed.
	ErrClosed = errors.New("kagzi: database pool closed")
	// ErrInsideStep: a durable call (Step, Sleep, StartChild, WaitSignal, SetEvent,
	// Go, Map) was made with the workflow's Context from inside a step's body. It also
	// wraps ErrInvalidArgument; nothing was recorded.
	ErrInsideStep = errors.New("kagzi: durable call inside a step body")
	// ErrRecoveryExhausted: the run was taken over after a lost lease more times than
	// the worker's MaxTakeovers allows, and failed (CodeRecoveryExhausted).
	ErrRecoveryExhausted = errors.New("kagzi: recovery exhausted")
	// ErrUnavailable: the database could not be reached, or dropped the connection
	// (it is down, restarting, shutting down or unreachable). The error is an
	// *UnavailableError, which says whether the request may have committed.
	ErrUnavailable = errors.New("kagzi: database unavailable")
)

// UnavailableError is the error for a request that failed because the database was
// unavailable: the connection could not be made, it broke, or the server ended it
// (shutting down, crashed, not yet accepting connections). It wraps ErrUnavailable
// and the driver's error. Errors the database answered for a reason of its own (a
// constraint, a missing schema) are not UnavailableErrors.
type UnavailableError struct {
	// Op names the request, e.g. "kagzi: start order".
	Op string
	// MayHaveCommitted reports that the outcome is unknown: the connection broke
	// after the request was sent, or the server ended the session (shutting down,
	// crashed, pg_terminate_backend: it may do so after the request's COMMIT), so it
	// may have committed. It is false when the request provably did not commit: it
	// was never sent, or the server answered it with an error (the statement, its own
	// transaction, rolled back), and for a read (GetRun, ListRuns, GetEvent and the
	// like), which writes nothing.
	MayHaveCommitted bool
	// Err is the driver's error.
	Err error

	start bool // Op is a Start: the message says how to repeat it
	read  bool // Op is a read: it wrote nothing
}

// Error names the request, says whether it may have committed and gives the cause.
func (e *UnavailableError) Error() string {
	var outcome string
	switch {
	case e.start && e.MayHaveCommitted:
		outcome = "the start may have committed; starting again with the same WithID is safe and returns the run if it did"
	case e.start:
		outcome = "the start did not commit"
	case e.read:
		outcome = "a read: nothing was written"
	case e.MayHaveCommitted:
		outcome = "the request may have committed"
	default:
		outcome = "the request did not commit"
	}
	return fmt.Sprintf("%s: database unavailable (%s): %v", e.Op, outcome, e.Err)
}

// Unwrap returns ErrUnavailable and the driver's error.
func (e *UnavailableError) Unwrap() []error { return []error{ErrUnavailable, e.Err} }

// Error codes stored in ErrorDetail.Code.
const (
	CodeWorkflowError     = "WORKFLOW_ERROR"     // the workflow function returned an error
	CodeStepError         = "STEP_ERROR"         // a step's function returned an error
	CodePanic             = "PANIC"              // the workflow or a step panicked
	CodeInvalidInput      = "INVALID_INPUT"      // the stored input does not decode into the workflow's input type
	CodeInvalidOutput     = "INVALID_OUTPUT"     // an output cannot be encoded or decoded
	CodeDeadlineExceeded  = "DEADLINE_EXCEEDED"  // a timeout or deadline passed
	CodeNonRetryable      = "NON_RETRYABLE"      // the error was marked non-retryable
	CodeCancelled         = "CANCELLED"          // the run was cancelled
	CodeInternal          = "INTERNAL"           // a fault in Kagzi itself
	CodeNonDeterministic  = "NON_DETERMINISTIC"  // a replay asked for another step than the run's history holds
	CodeRecoveryExhausted = "RECOVERY_EXHAUSTED" // the run was taken over more than WorkerConfig.MaxTakeovers times
)

// ErrorDetail is the error recorded for a failed run or step attempt.
type ErrorDetail struct {
	// Code classifies the error; one of the Code constants.
	Code string `json:"code"`
	// Message is the error's text.
	Message string `json:"message"`
	// NonRetryable reports that the error was not, and will not be, retried.
	NonRetryable bool `json:"non_retryable,omitempty"`
	// RetryAfter, when set, asked for the next attempt no sooner than this.
	RetryAfter time.Duration `json:"retry_after,omitempty"`
	// Subject names what failed: a step key, or the workflow type.
	Subject string `json:"subject,omitempty"`
	// Metadata holds extra facts, such as a panic's stack trace under "stack".
	Metadata map[string]string `json:"metadata,omitempty"`
}

// String formats the detail as "CODE in subject: message".
func (d ErrorDetail) String() string {
	if d.Subject != "" {
		return d.Code + " in " + d.Subject + ": " + d.Message
	}
	return d.Code + ": " + d.Message
}

// WorkflowError is the error a caller gets for a run that ended FAILED. It wraps
// ErrWorkflowFailed (and ErrNonRetryable when the detail says so, and the sentinel of
// its code: ErrDeadlineExceeded, ErrNonDeterministic, ErrRecoveryExhausted,
// ErrCompensationFailed).
type WorkflowError struct {
	RunID      string
	WorkflowID string
	Detail     ErrorDetail
}

// Error names the run, its workflow id and the recorded detail.
func (e *WorkflowError) Error() string {
	return fmt.Sprintf("kagzi: run %s (workflow id %q) failed: %s", e.RunID, e.WorkflowID, e.Detail)
}

// Unwrap lets errors.Is find ErrWorkflowFailed and, for non-retryable failures, ErrNonRetryable.
func (e *WorkflowError) Unwrap() []error {
	errs := []error{ErrWorkflowFailed}
	if e.Detail.NonRetryable {
		errs = append(errs, ErrNonRetryable)
	}
	if e.Detail.Code == CodeDeadlineExceeded {
		errs = append(errs, ErrDeadlineExceeded)
	}
	if e.Detail.Code == CodeNonDeterministic {
		errs = append(errs, ErrNonDeterministic)
	}
	if e.Detail.Code == CodeRecoveryExhausted {
		errs = append(errs, ErrRecoveryExhausted)
	}
	if e.Detail.Code == CodeCompensationFailed {
		errs = append(errs, ErrCompensationFailed)
	}
	return errs
}

type nonRetryableError struct{ err error }

func (e *nonRetryableError) Error() string   { return e.err.Error() }
func (e *nonRetryableError) Unwrap() []error { return []error{e.err, ErrNonRetryable} }

// NonRetryable wraps err so that the step or workflow returning it fails at once,
// without further attempts. errors.Is(err, ErrNonRetryable) reports such errors.
func NonRetryable(err error) error {
	if err == nil {
		return nil
	}
	return &nonRetryableError{err: err}
}

func invalidArgument(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}

func encodeDetail(d ErrorDetail) []byte {
	// An error's text may quote anything, NUL characters too, which jsonb cannot
	// hold: they are stored as U+FFFD, so that the failure itself is recorded.
	d.Code, d.Message, d.Subject = withoutNUL(d.Code), withoutNUL(d.Message), withoutNUL(d.Subject)
	if len(d.Metadata) > 0 {
		m := make(map[string]string, len(d.Metadata))
		for k, v := range d.Metadata {
			m[withoutNUL(k)] = withoutNUL(v)
		}
		d.Metadata = m
	}
	b, err := json.Marshal(d)
	if err != nil {
		b, _ = json.Marshal(ErrorDetail{Code: CodeInternal, Message: err.Error()})
	}
	return b
}

func decodeDetail(b []byte) *ErrorDetail {
	if len(b) == 0 {
		return nil
	}
	var d ErrorDetail
	if err := json.Unmarshal(b, &d); err != nil {
		return &ErrorDetail{Code: CodeInternal, Message: "undecodable error detail: " + string(b)}
	}
	return &d
}

// withoutNUL replaces the NUL characters of s with U+FFFD.
func withoutNUL(s string) string {
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}
