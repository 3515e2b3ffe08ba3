package kagzi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kagzi/kagzi/internal/notifier"
	"github.com/kagzi/kagzi/internal/store"
)

// claimLoop is the state of a worker's loop of claims (see Worker.loop).
type claimLoop struct {
	w        *Worker
	timer    *time.Timer
	claimNow bool
	// more: runs may be claimable that the last claim left (it filled every free
	// slot), or that were announced since. A freed slot claims only then: after a
	// claim that took all there was, nothing can have become claimable unannounced
	// (the timer covers what becomes claimable later).
	more    bool
	backoff time.Duration
	wakeAt  time.Time // when the timer fires
	askedAt time.Time // when NextWake was last asked
	// answer is when the last NextWake answer said the next run becomes claimable (the
	// poll's time when it knew of none): until then, a claim that leaves slots free
	// need not ask again, as long as every time announced since is on the timer. The
	// timer holds one time; forgot records that it let go of an announced time before
	// the answer's (a later one than its own, or its own that an earlier one replaced),
	// which only NextWake can find again.
	answer time.Time
	forgot bool
	// passedRetry is how long the loop waited after its last claim, when that claim
	// passed over concurrency keys that other claims held (zero when it did not).
	passedRetry time.Duration
	// checkLimits: notifications may have been lost; before its next claim the loop
	// reads which types of the runs it holds claimed without limits have limits now
	// (Worker.limitsCheck).
	checkLimits bool
}

// loop claims runs until ctx is done, or the pool is closed (ErrClosed).
func (w *Worker) loop(ctx context.Context, sub *notifier.Subscription) error {
	l := &claimLoop{w: w, timer: time.NewTimer(0), claimNow: true, more: true, backoff: 100 * time.Millisecond}
	defer l.timer.Stop()
	// A closed pool ends Run with ErrClosed; this probe notices one within a quarter
	// second even while the worker has nothing to claim.
	probe := time.NewTicker(closedPoolProbe)
	defer probe.Stop()
	for {
		for l.claimNow && ctx.Err() == nil {
			// Notifications that arrived during the last claim first: claims back to
			// back would leave them unread, among them a type's limits set (the runs
			// claimed ahead of it must go back before they start: see ahead.go), and
			// cancels.
			for more := true; more; {
				select {
				case n := <-sub.C:
					l.notified(n)
				case <-sub.Missed:
					l.missed()
				default:
					more = false
				}
			}
			l.claimNow = false // (a notification may have set it: this claim serves it)
			if l.checkLimits {
				l.checkLimits = false
				w.limitsCheck(ctx)
			}
			full, report, err := w.claim(ctx)
			if err := l.claimed(ctx, full, report, err); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-probe.C:
			if w.client.poolClosed() {
				w.logger.Error("kagzi: the pool was closed; the worker stops")
				return fmt.Errorf("kagzi: worker %s: %w", w.cfg.ID, ErrClosed)
			}
		case <-l.timer.C:
			l.wakeAt = time.Time{}
			l.claimNow = true
		case <-w.slotFree:
			l.claimNow = l.more
		case <-w.floorHit:
			l.claimNow, l.more = true, true
		case <-w.lostDue:
			l.claimNow = true // handLostBack goes first
		case n := <-sub.C:
			l.notified(n)
			// Take what else has arrived before claiming: one claim serves every run
			// announced so far (those that came in while the last claim ran would each
			// call for a claim of their own, most finding their runs claimed).
			for more := true; more; {
				select {
				case n := <-sub.C:
					l.notified(n)
				default:
					more = false
				}
			}
		case <-sub.Missed:
			l.missed()
		}
	}
}

// missed: notifications came faster than the loop took them and some were dropped:
// what they announced is known only to the database now (among them, perhaps, a
// type's limits set: the next claim looks first, see limitsCheck).
func (l *claimLoop) missed() {
	l.claimNow, l.more, l.forgot, l.checkLimits = true, true, true, true
	l.keysMayBeFreed()
}

// setTimer makes the loop claim at t (at the latest a PollInterval from now), unless
// the timer already fires sooner.
func (l *claimLoop) setTimer(t time.Time) {
	now := time.Now()
	if poll := now.Add(l.w.cfg.PollInterval); t.IsZero() || t.After(poll) {
		t = poll
	}
	// A wakeAt that is set is a fire the loop has not taken yet, even when its time has
	// passed: Reset would discard it (Go 1.23 timers), and the runs it was set for
	// would wait for the next time instead (a second, for sleepers announcing wake
	// times while the fire for the first of them waited to be taken).
	if !l.wakeAt.IsZero() {
		if !t.Before(l.wakeAt) {
			l.forget(t)
			return
		}
		l.forget(l.wakeAt)
	}
	l.wakeAt = t
	l.timer.Reset(time.Until(t))
}

