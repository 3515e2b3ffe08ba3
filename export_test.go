package kagzi

import (
	"context"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/kagzi/kagzi/internal/store"
)

// SetWaitPoll sets how long the client's Waits wait before their first look at the
// run without a notification: tests set an hour to show that a notification woke them.
func SetWaitPoll(c *Client, d time.Duration) { c.waitPoll = d }

// ClaimFloor returns where the worker's next claim starts reading the type's runs.
func ClaimFloor(w *Worker, workflowType string) (time.Time, bool) { return w.floors.Of(workflowType) }

// KeyQueueFloor returns where the worker's next claim starts reading the queues of the
// type's concurrency keys.
func KeyQueueFloor(w *Worker, workflowType string) (time.Time, bool) {
	return w.keyFloors.Of(workflowType)
}

// AnnounceRunsInProcess hands the client's own subscribers n notifications that runs
// of the workflow type are claimable now, as the database would deliver them.
func AnnounceRunsInProcess(c *Client, workflowType string, n int) {
	for range n {
		c.notifier.Publish(store.WakeTopic(c.ns, workflowType) + "|" + strconv.FormatInt(time.Now().UnixMilli(), 10))
	}
}

// SetStartsIdle sets how long the client's start committers wait for a start before
// they end; call it before the client is used.
func SetStartsIdle(c *Client, d time.Duration) { c.starts.RunOnDemand(2, d) }

// StartSenders returns how many goroutines share the client's starts' commits now.
func StartSenders(c *Client) int { return c.starts.Senders() }

// NotedLimited reports whether the client noted the workflow type as limited (its
// eager starts then take the type's locks and count its holders).
func NotedLimited(c *Client, workflowType string) bool {
	_, ok := c.limitedTypes.Load(workflowType)
	return ok
}

// SetAheadHold sets how long the worker's runs claimed ahead wait for a slot before
// they go back (set before Run).
func SetAheadHold(w *Worker, d time.Duration) { w.aheadHold = d }

// RunsAhead counts the worker's runs waiting ahead for a slot.
func RunsAhead(w *Worker) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.ahead)
}

// ClaimAhead claims up to n runs of the worker's types for it, from the start of
// their queues, and treats them as a claim's runs beyond its free slots (suspects
// sorted out and held, the others started in free slots or waiting ahead); it returns
// their ids.
func ClaimAhead(ctx context.Context, w *Worker, n int) ([]uuid.UUID, error) {
	return ClaimAheadThen(ctx, w, n, nil)
}

// ClaimAheadThen is ClaimAhead that calls then (when not nil) between the claim's
// answer and the start of its runs: what happens while a claim's answer is on its way.
func ClaimAheadThen(ctx context.Context, w *Worker, n int, then func()) ([]uuid.UUID, error) {
	c := store.Claimer{Namespace: w.client.ns, Types: w.types, Versions: w.versions, WorkerID: w.cfg.ID,
		Lease: w.cfg.LeaseDuration, Cursors: map[string]string{}}
	sent := time.Now()
	runs, report, err := store.ClaimRuns(ctx, w.client.pool, c, n)
	if err != nil {
		return nil, err
	}
	if then != nil {
		then()
	}
	now := time.Now()
	start, beside, hold := w.sortSuspects(ctx, runs)
	w.startClaimed(start, sent, now, report.Limited, false)
	w.hold(hold, beside, sent, now, report.Limited)
	ids := make([]uuid.UUID, len(runs))
	for i, r := range runs {
		ids[i] = r.RunID
	}
	return ids, nil
}

// WakeAsks counts the answers the worker's claim loop got from NextWake: after a
// claim that left slots free, it asks when the next run becomes claimable, and then
// waits for that time or a notification.
func WakeAsks(w *Worker) int64 { return w.wakeAsks.Load() }

// WorkerLimitsSet is what the claim loop does when it hears that a type's limits were
// set.
func WorkerLimitsSet(w *Worker, workflowType string) { w.limitsSet(workflowType) }
