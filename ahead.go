package kagzi

import (
	"context"
	"slices"
	"time"

	"github.com/kagzi/kagzi/internal/store"
)

// Runs claimed ahead. A worker sends its next claim as soon as it has started the last
// claim's runs, and those still hold their slots: with short runs, each claim finds
// free only the slots that ended during the claim before, about half of them, and a
// claim's fixed cost is paid for few runs. So a claim may take runs beyond the free
// slots (WorkerConfig.ClaimAhead): they wait in the worker, leased to it (its
// heartbeats renew them), in claim order, and each starts when a slot frees. At most
// MaxConcurrent runs execute at once, as before.
//
// The runs ahead of one claim are at most the slots that were freed during the
// claim before: about what will be freed during this one, and none while the runs
// are long (runs would wait in this worker while another has free slots). Only a
// claim that takes the short way takes runs ahead (store.Claimer.Ahead: types without
// flow limits), since under a limit a claimed run counts as started (a rate window's
// start). A run that waited aheadHold without a slot goes back to its place in the
// queue, and so does every run waiting when the worker stops, and every run of a type
// whose limits are set while it waits (limitsSet: claimed without them, it would start
// under them uncounted). One that is cancelled, passes its deadline or loses its lease
// while it waits starts as the others do, and runs no code.

// aheadHold is how long a run claimed ahead waits for a slot before it goes back
// (Worker.aheadHold, which tests change).
const aheadHold = 250 * time.Millisecond

// claimRoom returns how many runs the next claim may take in the free slots, and how
// many beyond them (see above). It notes the slots freed so far: its answer counts
// those freed while it ran (claimAnsweredLocked).
func (w *Worker) claimRoom() (free, ahead int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.freedMark = w.freed
	if w.soloBlocks(time.Now()) {
		return 0, 0 // see solo.go
	}
	free = w.cfg.MaxConcurrent - w.slotsTakenLocked()
	if w.claimOne {
		return min(free, 1), 0
	}
	if w.held != nil || !w.aheadShort {
		return free, 0
	}
	return free, max(min(w.cfg.ClaimAhead-len(w.ahead), w.freedDuring), 0)
}

// claimAnsweredLocked notes what a claim's answer says for the next claim's runs ahead
// (w.mu held): the slots freed while it ran (from its send, freedMark, to now), none
// when it got fewer runs than it asked for (no backlog) or failed; and whether it took
// the short way.
func (w *Worker) claimAnsweredLocked(short, backlog bool) {
	w.aheadShort = short
	w.freedDuring = 0
	if backlog {
		w.freedDuring = w.freed - w.freedMark
	}
}

// aheadRoom reports whether a claim now would take runs ahead (with no free slot, the
// claim loop asks after a full claim).
func (w *Worker) aheadRoom() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.aheadShort && w.held == nil && !w.claimOne && !w.soloBlocks(time.Now()) &&
		w.freedDuring > 0 && len(w.ahead) < w.cfg.ClaimAhead
}

// slotsTakenLocked counts the slots taken: runs executing (active, not finishing, not
// waiting ahead) and slots reserved for eager starts (w.mu held).
func (w *Worker) slotsTakenLocked() int {
	return len(w.active) - w.finishing - len(w.ahead) + w.reserved
}

// startClaimed executes the runs of a claim (suspects that start beside a suspect
// executing: see solo.go): in the free slots, the rest as slots free. sent is when the
// claim was sent, claimedAt when its answer came; limited the types that had limits
// when the claim read them (store.ClaimReport.Limited): the runs of the others were
// claimed without limits (see limitsSet).
func (w *Worker) startClaimed(runs []store.ClaimedRun, sent, claimedAt time.Time, limited map[string]bool, suspects bool) {
	if len(runs) == 0 {
		return
	}
	w.sawWork.Store(claimedAt.UnixNano())
	xs := make([]*execution, len(runs))
	for i, run := range runs {
		xs[i] = newExecution(w.rt, w.defs[run.WorkflowType], run, sent, claimedAt)
		xs[i].aheadSince, xs[i].short = claimedAt, !limited[run.WorkflowType]
		if suspects {
			xs[i].suspect, xs[i].launched = true, claimedAt
		}
	}
	var start, back []*execution
	w.mu.Lock()
	held := w.held
	for _, x := range xs {
		w.addActiveLocked(x)
		if x.ctx.Err() != nil {
			// Cancelled, past its deadline, or failed for killing its process alone: it
			// runs no code, and starts now (a hand-back would lose its verdict).
			start = append(start, x)
			continue
		}
		if w.claimedBeforeLimitsLocked(x.run.WorkflowType, sent, x.short) {
			// Claimed without its type's limits, which the worker learnt were set
			// while the claim was on its way (see limitsSet).
			delete(w.active, x.run.RunID)
			back = append(back, x)
			continue
		}
		x.ahead = true
		w.ahead = append(w.ahead, x)
	}
	if len(back) > 0 {
		w.aheadBacks.Add(1) // the drain waits for it
	}
	start = append(start, w.takeAheadLocked()...)
	waiting := len(w.ahead) > 0 && !w.aheadTimer
	w.aheadTimer = w.aheadTimer || waiting
	forgot := held != nil && w.held != held // addActiveLocked dropped it (its lease ran out)
	w.mu.Unlock()
	for _, x := range start {
		w.launch(x)
	}
	if waiting {
		time.AfterFunc(w.aheadHold, w.aheadExpired)
	}
	if len(back) > 0 {
		w.giveBackUnstarted(back, false)
		w.aheadBacks.Done()
	}
	if forgot || len(back) > 0 {
		w.runHeld()
	}
}

