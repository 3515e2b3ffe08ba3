package kagzi

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/kagzi/kagzi/internal/store"
)

// Runs alone. WorkerConfig.MaxTakeovers bounds the takeovers of a run whose step kills
// its process every time. But every run executing in a process that dies is taken
// over, so the count cannot tell that run from its neighbours (found from outside:
// four healthy runs failed RECOVERY_EXHAUSTED with one that called os.Exit). So a run
// claimed with MaxTakeovers takeovers or more (a suspect) is not failed: the worker
// that claims it holds it (leased, its lease renewed, not executing), and starts it
// when nothing else executes in the worker, alone; it claims nothing and takes no
// eager start meanwhile. Before its function runs, the execution records that it runs
// alone (aloneKey: its takeover count and lease epoch). A claim that takes the run over
// from that very execution (the next epoch, or the one after when a reap moved it on:
// a reap stamps the record) fails it RECOVERY_EXHAUSTED without running it: it killed
// its process alone (or froze past its lease, or lost its database, alone). A suspect
// whose execution alone ended without being taken over is cleared at that count: its
// next executions run as any run's do, until another takeover. Its neighbours, alone
// in their turn, complete.
//
// A worker has one suspect in flight at most (held, or executing for less than
// soloStarve), so that a run alone that kills its process takes no other suspect with
// it: the other suspects a claim returns go back, in their place in the queue when the
// worker is idle (other workers take them), else parked for soloWindow
// (store.ParkRuns: its next claims would take them straight back). One exception: a
// suspect descending from a suspect that executes starts beside it, since its
// ancestor may be waiting for it. The runs of the claim that are not suspects start:
// the held suspect waits for them. Executing, for the worker, counts the goroutines of
// steps with a timeout that have not returned, abandoned or not.
//
// Nothing here waits without bound (earlier versions did, and a worker could stop for
// good: a suspect waiting in a branch for its own child, a parent waiting for children
// while the worker waited for it to end):
//   - A worker holding a suspect drains (claims nothing) for soloWindow at most; then
//     it claims again and starts the suspect beside its runs (not recorded alone).
//   - A suspect runs alone for soloWindow at most: its record is then rewritten to say
//     it no longer runs alone, and the worker claims again (its children, say).
//
// An idle worker whose claim met a suspect claims one run at a time next. Alone in its
// worker, not in its process: another worker of the same process goes on. A run whose
// step kills its process only after its window alone is failed when taken over more
// than hardTakeovers times in all.

// aloneKey is the key of the record that a suspect executes alone (aloneMark). A
// step's or a patch's key always ends in '#' and a count ("name#2", "id#patch1"),
// so none can be this one.
const aloneKey = "kagzi#alone"

// aloneMark is the record under aloneKey. Reaped is the epoch a reap of the
// execution's dead worker gave the run (store: the reaps stamp it).
type aloneMark struct {
	Alone     bool  `json:"alone"`
	Takeovers int   `json:"takeovers"`
	Epoch     int64 `json:"epoch"`
	Reaped    int64 `json:"reaped,omitempty"`
}

// readMark returns the run's aloneMark, if it has one.
func readMark(run store.ClaimedRun) (aloneMark, bool) {
	rec, ok := run.Steps[aloneKey]
	if !ok {
		return aloneMark{}, false
	}
	var m aloneMark
	if json.Unmarshal(rec.Output, &m) != nil {
		return aloneMark{}, false
	}
	return m, true
}

// diedAlone reports whether this claim took the run over from the execution that
// recorded it ran alone: one takeover since, and the claim's epoch follows that
// execution's (directly, or through the reap that stamped the record).
func diedAlone(run store.ClaimedRun) bool {
	m, ok := readMark(run)
	return ok && m.Alone && run.Takeovers == m.Takeovers+1 &&
		(run.Epoch == m.Epoch+1 || (run.Epoch == m.Epoch+2 && m.Reaped == m.Epoch+1))
}

