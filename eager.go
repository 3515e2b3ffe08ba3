package kagzi

import (
	"context"
	"time"

	"github.com/kagzi/kagzi/internal/store"
)

// Eager start. When the starting process runs a worker of the run's type with a free
// slot, Start reserves the slot, and its insert claims the run for that worker (as a
// claim would: RUNNING, lease epoch 1, a lease from now) when the run may start at
// once; the worker then executes it without a notification and a claim in between.
// Nothing else changes: the run is leased and fenced like any claimed run, a crash
// before its first step is an ordinary takeover, and a run that cannot start eagerly
// (a StartTx, a delayed start, a debounce, a version the worker did not register, a
// type with a rate limit, a full concurrency limit, runs of its type queued for a
// claim before it) is inserted PENDING as before.
//
// Limits. A run with a concurrency key, or of a type that an earlier eager start of
// this client found limited (its insert came back PENDING, and not for a queue before
// it: the insert of a run of no key claims only for a type without limits), starts
// eagerly when its type has no rate limit, its type's concurrency limit and its key's
// have room, and no run of its key is queued before it: the start locks the type (when
// it has a concurrency limit) and the key as a claim does, counts their holders in a
// statement after the locks, and commits on its own (not in the client's shared start
// commits), all in one round trip. A run so claimed holds a slot of its type's limit,
// as a claimed one does. Only a lone start does so: while other starts of the client
// are in flight, the shared commits carry more of them a second than starts committing
// one by one (each after the type's lock), and such a start leaves its run to a claim.

// eagerWorker returns a running worker of the client that executes the type at the
// version, accepts eager starts, and reserved a slot for the run; nil when none did.
func (c *Client) eagerWorker(workflowType, version string) *Worker {
	c.mu.Lock()
	defer c.mu.Unlock()
	for w := range c.workers {
		if !w.cfg.DisableEagerStart && w.defs[workflowType] != nil && w.versionOf(workflowType) == version && w.reserveSlot() {
			return w
		}
	}
	return nil
}

// floorOf returns the worker's claim floor of a type (nil: none), from which an eager
// start looks for runs queued before its own.
func (w *Worker) floorOf(workflowType string) *time.Time {
	if at, ok := w.floors.Of(workflowType); ok {
		return &at
	}
	return nil
}

// versionOf returns the version the worker registered for a type of its own.
func (w *Worker) versionOf(workflowType string) string {
	for i, t := range w.types {
		if t == workflowType {
			return w.versions[i]
		}
	}
	return ""
}

// reserveSlot reserves a free slot for an eager start, while the worker claims.
func (w *Worker) reserveSlot() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.accepting || w.soloBlocks(time.Now()) || w.held != nil ||
		w.cfg.MaxConcurrent-w.slotsTakenLocked() <= 0 {
		return false
	}
	w.reserved++
	return true
}

// releaseReservation gives back a slot reserved for a start that was not claimed.
func (w *Worker) releaseReservation() {
	w.mu.Lock()
	w.reserved--
	start := w.takeAheadLocked() // a run claimed ahead may wait for this slot
	w.mu.Unlock()
	for _, x := range start {
		w.launch(x)
	}
	select {
	case w.slotFree <- struct{}{}:
	default:
	}
}

// startEager executes a run its start claimed for the worker, in the slot reserved
// for it. A worker that stopped claiming meanwhile hands the run back instead. plain:
// the start claimed its run without limits (its type had none: not the locked way).
func (w *Worker) startEager(r store.Run, carrier []byte, sent time.Time, holdsSlot, plain bool) {
	run := store.ClaimedRun{
		Fence: store.Fence{RunID: r.RunID, Epoch: r.LeaseEpoch}, HoldsSlot: holdsSlot,
		Namespace: r.Namespace, WorkflowID: r.WorkflowID, WorkflowType: r.WorkflowType, Input: r.Input,
		Attempt: r.Attempt, CancelRequested: r.CancelRequested, Deadline: r.Deadline, CreatedAt: r.CreatedAt,
		DBNow: r.CreatedAt, Steps: map[string]store.StepRecord{}, AvailableAt: r.CreatedAt, Carrier: carrier,
	}
	if r.Version != nil {
		run.Version = *r.Version
	}
	if r.FlowKey != nil {
		// A place of its key: the worker's claims do not count it once its function
		// returned (see releaseSlot).
		run.ConcurrencyKey = *r.FlowKey
	}
	w.mu.Lock()
	if !w.accepting {
		w.reserved--
		w.handBack = append(w.handBack, run.Fence)
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	if w.client.hooks != nil {
		w.client.hooks.Claim(context.Background(), &ClaimEvent{Namespace: w.client.ns, WorkerID: w.cfg.ID,
			Types: []string{r.WorkflowType}, Requested: 1, Claimed: 1, Eager: true})
	}
	w.startEagerRun(run, sent, time.Now(), plain)
}