// takeAheadLocked takes the runs waiting ahead that free slots can start now, in
// claim order (w.mu held); the caller launches them.
func (w *Worker) takeAheadLocked() []*execution {
	n := min(len(w.ahead), w.cfg.MaxConcurrent-w.slotsTakenLocked())
	if n <= 0 || w.soloX != nil {
		return nil
	}
	return w.popAheadLocked(n)
}

// popAheadLocked takes the first n runs waiting ahead off the queue (w.mu held).
func (w *Worker) popAheadLocked(n int) []*execution {
	xs := make([]*execution, n)
	copy(xs, w.ahead)
	clear(w.ahead[:n])
	w.ahead = w.ahead[n:]
	for _, x := range xs {
		x.ahead = false
	}
	return xs
}

// aheadExpired gives back the runs that waited aheadHold for a slot, and looks again
// when the next one will have, while runs wait.
func (w *Worker) aheadExpired() {
	w.mu.Lock()
	cut := time.Now().Add(-w.aheadHold)
	n := 0
	for n < len(w.ahead) && !w.ahead[n].aheadSince.After(cut) {
		n++
	}
	back := w.dropAheadLocked(n)
	again := len(w.ahead) > 0
	var next time.Duration
	if again {
		next = max(time.Until(w.ahead[0].aheadSince.Add(w.aheadHold)), time.Millisecond)
	}
	w.aheadTimer = again
	if len(back) > 0 {
		w.aheadBacks.Add(1) // the drain waits for it
	}
	w.mu.Unlock()
	if again {
		time.AfterFunc(next, w.aheadExpired)
	}
	if len(back) > 0 {
		w.logger.Debug("kagzi: runs claimed ahead found no free slot; handing them back", "runs", len(back))
		w.giveBackUnstarted(back, false)
		w.aheadBacks.Done()
		// What was to execute in the worker went back: a held suspect may start now
		// (it waits for nothing else to execute; see solo.go).
		w.runHeld()
	}
}

// dropAheadLocked takes the first n runs waiting ahead out of the worker (w.mu held).
func (w *Worker) dropAheadLocked(n int) []*execution {
	if n == 0 {
		return nil
	}
	back := w.popAheadLocked(n)
	for _, x := range back {
		if w.active[x.run.RunID] == x {
			delete(w.active, x.run.RunID)
		}
	}
	return back
}

// dropAhead gives back every run waiting ahead: the worker stops (closed: its pool
// was closed, nothing can be written; their leases give them to other workers).
func (w *Worker) dropAhead(closed bool) {
	w.mu.Lock()
	back := w.dropAheadLocked(len(w.ahead))
	w.mu.Unlock()
	w.giveBackUnstarted(back, closed)
	w.aheadBacks.Wait() // and those aheadExpired is handing back
}

// giveBackUnstarted hands back runs the worker holds and did not start (runs that
// waited ahead, a held suspect), in their place in the queue (giveBack: what cannot
// be handed back now is handed back before the next claim, or by the drain); closed:
// its pool was closed, nothing can be written, their leases give them to other
// workers. Their executions end without running.
func (w *Worker) giveBackUnstarted(xs []*execution, closed bool) {
	if len(xs) == 0 {
		return
	}
	if closed {
		for _, x := range xs {
			x.cancel(errLeaseLost)
			x.rt.endExecution(x, OutcomeLeaseLost, nil)
		}
		return
	}
	fences := make([]store.Fence, len(xs))
	for i, x := range xs {
		fences[i] = x.run.Fence
		x.cancel(errShutdown)
	}
	w.giveBack(context.Background(), fences, nil)
	for _, x := range xs {
		x.rt.endExecution(x, OutcomeHandedBack, nil)
	}
}

