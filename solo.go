package kagzi

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/kagzi/kagzi/internal/store"
)

// Runs alone. WorkerConfig.MaxTakeovers bounds the takeovers of a run whose step kills
// its process every time. But every run executing in a process that dies is taken
// over, so the count cannot tell that run from its neighbours (found from outside:
// four healthy runs failed RECOVERY_EXHAUSTED with one that called os.Exit). So a run
// claimed with MaxTakeovers takeovers or more (a suspect) is not failed: the worker
// that claims it holds it (leased, its lease renewed, not executing) and starts it
// when nothing else executes in the worker, alone; it claims nothing and takes no
// eager start meanwhile. Before its function runs, the execution records that it runs
// alone (aloneKey: its takeover count and lease epoch). A claim that takes the run over
// from that very execution (the next epoch, or the one after when a reap moved it on:
// a reap stamps the record) fails it RECOVERY_EXHAUSTED without running it: it killed
// its process alone. A suspect whose execution alone ended without being taken over is
// cleared at that count: its next executions run as any run's do, until another
// takeover. Its neighbours, alone in their turn, complete.
//
// Nothing here waits without bound (an earlier version did, and a worker could stop
// for good: a suspect waiting in a branch for its own child, a parent waiting for
// children while the worker waited for it to end):
//   - A worker holding a suspect drains (claims nothing) for soloWindow at most; past
//     that, the suspect starts beside the worker's runs (its record does not say
//     alone), unless another suspect executes: then it waits for that one, and drains
//     again when it ends. The worker claims while it waits.
//   - A suspect runs alone for soloWindow at most: its record is then rewritten to say
//     it no longer runs alone, and the worker claims again (its children, say).
//
// A worker that claims suspects keeps them (other workers are not stalled by a run
// handed back to the head of the queue), holds back a suspect until the runs it
// executes end, and, while its claims return suspects, claims one run at a time. An
// idle worker that claims a suspect hands back the other runs of that claim (in their
// place in the queue). Alone in its worker, not in its process: another worker of the
// same process goes on. A run whose step kills its process only after its window
// alone is failed when taken over more than hardTakeovers times in all.

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
	return w.soloX != nil || (len(w.held) > 0 && now.Before(w.drainUntil))
}

// sortSuspects takes the runs a claim returned and returns those to start now and
// the suspects to hold. With the worker idle, the runs of the claim that are neither
// (runs the claim fails at once run no code) go back in their place in the queue.
func (w *Worker) sortSuspects(ctx context.Context, claimed []store.ClaimedRun) (start, hold []store.ClaimedRun) {
	n := 0
	for _, r := range claimed {
		if w.suspect(r) {
			n++
		}
	}
	w.mu.Lock()
	w.claimOne = n > 0
	if n == 0 {
		w.mu.Unlock()
		return claimed, nil
	}
	idle := w.executingLocked() == 0 && w.soloX == nil
	w.mu.Unlock()
	var back []store.Fence
	for _, r := range claimed {
		switch {
		case w.suspect(r):
			hold = append(hold, r)
		case idle && !exhausted(r, w.cfg.MaxTakeovers):
			back = append(back, r.Fence)
		default:
			start = append(start, r)
		}
	}
	if len(back) > 0 {
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.LeaseDuration)
		defer cancel()
		if err := store.ReleaseRunsInPlace(bctx, w.client.pool, back); err != nil {
			// Handed back before the next claim, not taken over when their leases pass.
			w.mu.Lock()
			w.lostRuns = append(w.lostRuns, back...)
			w.mu.Unlock()
			w.claimSoon()
			w.logger.Warn("kagzi: cannot hand back runs claimed beside a run to execute alone; trying again",
				"error", err, "runs", len(back))
		}
	}
	return start, hold
}

// executingLocked counts the runs that execute code in the worker, or are about to:
// active runs not held and not finishing, and eager starts in flight (w.mu held).
func (w *Worker) executingLocked() int {
	return len(w.active) - len(w.held) - w.finishing + w.reserved
}

// hold keeps claimed suspects, leased to the worker (its heartbeats renew them), until
// runHeld starts them.
func (w *Worker) hold(runs []store.ClaimedRun, sent, claimedAt time.Time) {
	if len(runs) == 0 {
		return
	}
	xs := make([]*execution, len(runs))
	for i, run := range runs {
		xs[i] = newExecution(w.rt, w.defs[run.WorkflowType], run, sent, claimedAt)
		xs[i].suspect = true
		w.logger.Warn("kagzi: a run taken over MaxTakeovers times is to run alone in its worker: it fails if it "+
			"kills its process there", "run_id", run.RunID, "takeovers", run.Takeovers)
	}
	w.mu.Lock()
	if len(w.held) == 0 {
		w.drainFor()
	}
	for _, x := range xs {
		w.addActiveLocked(x)
		w.held = append(w.held, x)
	}
	w.mu.Unlock()
	w.runHeld()
}

// drainFor starts a drain of the worker for a suspect it holds (w.mu held).
func (w *Worker) drainFor() {
	w.drainUntil = time.Now().Add(w.soloWindow())
	time.AfterFunc(w.soloWindow(), w.soloChanged)
}

// soloChanged starts what may start now, and has the loop claim.
func (w *Worker) soloChanged() {
	w.runHeld()
	w.claimSoon()
}

// runHeld starts the first held suspect: alone when nothing else executes in the
// worker; beside its runs once the drain passed, unless another suspect executes.
// A held run whose context ended (lease lost, cancelled) starts at once: it runs no
// code.
func (w *Worker) runHeld() {
	w.mu.Lock()
	var launch []*execution
	for len(w.held) > 0 && w.accepting {
		x := w.held[0]
		switch {
		case x.ctx.Err() != nil:
		case w.soloX == nil && w.executingLocked() == 0:
			x.alone, w.soloX = true, x
		case w.soloX == nil && w.suspectsRunning == 0 && !time.Now().Before(w.drainUntil):
			if len(w.held) > 1 {
				w.drainFor()
			}
		default:
			w.mu.Unlock()
			w.launch(launch)
			return
		}
		w.held = w.held[1:]
		w.suspectsRunning++
		launch = append(launch, x)
		if x.alone {
			break
		}
	}
	w.mu.Unlock()
	w.launch(launch)
}

// launch runs executions on goroutines of their own.
func (w *Worker) launch(xs []*execution) {
	for _, x := range xs {
		w.rt.goroutines.Go(func() { w.execute(x) })
	}
}

// soloDoneLocked notes the end of an execution for runs alone, and reports whether a
// held suspect may start or the worker claim now (w.mu held).
func (w *Worker) soloDoneLocked(x *execution) bool {
	if !x.suspect {
		return w.soloX == nil && len(w.held) > 0
	}
	if w.soloX == x {
		w.soloX = nil
	}
	w.suspectsRunning--
	if len(w.held) > 0 {
		w.drainFor() // the next suspect: the worker drains again
	}
	return true
}

// dropHeldLocked hands back the suspects the worker holds, when it stops (w.mu held).
func (w *Worker) dropHeldLocked() {
	for _, x := range w.held {
		x.cancel(errShutdown)
		delete(w.active, x.run.RunID)
		w.handBack = append(w.handBack, x.run.Fence)
	}
	w.held = nil
}

// forgetHeldLocked drops a held suspect whose run the worker claimed again: its lease
// ran out while held (w.mu held).
func (w *Worker) forgetHeldLocked(x *execution) {
	for i, h := range w.held {
		if h == x {
			x.cancel(errLeaseLost)
			w.held = append(w.held[:i:i], w.held[i+1:]...)
			return
		}
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