// clearedAlone reports whether the run executed alone at its current takeover count
// and was not taken over since: it did not kill its process.
func clearedAlone(run store.ClaimedRun) bool {
	m, ok := readMark(run)
	return ok && m.Alone && run.Takeovers == m.Takeovers
}

// hardTakeovers is how many takeovers fail a run whatever it did alone.
func hardTakeovers(maxTakeovers int) int { return 2*maxTakeovers + 1 }

// exhausted reports whether the claim fails the run, without running it: it was
// taken over past the limit, and killed its process alone or past hardTakeovers.
func exhausted(run store.ClaimedRun, maxTakeovers int) bool {
	return maxTakeovers >= 0 && run.Takeovers > maxTakeovers &&
		(diedAlone(run) || run.Takeovers > hardTakeovers(maxTakeovers))
}

// suspect reports whether the run, taken over MaxTakeovers times or more, is to run
// alone. A run to be cancelled or past its deadline ends without running: it is not.
func (w *Worker) suspect(run store.ClaimedRun) bool {
	return w.cfg.MaxTakeovers > 0 && run.Takeovers >= w.cfg.MaxTakeovers && !run.CancelRequested &&
		(run.Deadline == nil || run.Deadline.After(run.DBNow)) && !exhausted(run, w.cfg.MaxTakeovers) &&
		!clearedAlone(run)
}

// soloWindow is how long a suspect runs alone at most, and how long a worker drains
// for one at a time.
func (w *Worker) soloWindow() time.Duration {
	return max(3*w.cfg.LeaseDuration, 5*time.Second)
}

// soloBlocks reports whether runs alone keep the worker from claiming and taking
// eager starts: one executes alone, or the worker drains for one it holds (w.mu held).
func (w *Worker) soloBlocks(now time.Time) bool {
	return w.soloX != nil || (w.held != nil && now.Before(w.drainUntil))
}

// executingLocked counts what executes code in the worker, or is about to: active
// runs not held and not finishing, eager starts in flight, and the goroutines of steps
// with a timeout that have not returned (an abandoned one runs on: it may be what
// kills the process) (w.mu held).
func (w *Worker) executingLocked() int {
	n := len(w.active) - w.finishing + w.reserved + int(w.stepGoroutines.Load())
	if w.held != nil {
		n--
	}
	return n
}

// suspectsExecutingLocked returns the runs of the suspects that execute, and whether
// one of them is still recent enough to keep other suspects out of the worker (it
// began less than soloStarve ago) (w.mu held).
func (w *Worker) suspectsExecutingLocked() (ids []uuid.UUID, recent bool) {
	for id, x := range w.active {
		if x.suspect && x != w.held && !x.finishing {
			ids = append(ids, id)
			recent = recent || time.Since(x.launched) < w.soloStarve()
		}
	}
	return ids, recent
}

// soloStarve is how long a suspect executing keeps the other suspects out of its
// worker: a healthy run longer than its window alone is not joined by a run that may
// kill it (both would be taken over, neither alone), but a suspect that waits for
// ever (for a signal, in a branch) does not keep the others out for ever.
func (w *Worker) soloStarve() time.Duration { return 10 * w.soloWindow() }

// sortSuspects takes the runs a claim returned and returns those to start now, the
// suspects among them that descend from a suspect executing (beside), and the suspect
// to hold (nil: none). The other suspects go back: see above.
func (w *Worker) sortSuspects(ctx context.Context, claimed []store.ClaimedRun) (start, beside []store.ClaimedRun,
	hold *store.ClaimedRun) {
	n := 0
	for _, r := range claimed {
		if w.suspect(r) {
			n++
		}
	}
	if n == 0 && !w.claimOne {
		return claimed, nil, nil
	}
	w.mu.Lock()
	idle := w.executingLocked() == 0 && w.held == nil && w.soloX == nil
	w.claimOne = n > 0 && idle
	if n == 0 {
		w.mu.Unlock()
		return claimed, nil, nil
	}
	executing, recent := w.suspectsExecutingLocked()
	inFlight := w.held != nil || w.soloX != nil || recent
	w.mu.Unlock()
	var back, park []store.Fence
	for i, r := range claimed {
		switch {
		case !w.suspect(r):
			// Started: the held suspect waits for it to end (a hand-back would spend
			// its type's rate window again).
			start = append(start, r)
		case hold == nil && !inFlight:
			hold = &claimed[i]
		case idle:
			back = append(back, r.Fence)
		case len(executing) > 0 && w.descends(ctx, r, executing):
			beside = append(beside, r)
		default:
			park = append(park, r.Fence)
		}
	}
	w.giveBack(ctx, back, park)
	return start, beside, hold
}

