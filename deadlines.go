package kagzi

import (
	"context"
	"strconv"
	"time"

	"github.com/kagzi/kagzi/internal/store"
)

// How a worker fails the runs whose deadline passed while they waited (failOverdue).
const (
	overdueBatch = 500                    // runs failed per statement
	overdueGap   = 100 * time.Millisecond // the least time between two sweeps
	overduePoll  = time.Minute            // a sweep at least this often, in case news was lost
)

// failOverdue fails the namespace's runs whose deadline passed while no worker could
// claim them: every slot of their workers busy, or no worker of their type running.
// (A run a worker executes has a timer of its own, and a claim of a run past its
// deadline fails it without running it.) Each sweep is one statement
// (store.FailOverdueRuns) that also tells when the namespace's next deadline passes;
// a start with a deadline announces it (store.DeadlineTopic). So a worker sweeps when
// a deadline passes, not on a short poll.
func (w *Worker) failOverdue(ctx context.Context) {
	sub := w.client.notifier.Subscribe(store.DeadlineTopic(w.client.ns))
	defer sub.Close()
	timer := time.NewTimer(0)
	defer timer.Stop()
	var (
		fireAt   = time.Now()  // when the timer fires: at once, for the first sweep
		dbOffset time.Duration // the database's clock minus ours, as of the last sweep
		lastRun  time.Time
	)
	at := func(t time.Time) {
		now := time.Now()
		if earliest := lastRun.Add(overdueGap); t.Before(earliest) {
			t = earliest
		}
		// A set fireAt is a fire not taken yet, even when its time has passed: a Reset
		// to a later time would discard it (see claimLoop.setTimer).
		if !fireAt.IsZero() && !t.Before(fireAt) {
			return
		}
		fireAt = t
		timer.Reset(t.Sub(now))
	}
	backoff := 100 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return
		case n := <-sub.C:
			if n.Topic == "" { // the listener reconnected: news may have been lost
				at(time.Now())
			} else if ms, err := strconv.ParseInt(n.Extra, 10, 64); err == nil {
				at(time.UnixMilli(ms).Add(-dbOffset))
			}
			continue
		case <-sub.Missed: // a deadline's announcement was dropped: sweep, and learn the next
			at(time.Now())
			continue
		case <-timer.C:
			fireAt = time.Time{}
		}
		lastRun = time.Now()
		failed, next, dbNow, err := store.FailOverdueRuns(ctx, w.client.pool, w.client.ns, overdueBatch)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.logger.Warn("kagzi: failing runs past their deadline failed; retrying", "error", err, "retry_in", backoff)
			at(time.Now().Add(backoff))
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		dbOffset = dbNow.Sub(time.Now())
		if failed > 0 {
			w.logger.Info("kagzi: failed runs that passed their deadline while they waited", "runs", failed)
		}
		switch {
		case failed == overdueBatch:
			at(time.Now())
		case next != nil && next.Sub(dbNow) < overduePoll:
			at(time.Now().Add(next.Sub(dbNow)))
		default:
			at(time.Now().Add(overduePoll))
		}
	}
}
