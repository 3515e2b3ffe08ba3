package kagzi

import (
	"strconv"
	"time"

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
