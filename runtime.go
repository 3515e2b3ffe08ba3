package kagzi

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi/internal/committer"
	"github.com/kagzi/kagzi/internal/gopool"
	"github.com/kagzi/kagzi/internal/store"
)

// runtime is what the executions of a worker's runs need of the worker and its
// client. The worker hands it to each execution when it claims the run, so that the
// engine never reaches back through the worker into the client.
type runtime struct {
	workerID string
	cfg      *WorkerConfig // leases, in-process sleeps, the default retry policy
	db       *writer
	payloads *payloads
	hooks    Hooks // nil: none
	logger   *slog.Logger
	// startChild inserts a child run linked to its parent's step (Client.startChild).
	startChild func(ctx context.Context, workflowType string, input []byte, opts []StartOption,
		parent store.Fence, key string, idNotBefore *time.Time) (*Run[json.RawMessage], error)
	// abandoned counts the step goroutines that ignored their timeout; stepGoroutines
	// counts those of steps with a timeout that have not returned yet, abandoned or
	// not (a worker's run alone waits for them: see solo.go).
	abandoned, stepGoroutines *atomic.Int64
	// goroutines runs the workflow functions (see internal/gopool).
	goroutines *gopool.Pool
}

// writer makes the fenced writes of a worker's executions, and the reads that go
// with them. Each method is one write and picks the way it goes: the steps committer
// for the hot writes of runs in flight (step records, sleeps, suspensions), which
// share commits and statements; the ends committer for runs' ends, which nothing
// waits on but callers of Wait; the pool for the rarer ones. A new write is a new
// method here, never a handle taken by its caller.
type writer struct {
	pool   *pgxpool.Pool
	steps  *committer.Committer
	ends   *committer.Committer
	client uuid.UUID // the worker's client: see store.FinishWrite
	// lease bounds how long a continue-as-new's transaction may stay idle (its
	// process stopped) before PostgreSQL ends it: see store.InTx.
	lease time.Duration
}

func (w *writer) recordStep(ctx context.Context, s store.StepWrite) (attempt int, err error) {
	return store.RecordStep(ctx, w.steps, s)
}

func (w *writer) recordSleep(ctx context.Context, s store.SleepWrite) (wakeAt, dbNow time.Time, err error) {
	return store.RecordSleep(ctx, w.steps, s)
}

func (w *writer) suspend(ctx context.Context, s store.SleepWrite) (RunStatus, error) {
	return store.Suspend(ctx, w.steps, s)
}

func (w *writer) finish(ctx context.Context, f store.FinishWrite) (RunStatus, error) {
	f.Client = w.client
	return store.FinishRun(ctx, w.ends, f)
}

func (w *writer) continueRun(ctx context.Context, c store.ContinueWrite) (RunStatus, error) {
	c.Client = w.client
	return store.ContinueRun(ctx, w.pool, w.lease, c)
}

func (w *writer) retryRun(ctx context.Context, f store.Fence, detail []byte, delay time.Duration) error {
	return store.RetryRun(ctx, w.pool, f, detail, delay)
}

func (w *writer) recordResult(ctx context.Context, r store.ResultStep) error {
	return store.RecordResultStep(ctx, w.pool, r)
}

func (w *writer) suspendForWait(ctx context.Context, s store.WaitWrite) (RunStatus, error) {
	return store.SuspendForWait(ctx, w.pool, s)
}

func (w *writer) takeSignal(ctx context.Context, t store.SignalTake) (store.SignalWait, error) {
	return store.TakeSignal(ctx, w.pool, t)
}

func (w *writer) setEvent(ctx context.Context, e store.EventWrite) error {
	return store.SetEvent(ctx, w.pool, e)
}

func (w *writer) setAttributes(ctx context.Context, a store.AttributesWrite) (fit bool, err error) {
	return store.SetAttributes(ctx, w.pool, a)
}

func (w *writer) renewLease(ctx context.Context, f store.Fence, lease time.Duration) (cancelRequested bool, err error) {
	return store.RenewLease(ctx, w.pool, f, lease)
}

// stepOutput reads a step's recorded output.
func (w *writer) stepOutput(ctx context.Context, runID uuid.UUID, key string) ([]byte, error) {
	return store.GetStepOutput(ctx, w.pool, runID, key)
}

// runOutcome reads the status and result of parent's child runID: those of the last
// run of its chain. When the run itself is gone (its record passed the retention
// while its chain went on continuing as new, or before the parent asked), the chain
// is found by its workflow id, if the newest run of that id is still parent's child
// (an id the retention freed may have been taken by another run). It returns
// store.ErrNotFound when neither is there.
func (w *writer) runOutcome(ctx context.Context, runID uuid.UUID, namespace, workflowID string, parent uuid.UUID) (store.RunOutcome, error) {
	o, err := store.GetRunOutcome(ctx, w.pool, runID)
	if !errors.Is(err, store.ErrNotFound) || workflowID == "" {
		return o, err
	}
	r, err := store.GetRunByWorkflowID(ctx, w.pool, namespace, workflowID)
	if err != nil {
		return store.RunOutcome{}, err
	}
	if r.ParentRunID == nil || *r.ParentRunID != parent {
		return store.RunOutcome{}, store.ErrNotFound
	}
	return store.RunOutcome{Status: r.Status, Output: r.Output, Error: r.Error}, nil
}
