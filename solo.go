package kagzi

import (
	"context"
	"strconv"

	"github.com/kagzi/kagzi/internal/store"
)

// Runs alone. WorkerConfig.MaxTakeovers bounds the takeovers of a run whose step kills
// its process every time. But every run executing in a process that dies is taken
// over, so the count cannot tell that run from its neighbours: runs beside one that
// called os.Exit failed with it (found from outside: four healthy runs failed
// RECOVERY_EXHAUSTED with the one that killed its process, 3 of 3). So a run past the
// limit (a suspect) is not failed at once: the worker that claims it runs it alone,
// when nothing else executes in it, and claims nothing else meanwhile. Before its
// function runs, the execution records the count it runs alone at (soloKey, a step of
// no position, which replays skip); a suspect taken over again after that died alone,
// and the claim that finds it so fails it RECOVERY_EXHAUSTED. Its neighbours, run
// alone in their turn, complete.
//
// A worker with runs in flight when it claims a suspect hands it back (in its place
// in the queue, ahead of the runs queued after it) and claims nothing more until its
// runs are done: then the suspect is its next claim's first run. The other runs that
// claim took are handed back too. Other workers of the process are not held: a
// suspect runs alone in its worker, not in its process.

// soloKey is the key and name of the step recording that a run runs alone, with the
// takeover count it runs at as its output. A name with '#' cannot be a step's.
const soloKey = "kagzi#alone"

// diedAlone reports whether the run, taken over more than MaxTakeovers times, was taken
// over after it ran alone: its step kills its process.
func diedAlone(run store.ClaimedRun) bool {
	rec, ok := run.Steps[soloKey]
	if !ok {
		return false
	}
	at, err := strconv.Atoi(string(rec.Output))
	return err == nil && run.Takeovers > at
}

// suspect reports whether the run is past the takeover limit and is to run alone.
func (w *Worker) suspect(run store.ClaimedRun) bool {
	return w.cfg.MaxTakeovers >= 0 && run.Takeovers > w.cfg.MaxTakeovers && !diedAlone(run)
}

// sortSuspects takes the runs a claim returned and returns those to start now, with
// the one to run alone (solo; nil when none): a suspect among them runs alone when
// the worker executes nothing else, and the others go back; with runs in flight, the
// suspects go back and the worker waits for its runs to end (soloWanted).
func (w *Worker) sortSuspects(ctx context.Context, claimed []store.ClaimedRun) (start []store.ClaimedRun,
	solo *store.ClaimedRun) {
	n := 0
	for _, r := range claimed {
		if w.suspect(r) {
			n++
		}
	}
	if n == 0 {
		return claimed, nil
	}
	w.mu.Lock()
	idle := len(w.active) == 0 && w.reserved == 0 && !w.soloing
	if idle {
		w.soloing = true // eager starts and claims stop now
	} else {
		w.soloWanted = true
	}
	w.mu.Unlock()
	var back []store.Fence
	for i, r := range claimed {
		switch {
		case !w.suspect(r) && !idle, diedAlone(r):
			start = append(start, r) // diedAlone: fails at once, without running
		case w.suspect(r) && idle && solo == nil:
			solo = &claimed[i]
		default:
			back = append(back, r.Fence)
		}
	}
	if len(back) > 0 {
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.LeaseDuration)
		defer cancel()
		if err := store.ReleaseRunsInPlace(bctx, w.client.pool, back); err != nil {
			// Their leases pass, and another claim takes them: a takeover counted.
			w.logger.Warn("kagzi: cannot hand back the runs claimed beside a run to execute alone", "error", err,
				"runs", len(back))
		}
	}
	if solo != nil {
		w.logger.Warn("kagzi: a run taken over more than MaxTakeovers times runs alone: it fails if it kills its "+
			"process again", "run_id", solo.RunID, "takeovers", solo.Takeovers)
	}
	return start, solo
}

// markSolo records that the execution runs alone (see soloKey), before its function
// runs.
func (x *execution) markSolo() error {
	return x.writeNow(func(ctx context.Context, db *writer) error {
		return db.recordResult(ctx, store.ResultStep{Fence: x.run.Fence, Key: soloKey, Name: soloKey,
			Kind: KindPatch, Status: StepCompleted, Output: []byte(strconv.Itoa(x.run.Takeovers))})
	})
}