// limitsSet hands back the runs of a workflow type that wait ahead (and the suspect it
// holds, if of the type), claimed without limits (execution.short), when the type's
// limits are set (by this process's client, or, heard of from its notification, by
// another's): claimed before the limits applied, they would start under a concurrency
// limit beside the runs it already counts, and under a rate outside its windows. It
// notes when: the runs of the type that a claim sent before then brings back later go
// back too (startClaimed).
func (w *Worker) limitsSet(workflowType string) {
	w.mu.Lock()
	if w.limitsAt == nil {
		w.limitsAt = map[string]time.Time{}
	}
	w.limitsAt[workflowType] = time.Now()
	var back []*execution
	kept := w.ahead[:0]
	for _, x := range w.ahead {
		if x.run.WorkflowType != workflowType || !x.short {
			kept = append(kept, x) // one claimed under the limits keeps its place in them
			continue
		}
		x.ahead = false
		if w.active[x.run.RunID] == x {
			delete(w.active, x.run.RunID)
		}
		back = append(back, x)
	}
	clear(w.ahead[len(kept):])
	w.ahead = kept
	if x := w.held; x != nil && x.run.WorkflowType == workflowType && x.short {
		// A held suspect (solo.go) was claimed without the limits too: it would start
		// alone later, under a rate limit outside its windows.
		w.held = nil
		if w.active[x.run.RunID] == x {
			delete(w.active, x.run.RunID)
		}
		back = append(back, x)
	}
	if len(back) > 0 {
		w.aheadBacks.Add(1) // the drain waits for it
	}
	w.mu.Unlock()
	if len(back) > 0 {
		w.logger.Debug("kagzi: the limits of a type were set; handing back its runs claimed ahead",
			"workflow_type", workflowType, "runs", len(back))
		w.giveBackUnstarted(back, false)
		w.aheadBacks.Done()
		w.runHeld() // as after aheadExpired's hand-back
	}
}

// claimedBeforeLimitsLocked reports whether a run of a claim sent at sent, claimed
// without limits (short: its type had none when the claim read it) or not, was claimed
// without its type's limits that the worker learnt were set after sent (w.mu held). A
// run claimed under its type's limits keeps its place: handed back, it would have
// spent a place of a rate's window for nothing.
func (w *Worker) claimedBeforeLimitsLocked(workflowType string, sent time.Time, short bool) bool {
	at, ok := w.limitsAt[workflowType]
	return ok && short && !sent.After(at)
}

// limitsFound hands back the runs waiting ahead, and the held suspect, claimed without
// limits, of the types a claim found limited (ClaimReport.Limited): the notification
// that said so may not have been read yet.
func (w *Worker) limitsFound(limited map[string]bool) {
	if len(limited) == 0 {
		return
	}
	for _, t := range w.shortTypes() {
		if limited[t] {
			w.limitsSet(t)
		}
	}
}

// limitsCheck hands back the runs waiting ahead, and the held suspect, claimed without
// limits, of those of their types that have limits now, read from the database: for
// when the notification that said so may have been missed (the subscription
// overflowed, the listener reconnected). When the read fails, all of them go back
// (better claimed again than started under limits).
func (w *Worker) limitsCheck(ctx context.Context) {
	types := w.shortTypes()
	if len(types) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.LeaseDuration)
	limited, err := store.LimitedTypes(rctx, w.client.pool, w.client.ns, types)
	cancel()
	if err != nil {
		w.logger.Warn("kagzi: could not read which types have limits; handing back the runs claimed ahead", "error", err)
		limited = types
	}
	for _, t := range limited {
		w.limitsSet(t)
	}
}

// shortTypes lists the workflow types of the runs waiting ahead and of the held
// suspect that were claimed without limits, once each.
func (w *Worker) shortTypes() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var types []string
	add := func(x *execution) {
		if x.short && !slices.Contains(types, x.run.WorkflowType) {
			types = append(types, x.run.WorkflowType)
		}
	}
	for _, x := range w.ahead {
		add(x)
	}
	if w.held != nil {
		add(w.held)
	}
	return types
}

// forgetAheadLocked drops a run waiting ahead whose run the worker claimed again (its
// lease ran out while it waited) (w.mu held). Its execution ends without running.
func (w *Worker) forgetAheadLocked(x *execution) {
	for i, y := range w.ahead {
		if y == x {
			w.ahead = append(w.ahead[:i:i], w.ahead[i+1:]...)
			x.ahead = false
			x.cancel(errLeaseLost)
			go x.rt.endExecution(x, OutcomeLeaseLost, nil) // not under w.mu
			return
		}
	}
}
