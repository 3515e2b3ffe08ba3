package kagzi

import "time"

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