// descends reports whether the run descends from one of the runs (its ancestors as
// read now; an error reads as no).
func (w *Worker) descends(ctx context.Context, run store.ClaimedRun, of []uuid.UUID) bool {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.LeaseDuration)
	defer cancel()
	ancestors, err := store.Ancestors(actx, w.client.pool, run.RunID)
	if err != nil {
		w.logger.Warn("kagzi: cannot read a run's ancestors", "error", err, "run_id", run.RunID)
		return false
	}
	for _, a := range ancestors {
		for _, id := range of {
			if a == id {
				return true
			}
		}
	}
	return false
}

// giveBack hands back runs in their place in the queue (back) and parks others for
// soloWindow (park). What it cannot give back is handed back before the next claim.
func (w *Worker) giveBack(ctx context.Context, back, park []store.Fence) {
	if len(back) == 0 && len(park) == 0 {
		return
	}
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.LeaseDuration)
	defer cancel()
	var failed []store.Fence
	if len(back) > 0 {
		if err := store.ReleaseRunsInPlace(bctx, w.client.pool, back); err != nil {
			failed = append(failed, back...)
		}
	}
	if len(park) > 0 {
		if err := store.ParkRuns(bctx, w.client.pool, park, w.soloWindow()); err != nil {
			failed = append(failed, park...)
		}
	}
	if len(failed) > 0 {
		w.mu.Lock()
		w.lostRuns = append(w.lostRuns, failed...)
		w.mu.Unlock()
		w.claimSoon()
		w.logger.Warn("kagzi: cannot hand back runs the worker may not execute now; trying again",
			"runs", len(failed))
	}
}

// hold keeps a claimed suspect, leased to the worker (its heartbeats renew it), until
// runHeld starts it; beside start as suspects, in free slots (a claim's runs ahead of
// its free slots may be among them: see ahead.go). limited: the types that had limits
// when the claim read them (see startClaimed).
func (w *Worker) hold(run *store.ClaimedRun, beside []store.ClaimedRun, sent, claimedAt time.Time, limited map[string]bool) {
	w.startClaimed(beside, sent, claimedAt, limited, true)
	if run == nil {
		return
	}
	x := newExecution(w.rt, w.defs[run.WorkflowType], *run, sent, claimedAt)
	x.suspect, x.short = true, !limited[run.WorkflowType]
	w.mu.Lock()
	if w.claimedBeforeLimitsLocked(run.WorkflowType, sent, x.short) && x.ctx.Err() == nil {
		// Claimed by a claim sent before the worker learnt that its type's limits
		// were set (see limitsSet): it goes back, to be claimed under them.
		w.mu.Unlock()
		w.giveBackUnstarted([]*execution{x}, false)
		return
	}
	w.logger.Warn("kagzi: a run taken over MaxTakeovers times is to run alone in its worker: it fails if it "+
		"kills its process there", "run_id", run.RunID, "takeovers", run.Takeovers)
	w.addActiveLocked(x)
	w.held = x
	w.drainUntil = time.Now().Add(w.soloWindow())
	time.AfterFunc(w.soloWindow(), w.soloChanged)
	w.mu.Unlock()
	// A held run cancelled, past its deadline or whose lease was lost starts at once
	// (it runs no code), not at the end of the drain.
	context.AfterFunc(x.ctx, w.soloChanged)
	w.runHeld()
}

// soloChanged starts what may start now, and has the loop claim.
func (w *Worker) soloChanged() {
	w.runHeld()
	w.claimSoon()
}

