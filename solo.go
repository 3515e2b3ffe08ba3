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
// taken over MaxTakeovers times (a suspect) is not failed: it runs alone in the worker
// that claims it, which then executes and claims nothing else, and before its function
// runs the execution records that it runs alone (aloneKey: the takeover count and the
// lease epoch it runs at). A suspect taken over once more after such an execution
// killed its process alone, and the claim that finds it so fails it
// RECOVERY_EXHAUSTED without running it. Its neighbours run alone in their turn, and
// complete.
//
// Nothing here waits without bound (an earlier version did, and a worker could stop
// for good):
//   - A worker that claims a suspect while it executes other runs hands the suspect
//     back (in its place in the queue), and claims nothing more until its runs are
//     done (wantAlone), for at most soloWindow: a parent among them may be waiting
//     for children that only this worker would claim. Past that, for another window,
//     the suspects it claims run beside its other runs (shareUntil), recorded so.
//   - A suspect runs alone for at most soloWindow: it may itself wait for children
//     that only its worker would claim. Then its record says it no longer runs alone,
//     and the worker claims again.
//   - While suspects come back from its claims, the worker claims one run at a time,
//     so that it does not claim, and hand back, a batch for each of them.
//
// Alone in its worker, not in its process: another worker of the same process goes
// on. And a run whose step kills its process only after its window alone is failed
// when taken over more than hardTakeovers times in all.

// aloneKey is the key of the record of how a suspect's last execution ran (aloneMark).
// A step's or a patch's key always ends in '#' and a count ("name#2", "id#patch1"), so
// none can be this one.
const aloneKey = "kagzi#alone"

// aloneMark is the record under aloneKey.
type aloneMark struct {
	Alone     bool  `json:"alone"`
	Takeovers int   `json:"takeovers"`
	Epoch     int64 `json:"epoch"`
}

// diedAlone reports whether the run was taken over once since an execution recorded
// that it ran alone, and that execution's lease is the one that passed: its epoch is
// the run's last but one (the claim's takeover) or last but two (a reap moved the
// epoch on before the claim).
func diedAlone(run store.ClaimedRun) bool {
	rec, ok := run.Steps[aloneKey]
	if !ok {
		return false
	}
	var m aloneMark
	if json.Unmarshal(rec.Output, &m) != nil {
		return false
	}
	return m.Alone && run.Takeovers == m.Takeovers+1 && run.Epoch > m.Epoch && run.Epoch <= m.Epoch+2
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
		(run.Deadline == nil || run.Deadline.After(run.DBNow)) && !exhausted(run, w.cfg.MaxTakeovers)
}

// soloWindow is how long a suspect runs alone at most, and how long a worker holds
// back its claims for one.
func (w *Worker) soloWindow() time.Duration {
	return max(3*w.cfg.LeaseDuration, 5*time.Second)
}

// soloBlocks reports whether a run alone keeps the worker from claiming and taking
// eager starts: one executes alone, or one waits for the worker's runs to end (w.mu
// held).
func (w *Worker) soloBlocks(now time.Time) bool {
	return w.soloRun != uuid.Nil || (!w.wantAlone.IsZero() && now.Before(w.wantAlone) && len(w.active)+w.reserved > 0)
}

// soloBeforeClaim ends a wait for the worker's runs to end (wantAlone) when they have,
// or when its time is up: then suspects run beside other runs for a window.
func (w *Worker) soloBeforeClaim() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.wantAlone.IsZero() {
		return
	}
	now := time.Now()
	switch {
	case !now.Before(w.wantAlone):
		w.shareUntil = now.Add(w.soloWindow())
	case len(w.active)+w.reserved > 0:
		return
	}
	w.wantAlone = time.Time{}
}

// sortSuspects takes the runs a claim returned and returns those to start now, and
// the one of them to run alone (nil when none): with the worker idle, its first
// suspect runs alone and the others go back (except runs the claim fails at once,
// which run no code); with runs in flight, suspects go back and the worker waits for
// its runs to end, or, past such a wait, run beside them.
func (w *Worker) sortSuspects(ctx context.Context, claimed []store.ClaimedRun) (start []store.ClaimedRun,
	solo *store.ClaimedRun) {
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
	now := time.Now()
	idle := len(w.active)+w.reserved == 0 && w.soloRun == uuid.Nil
	share := !idle && now.Before(w.shareUntil)
	var back []store.Fence
	for i, r := range claimed {
		switch {
		case exhausted(r, w.cfg.MaxTakeovers):
			start = append(start, r)
		case idle && solo == nil && w.suspect(r):
			solo = &claimed[i]
			w.soloRun = r.RunID // claims and eager starts stop now
		case idle || (w.suspect(r) && !share):
			back = append(back, r.Fence)
		default:
			start = append(start, r)
		}
	}
	if solo == nil && len(back) > 0 && w.wantAlone.IsZero() {
		w.wantAlone = now.Add(w.soloWindow())
		time.AfterFunc(w.soloWindow(), w.claimSoon)
	}
	w.mu.Unlock()
	if len(back) > 0 {
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.LeaseDuration)
		defer cancel()
		if err := store.ReleaseRunsInPlace(bctx, w.client.pool, back); err != nil {
			// Handed back at the next claim, not taken over when their leases pass.
			w.mu.Lock()
			w.lostRuns = append(w.lostRuns, back...)
			w.mu.Unlock()
			w.logger.Warn("kagzi: cannot hand back runs claimed beside a run to execute alone; trying again",
				"error", err, "runs", len(back))
		}
	}
	if solo != nil {
		w.logger.Warn("kagzi: a run taken over MaxTakeovers times runs alone in its worker: it fails if it kills "+
			"its process again", "run_id", solo.RunID, "takeovers", solo.Takeovers)
	}
	return start, solo
}

// claimSoon makes the claim loop claim now.
func (w *Worker) claimSoon() {
	select {
	case w.lostDue <- struct{}{}:
	default:
	}
}

// markAlone records how a suspect's execution runs (alone or beside other runs)
// before its function runs. Executing alone, the record says so for soloWindow at
// most: then it says it no longer does, and the worker claims again.
func (w *Worker) markAlone(x *execution) {
	if err := x.writeMark(x.alone); err != nil {
		x.log().Warn("kagzi: cannot record how the run executes", "error", err)
		if errors.Is(err, errLeaseLost) {
			x.cancel(errLeaseLost)
		}
		return
	}
	if x.alone {
		time.AfterFunc(w.soloWindow(), func() { w.soloWindowEnded(x) })
	}
}

// soloWindowEnded ends the window of a suspect that still runs alone: once its
// record says it no longer does, the worker claims again. A record that cannot be
// written keeps the worker alone until the run's execution ends.
func (w *Worker) soloWindowEnded(x *execution) {
	w.mu.Lock()
	still := w.soloRun == x.run.RunID && w.active[x.run.RunID] == x
	w.mu.Unlock()
	if !still {
		return
	}
	if err := x.writeMark(false); err != nil {
		x.log().Warn("kagzi: cannot record that the run no longer executes alone; the worker claims nothing "+
			"until it ends", "error", err)
		return
	}
	w.mu.Lock()
	if w.soloRun == x.run.RunID {
		w.soloRun = uuid.Nil
	}
	w.mu.Unlock()
	w.claimSoon()
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
