package kagzi

import (
	"errors"
	"fmt"
	"time"
)

// How an execution ends is decided in two parts: decide, a pure function of why it
// stopped and what the workflow function returned, and the worker's write of that
// decision (execute.go). The decision is unit-tested without a database.

// result is what the workflow function left: nothing when its goroutine was unwound
// (returned false), else its encoded output or its error.
type result struct {
	returned bool
	out      []byte
	err      error
}

// stopped is everything decide needs to know about an execution that stopped.
type stopped struct {
	// reason is why the execution stopped before the function returned (exitNone:
	// it returned); cause is the cause of the run context's end, if it ended.
	reason exitReason
	cause  error
	res    result
	// What the failure details need: the run's workflow type and workflow-level
	// attempt, its retry policy, the output size limit, the determinism failure (for
	// exitNonDeterministic), and the takeovers and their limit (for
	// exitRecoveryExhausted).
	workflowType   string
	attempt        int
	policy         Retry
	maxBytes       int
	nondeterminism *ErrorDetail
	takeovers      int
	maxTakeovers   int
}

// An ending is what an execution's end writes.
type ending struct {
	kind endingKind
	// unwound is the reason of an endNothing: suspended or lease lost.
	unwound exitReason
	// status, output and detail end the run (endFinish); detail is also the error an
	// endRetry records.
	status RunStatus
	output []byte
	detail *ErrorDetail
	// retryIn is when the next attempt of an endRetry is due.
	retryIn time.Duration
}

type endingKind int

const (
	endNothing  endingKind = iota // the run is asleep, cancelled or another worker's: write nothing
	endHandBack                   // the worker is shutting down: hand the run back
	endRetry                      // the workflow failed and its policy retries it after retryIn
	endFinish                     // the run ends with status
	endContinue                   // the run continues as new with output as the next run's input
)

// decide returns how an execution that stopped ends.
func decide(s stopped) ending {
	reason := s.reason
	if s.res.returned && s.res.err != nil && s.cause != nil {
		reason = reasonFor(s.cause) // the function returned because its context ended
	}
	switch reason {
	case exitSuspended, exitLeaseLost:
		return ending{kind: endNothing, unwound: reason}
	case exitShutdown:
		return ending{kind: endHandBack}
	case exitNone:
		if !s.res.returned {
			return ending{kind: endNothing, unwound: exitLeaseLost} // unwound with no reason: write nothing
		}
		if s.res.err == nil && s.cause != nil && reasonFor(s.cause) == exitDeadline {
			reason = exitDeadline // finished, but too late
		}
	}
	switch reason {
	case exitDeadline:
		return failed(ErrorDetail{Code: CodeDeadlineExceeded, NonRetryable: true, Subject: s.workflowType,
			Message: "the run passed its deadline"})
	case exitRecoveryExhausted:
		return failed(ErrorDetail{Code: CodeRecoveryExhausted, NonRetryable: true, Subject: s.workflowType,
			Message: fmt.Sprintf("the run was taken over %d times after its worker lost its lease (died, froze or "+
				"lost its database), more than MaxTakeovers (%d) allows, the last time after it executed alone in its "+
				"worker (or more than twice the limit): a step may be crashing its process",
				s.takeovers, s.maxTakeovers)})
	case exitNonDeterministic:
		return failed(*s.nondeterminism)
	case exitCancelled:
		return ending{kind: endFinish, status: StatusCancelled}
	}
	if can, ok := s.res.err.(*continueAsNew); ok && can.root {
		return ending{kind: endContinue, output: can.input}
	}
	if s.res.err != nil {
		return failedFunction(s)
	}
	if len(s.res.out) > s.maxBytes {
		return failed(ErrorDetail{Code: CodeInvalidOutput, NonRetryable: true, Subject: s.workflowType,
			Message: fmt.Sprintf("output is %d bytes, over the limit of %d", len(s.res.out), s.maxBytes)})
	}
	return ending{kind: endFinish, status: StatusCompleted, output: s.res.out}
}

// failedFunction decides for a workflow function that returned an error: another
// attempt of the whole workflow, if its policy allows one, or the run's failure. A
// *StepError (a step that already had its own attempts) fails the run at once, with
// the step's detail.
func failedFunction(s stopped) ending {
	d := failureDetail(s.res.err, CodeWorkflowError, s.workflowType)
	var se *StepError
	if errors.As(s.res.err, &se) {
		return failed(d)
	}
	if delay, retry := s.policy.next(s.attempt, &d); retry {
		return ending{kind: endRetry, detail: &d, retryIn: delay}
	}
	return failed(d)
}

func failed(d ErrorDetail) ending {
	return ending{kind: endFinish, status: StatusFailed, detail: &d}
}

// detailBytes is the ending's detail as it is recorded (nil: none).
func (e ending) detailBytes() []byte {
	if e.detail == nil {
		return nil
	}
	return encodeDetail(*e.detail)
}

// hookOutcome is the outcome the hooks see for an ending that wrote nothing or
// handed the run back.
func (e ending) hookOutcome() ExecutionOutcome {
	switch {
	case e.kind == endHandBack:
		return OutcomeHandedBack
	case e.kind == endRetry:
		return OutcomeRetrying
	case e.unwound == exitLeaseLost:
		return OutcomeLeaseLost
	}
	return OutcomeSuspended
}