// runHeld starts the held suspect: alone when nothing else executes in the worker;
// beside its runs once the drain passed. A held run whose context ended (lease lost,
// cancelled) starts at once: it runs no code.
func (w *Worker) runHeld() {
	w.mu.Lock()
	x := w.held
	if x == nil || !w.accepting {
		w.mu.Unlock()
		return
	}
	switch {
	case x.ctx.Err() != nil:
	case w.soloX == nil && w.executingLocked() == 0:
		x.alone, w.soloX = true, x
	case !time.Now().Before(w.drainUntil):
	default:
		w.mu.Unlock()
		return
	}
	w.held = nil
	x.launched = time.Now()
	w.mu.Unlock()
	w.launch(x)
}

// launch runs an execution on a goroutine of its own.
func (w *Worker) launch(x *execution) {
	w.rt.goroutines.Go(func() { w.execute(x) })
}

// soloDoneLocked notes the end of an execution for runs alone, and reports whether the
// held suspect may start or the worker claim now (w.mu held).
func (w *Worker) soloDoneLocked(x *execution) bool {
	if w.soloX == x {
		w.soloX = nil
	}
	return x.suspect || w.held != nil
}

// dropHeld hands back the suspect the worker holds, when it stops (in its place in
// the queue), or when its pool was closed (nothing to write: lost).
func (w *Worker) dropHeld(closed bool) {
	w.mu.Lock()
	x := w.held
	w.held = nil
	if x != nil {
		delete(w.active, x.run.RunID)
	}
	w.mu.Unlock()
	if x != nil {
		w.giveBackUnstarted([]*execution{x}, closed)
	}
}

// forgetHeldLocked drops the held suspect when the worker claimed its run again: its
// lease ran out while held (w.mu held). Its execution ends without running.
func (w *Worker) forgetHeldLocked(x *execution) {
	if w.held == x {
		w.held = nil
		x.cancel(errLeaseLost)
		go x.rt.endExecution(x, OutcomeLeaseLost, nil) // not under w.mu
	}
}

// claimSoon makes the claim loop claim now.
func (w *Worker) claimSoon() {
	select {
	case w.lostDue <- struct{}{}:
	default:
	}
}

// markAlone records that the execution runs alone, before its function runs, and
// ends its window alone after soloWindow. A record that cannot be written leaves the
// run to execute beside others.
func (w *Worker) markAlone(x *execution) {
	if err := x.writeMark(true); err != nil {
		x.log().Warn("kagzi: cannot record that the run executes alone; it executes beside others", "error", err)
		if errors.Is(err, errLeaseLost) {
			x.cancel(errLeaseLost)
		}
		w.endAlone(x)
		return
	}
	time.AfterFunc(w.soloWindow(), func() { w.soloWindowEnded(x) })
}

// soloWindowEnded ends the window of a suspect that still runs alone: its record is
// rewritten to say it no longer does, and the worker claims again.
func (w *Worker) soloWindowEnded(x *execution) {
	w.mu.Lock()
	still := w.soloX == x
	w.mu.Unlock()
	if !still {
		return
	}
	if err := x.writeMark(false); err != nil && !errors.Is(err, errLeaseLost) {
		x.log().Error("kagzi: cannot record that the run no longer executes alone: if its process dies now, "+
			"it may fail RECOVERY_EXHAUSTED", "error", err)
	}
	w.endAlone(x)
}

// endAlone ends the execution's time alone.
func (w *Worker) endAlone(x *execution) {
	w.mu.Lock()
	if w.soloX == x {
		w.soloX = nil
	}
	w.mu.Unlock()
	w.soloChanged()
}

// writeMark records the execution's aloneMark.
func (x *execution) writeMark(alone bool) error {
	out, err := json.Marshal(aloneMark{Alone: alone, Takeovers: x.run.Takeovers, Epoch: x.run.Epoch})
	if err != nil {
		return err
	}
	return x.writeNow(func(ctx context.Context, db *writer) error {
		return store.RecordMarker(ctx, db.pool, store.ResultStep{Fence: x.run.Fence, Key: aloneKey, Output: out})
	})
}
