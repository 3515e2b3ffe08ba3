package kagzi

import (
	"context"
	"time"

	"github.com/kagzi/kagzi/internal/store"
)

// A run's end is announced two ways. The worker that ends it tells the waiters of its
// own client in process, after the commit (Notifier.Publish). Waiters of other
// clients, in other processes most often, learn it from a NOTIFY that the run's end
// sends in its own statement, but only while some other client is registered in
// kagzi.waiters: a notifying transaction holds a server-wide lock through its commit,
// so notifying every end serialised the commits of all of them (a tenth of a
// burn-down's throughput) when nobody outside the process was waiting.
//
// A client registers before its first wait and keeps the registration fresh while it
// waits (waiterTTL, renewed when less than half of it is left), so a wait never
// depends on a registration that expired. Wait still looks at the run every few
// seconds, so a notification missed for any reason (a registration in the same
// instant as the end, a lost connection) delays it, nothing more.

// runEnd is what the worker that ended a run recorded, handed to the waiters of its
// own client with the notification (notifier.Notification.Value): they need not read
// the run back. The run had not continued as new.
type runEnd struct {
	status     RunStatus
	output     []byte // COMPLETED
	detail     []byte // FAILED: the error detail, as stored
	workflowID string
}

// waiterTTL is how long a registration as a waiter lasts; waiterRetry is how long a
// client that could not register waits before trying again.
const (
	waiterTTL   = time.Minute
	waiterRetry = 10 * time.Second
)

// waiterRegistration is a client's registration as a waiter for run ends.
type waiterRegistration struct {
	// turn holds a token while a registration is being written: one at a time, and a
	// waiter whose ctx ends while another's registration hangs (a database that does
	// not answer) stops waiting for its turn.
	turn  chan struct{}
	until time.Time // our clock; zero: not registered
}

// awaitEnds registers the client as a waiter for run ends in its namespace, unless
// its registration has more than half its time left. A failure is logged: the waiter
// then finds the end by looking at the run, a little later.
func (c *Client) awaitEnds(ctx context.Context) {
	select {
	case c.waiter.turn <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-c.waiter.turn }()
	if time.Until(c.waiter.until) > waiterTTL/2 {
		return
	}
	begun := time.Now()
	if err := store.RegisterWaiter(ctx, c.pool, c.ns, c.id, waiterTTL); err != nil {
		if ctx.Err() == nil {
			c.logger.Warn("kagzi: cannot register as a waiter for run ends; waits will look at the runs instead",
				"error", err, "retry_in", waiterRetry)
			// Not before waiterRetry: a wait looks at its run every few seconds.
			c.waiter.until = begun.Add(waiterTTL/2 + waiterRetry)
		}
		return
	}
	c.waiter.until = begun.Add(waiterTTL)
}