// answerStands reports that the last NextWake answer still holds: its time has not
// come, no announced time before it was let go, and no lease taken since it was asked
// can expire before it.
func (l *claimLoop) answerStands() bool {
	return !l.forgot && l.answer.After(time.Now()) && !l.answer.After(l.askedAt.Add(l.w.cfg.LeaseDuration))
}

// forget notes that the timer let go of the time t: when t comes before the last
// answer's time, a claim must ask NextWake again rather than wait for the answer.
func (l *claimLoop) forget(t time.Time) {
	if t.Before(l.answer) {
		l.forgot = true
	}
}

// claimed decides what follows a claim that got every run it asked for (full) or
// fewer, with what the claim reported (keys passed over, a rate limit's hold), or
// failed. It returns an error only when the loop must end (a closed pool, or a schema
// the worker's claims do not match).
func (l *claimLoop) claimed(ctx context.Context, full bool, report store.ClaimReport, err error) error {
	w := l.w
	keysPassed := report.KeysPassed > 0
	switch {
	case err != nil:
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrClosed) {
			w.logger.Error("kagzi: the pool was closed; the worker stops", "error", err)
			return err
		}
		if errors.Is(err, ErrSchemaNotMigrated) {
			// No claim can succeed until someone migrates (or deploys the version that
			// did): the worker stops, visibly, instead of retrying for ever.
			w.logger.Error("kagzi: the worker stops: its claims do not match the database's schema", "error", err)
			return err
		}
		l.more, l.forgot = true, true
		w.logger.Warn("kagzi: claim failed; retrying", "error", err, "retry_in", l.backoff)
		l.wakeAt = time.Time{}
		l.setTimer(time.Now().Add(l.backoff))
		l.backoff = min(l.backoff*2, 5*time.Second)
		return nil
	case full:
		l.more = true
		l.claimNow = w.freeSlots() > 0 || w.aheadRoom() // more work may be waiting
	case l.answerStands():
		// Fewer runs than free slots, and the last answer's time has not come:
		// nothing that answer saw has become claimable, a run that becomes claimable
		// later announces its time (a start, a sleep, a retry notifies) and the timer
		// kept every such time before the answer's, and a lease taken since expires a
		// lease from now, after it. Asking again would repeat the answer. (The timer
		// may have fired at an announced time: it waits for the answer again.)
		l.more = false
		l.setTimer(l.answer)
	default:
		// Fewer runs than free slots: ask when the next one becomes claimable. (Asking
		// in the claim's own batch costs every claim that statement, and most claims
		// under load fill their slots.)
		l.more, l.forgot = false, false
		l.askedAt = time.Now()
		next, err := store.NextWake(ctx, w.client.pool, w.claimer)
		w.wakeAsks.Add(1)
		l.wakeAt, l.answer = time.Time{}, time.Time{}
		switch {
		case err != nil:
			l.setTimer(time.Time{})
		case next == nil:
			l.setTimer(time.Time{})
			l.answer = l.wakeAt // nothing known before the poll
		default:
			l.setTimer(*next)
			l.answer = *next
		}
	}
	l.backoff = 100 * time.Millisecond
	if !full && !report.RateNext.IsZero() {
		// A rate window held runs back: they become claimable when it admits again,
		// which nothing announces (an answer asked before they were started knew
		// nothing of them). The time is the database's, as an announced time is.
		l.setTimer(report.RateNext)
	}
	if !keysPassed || full {
		l.passedRetry = 0
		return nil
	}
	// Other claims held keys this one passed over, and a holder may not take a held
	// key's next run (another version's worker, or its room ran out): the
	// notification that announced the run was spent, and only a claim after the
	// holder's commit can tell. Soon, not at once: the holder is a claim under way.
	// Each claim in a row that passes keys over waits twice as long (up to the
	// poll), so that workers whose claims keep meeting on full keys do not poll
	// each other every few milliseconds.
	l.passedRetry = min(max(2*l.passedRetry, passedKeysRetry), w.cfg.PollInterval)
	l.more = true
	l.setTimer(time.Now().Add(l.passedRetry))
	return nil
}

