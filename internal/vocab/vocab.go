// Package vocab is Kagzi's vocabulary of states and kinds, as the database stores
// them: the statuses of runs, steps, attempts and workers, and the kinds of steps.
// It is a leaf: the store writes these values, and the root package re-exports every
// name (kagzi.RunStatus, kagzi.StatusPending, ...) with its documentation.
// docs/state-machine.md draws how runs and steps move between them.
package vocab

// RunStatus is where a run is in its life.
type RunStatus string

// Run statuses.
const (
	StatusPending   RunStatus = "PENDING"   // waiting to be claimed (or for its delayed start, or a retry's backoff)
	StatusRunning   RunStatus = "RUNNING"   // held by a worker under a lease
	StatusSleeping  RunStatus = "SLEEPING"  // in a durable sleep or wait; no worker holds it
	StatusCompleted RunStatus = "COMPLETED" // finished with an output
	StatusFailed    RunStatus = "FAILED"    // finished with a recorded error
	StatusCancelled RunStatus = "CANCELLED" // cancelled
)

// Terminal reports whether the status is final.
func (s RunStatus) Terminal() bool {
	return s == StatusCompleted || s == StatusFailed || s == StatusCancelled
}

// StepKind says what a recorded step is.
type StepKind string

// Step kinds.
const (
	KindStep   StepKind = "STEP"   // a memoized function
	KindSleep  StepKind = "SLEEP"  // a durable sleep
	KindChild  StepKind = "CHILD"  // a child run's start or result
	KindSignal StepKind = "SIGNAL" // a signal wait
	KindEvent  StepKind = "EVENT"  // an event published
	KindPatch  StepKind = "PATCH"  // a Patched answer
	// KindAttributes is a change of the run's searchable attributes.
	KindAttributes StepKind = "ATTRIBUTES"
)

// StepStatus is the state of a recorded step or of one of its attempts.
type StepStatus string

// Step and attempt statuses.
const (
	StepCompleted   StepStatus = "COMPLETED"   // the output is recorded and will be replayed
	StepRetrying    StepStatus = "RETRYING"    // the last attempt failed; another will run (steps only)
	StepFailed      StepStatus = "FAILED"      // failed for good (steps); the attempt failed (attempts)
	StepTimedOut    StepStatus = "TIMED_OUT"   // the attempt passed its timeout (attempts only)
	StepWaiting     StepStatus = "WAITING"     // a signal wait with no signal yet (steps only)
	StepInterrupted StepStatus = "INTERRUPTED" // an attempt cut short by a cancel, a lost lease, a deadline or a shutdown (hook events only: never recorded)
)

// WorkerStatus is a worker's state in the registry.
type WorkerStatus string

// Worker statuses.
const (
	WorkerOnline   WorkerStatus = "ONLINE"   // running and claiming
	WorkerDraining WorkerStatus = "DRAINING" // shutting down: no new claims
	WorkerOffline  WorkerStatus = "OFFLINE"  // stopped, or silent for three heartbeat intervals
)
