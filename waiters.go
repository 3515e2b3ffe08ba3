package kagzi

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"

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
	if !c.notifier.Connects() {
		// No direct connection (DisableDirectConn): nothing would hear the ends'
		// notifications, and registering would make every end in the namespace send
		// one under the server-wide lock of a notifying commit.
		return
	}
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

// A wait looks at its run on its own when it begins and after each notification that
// carries no result; its later looks, in case a notification was missed, are batched:
// the client's runLooks reads every run whose look is due, with those due soon, in
// one statement (store.LookAtRuns). A thousand waits, on one run or on a thousand,
// cost one statement a round instead of a thousand.

// lookTimeout bounds a batched look; one that takes longer counts as the database
// being unavailable for the waits it served, which look again later.
const lookTimeout = 10 * time.Second

// runLooks holds the client's waits' batched looks to come.
type runLooks struct {
	mu      sync.Mutex
	pending map[*runLook]struct{}
	wake    chan struct{} // a new look, perhaps due before the looker's sleep ends
	running bool          // the looker goroutine runs (it ends when nothing is pending)
	// sleepUntil is when the looker's sleep ends (zero: it is not asleep, and reads
	// pending again before it sleeps). Only a look due before it wakes the looker:
	// each wake reads every pending look, and with thousands of waits a wake per new
	// look made that quadratic.
	sleepUntil time.Time
	scans      int // reads of pending, for tests
}

// runLook is one wait's next look at its run.
type runLook struct {
	id     uuid.UUID
	at     time.Time     // when it is due
	early  time.Duration // how long before at it may be taken with another due look
	result chan runLooked
}

// runLooked is the outcome of a batched look at one run.
type runLooked struct {
	end   store.RunEnd
	found bool  // the run is in the live table; else its waiter looks on its own
	err   error // Kagzi's error (dbError)
}

// lookAt schedules a look at run id in d; its outcome arrives on the look's result.
// The caller drops the look when it stops waiting for it.
func (c *Client) lookAt(id uuid.UUID, d time.Duration) *runLook {
	l := &runLook{id: id, at: time.Now().Add(d), early: d / 4, result: make(chan runLooked, 1)}
	ls := &c.looks
	ls.mu.Lock()
	if ls.pending == nil {
		ls.pending, ls.wake = map[*runLook]struct{}{}, make(chan struct{}, 1)
	}
	ls.pending[l] = struct{}{}
	start := !ls.running
	ls.running = true
	wake := !start && !ls.sleepUntil.IsZero() && l.at.Before(ls.sleepUntil)
	ls.mu.Unlock()
	if start {
		go c.looker()
	} else if wake {
		ls.wakeLooker()
	}
	return l
}

// wakeLooker ends the looker's sleep (a wake already sent will do).
func (ls *runLooks) wakeLooker() {
	select {
	case ls.wake <- struct{}{}:
	default:
	}
}

// dropLook forgets a look that was not taken yet. The last one ends the looker's
// sleep, so that it ends rather than sleep until a look nobody waits for.
func (c *Client) dropLook(l *runLook) {
	ls := &c.looks
	ls.mu.Lock()
	delete(ls.pending, l)
	wake := len(ls.pending) == 0 && !ls.sleepUntil.IsZero()
	ls.mu.Unlock()
	if wake {
		ls.wakeLooker()
	}
}

// looker takes the due looks, each round all of those due within their early
// window, until none is pending.
func (c *Client) looker() {
	ls := &c.looks
	for {
		ls.mu.Lock()
		ls.sleepUntil = time.Time{}
		if len(ls.pending) == 0 {
			ls.running = false
			ls.mu.Unlock()
			return
		}
		ls.scans++
		now := time.Now()
		var due []*runLook
		var next time.Time
		for l := range ls.pending {
			if !l.at.Add(-l.early).After(now) {
				due = append(due, l)
				delete(ls.pending, l)
			} else if next.IsZero() || l.at.Before(next) {
				next = l.at
			}
		}
		if len(due) == 0 {
			ls.sleepUntil = next
		}
		ls.mu.Unlock()
		if len(due) > 0 {
			c.lookNow(due)
			continue
		}
		t := time.NewTimer(time.Until(next))
		select {
		case <-t.C:
		case <-ls.wake:
		}
		t.Stop()
	}
}

// lookNow reads the runs of due looks in one statement and hands each look its outcome.
func (c *Client) lookNow(due []*runLook) {
	ctx, cancel := context.WithTimeout(context.Background(), lookTimeout)
	defer cancel()
	c.awaitEnds(ctx) // before the look: an end after it notifies this client
	ids := make([]uuid.UUID, 0, len(due))
	seen := make(map[uuid.UUID]bool, len(due))
	for _, l := range due {
		if !seen[l.id] {
			seen[l.id] = true
			ids = append(ids, l.id)
		}
	}
	ends, err := store.LookAtRuns(ctx, c.pool, c.ns, ids)
	if err != nil {
		const op = "kagzi: wait: look at runs"
		if ctx.Err() != nil && !errors.Is(err, context.Canceled) {
			err = &UnavailableError{Op: op, Err: err} // lookTimeout passed: nothing written
		} else {
			err = dbError(op, err)
		}
	}
	byID := make(map[uuid.UUID]store.RunEnd, len(ends))
	for _, e := range ends {
		byID[e.RunID] = e
	}
	for _, l := range due {
		e, found := byID[l.id]
		l.result <- runLooked{end: e, found: found, err: err}
	}
}