// notified handles a notification: a cancel of a run this worker may execute, runs
// claimable now (or at a time: the timer), or "look again" after the listener
// reconnected.
func (l *claimLoop) notified(n notifier.Notification) {
	switch {
	case n.Topic == store.CancelTopic(l.w.client.ns):
		l.w.cancelRun(n.Extra)
	case n.Topic == "":
		// The listener reconnected: notifications may have been missed, among them
		// runs that became claimable below a floor.
		l.w.floors.Reset()
		l.w.keyFloors.Reset()
		l.keysMayBeFreed()
		l.claimNow, l.more, l.checkLimits = true, true, true
	default:
		l.w.sawWork.Store(time.Now().UnixNano()) // runs of its types, claimable now or at a time
		ms, freed, err := store.KeyFreed(n.Extra)
		if store.LimitsSet(n.Extra) {
			l.w.limitsSet(l.w.wakeTypes[n.Topic]) // see ahead.go
		}
		if freed {
			// A key's place was freed: the next claim looks further round the ring.
			l.w.claimer.KeysFreed[l.w.wakeTypes[n.Topic]] = true
		}
		if err == nil {
			// A run of the type claimable from then on (in the database's time,
			// rounded to the millisecond): the claims read from there at the latest.
			l.w.floors.Lower(l.w.wakeTypes[n.Topic], time.UnixMilli(ms-1))
			l.w.keyFloors.Lower(l.w.wakeTypes[n.Topic], time.UnixMilli(ms-1))
		}
		if err != nil || time.Until(time.UnixMilli(ms)) <= 5*time.Millisecond {
			l.claimNow, l.more = true, true
		} else {
			l.setTimer(time.UnixMilli(ms))
		}
	}
}

// keysMayBeFreed makes the next claim look further round every type's ring of keys, as
// after hearing that a key's place was freed: notifications were lost, and one of them
// may have said so.
func (l *claimLoop) keysMayBeFreed() {
	for _, t := range l.w.types {
		l.w.claimer.KeysFreed[t] = true
	}
}

// passedKeysRetry is how soon a worker claims again after a claim that left slots
// free passed over concurrency keys that other claims held: a claim holds a key's
// lock for its transaction, a few milliseconds. (Claims in a row that pass keys over
// wait twice as long each time: claimLoop.passedRetry.)
const passedKeysRetry = 20 * time.Millisecond

// claim claims up to the free slots and starts executing what it got. full reports
// that it got as many runs as it asked for, or had no free slot (a freed slot calls
// again); report what else the claim said (see store.ClaimReport).
func (w *Worker) claim(ctx context.Context) (full bool, report store.ClaimReport, err error) {
	w.handLostBack(ctx)
	free, ahead := w.claimRoom()
	if free <= 0 && ahead <= 0 {
		return true, report, nil
	}
	free = max(free, 0)
	began := time.Now()
	// A claim that reached the database commits whatever happens to ctx afterwards, so
	// it is never abandoned half way: its runs would stay leased to a worker that
	// dropped them until the lease passed. It is bounded by the lease instead, and the
	// runs of a claim that returns after ctx ended are handed back (see drain).
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.LeaseDuration)
	w.claimer.Finishing, w.claimer.Ahead = w.finishingPlaces(), ahead
	claimed, report, err := store.ClaimRuns(cctx, w.client.pool, w.claimer, free)
	cancel()
	asked := report.Asked
	if err != nil {
		asked = free + ahead
	}
	w.hookClaim(ctx, asked, len(claimed), began, err)
	w.mu.Lock()
	w.claimAnsweredLocked(report.Short, err == nil && len(claimed) == asked)
	w.mu.Unlock()
	if err == nil {
		// A type of the runs waiting ahead may have limits whose notification the loop
		// has not read yet.
		w.limitsFound(report.Limited)
	}
	if err != nil {
		w.lostClaim(report, began, err)
		return false, report, dbError("kagzi: claim", err)
	}
	if ctx.Err() != nil {
		w.mu.Lock()
		for _, run := range claimed {
			w.handBack = append(w.handBack, run.Fence)
		}
		w.mu.Unlock()
		return false, store.ClaimReport{}, nil
	}
	now := time.Now()
	start, beside, hold := w.sortSuspects(ctx, claimed)
	w.startClaimed(start, began, now, report.Limited, false)
	w.hold(hold, beside, began, now, report.Limited)
	w.backlog.Store(asked > 0 && len(claimed) == asked)
	if len(claimed) < asked {
		// The claim had room for whatever a freed key held back, and looked for it.
		clear(w.claimer.KeysFreed)
	}
	return len(claimed) == asked, report, nil
}
