package kagzi

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/kagzi/kagzi/internal/store"
)

// Lost claims. A claim (or an eager start, which inserts its run claimed by a worker
// of its process) that fails once it was sent may have committed all the same: the
// connection broke between the commit and its answer. Its runs are then RUNNING,
// leased to a worker that knows nothing of them: no execution, no heartbeat. They
// waited for their leases to pass, and the claim that took them then counted a
// takeover (found from outside: a run whose claims kept losing their answers failed
// with RECOVERY_EXHAUSTED without ever running). So the worker remembers such a
// claim's token (the claim draws it) and, before its next claim, hands back the runs
// still leased under it (store.LostClaimRuns, store.ReleaseRuns): PENDING, claimable
// at once, no takeover counted. An eager start's run has no token: its fence is the
// run's first epoch.

// lostTTL is how long, in leases, a lost claim is looked for: past it, its runs'
// leases passed long ago, and a claim took them over.
const lostTTL = 3

// lostClaim remembers the claim that failed with err (sent at sent, its report
// saying what it knows), when it may have committed, and the runs of one that did
// commit, which it could not hand back.
func (w *Worker) lostClaim(report store.ClaimReport, sent time.Time, err error) {
	if len(report.Unreleased) > 0 {
		w.mu.Lock()
		w.lostRuns = append(w.lostRuns, report.Unreleased...)
		w.mu.Unlock()
	}
	token := report.Token
	if token == uuid.Nil || !mayHaveCommitted(err) {
		return
	}
	l := store.LostClaim{Namespace: w.client.ns, Types: w.types, WorkerID: w.cfg.ID, Token: token,
		From: sent.Add(w.cfg.LeaseDuration), To: time.Now().Add(w.cfg.LeaseDuration), Lease: w.cfg.LeaseDuration}
	w.mu.Lock()
	w.lostClaims = append(w.lostClaims, l)
	w.mu.Unlock()
	w.logger.Warn("kagzi: a claim failed after it was sent; its runs, if it committed, are handed back at the next claim",
		"error", err)
}

// lostStart remembers the eager start of run (claimed by this worker in its insert)
// that failed with err, when it may have committed.
func (w *Worker) lostStart(run uuid.UUID, err error) {
	if !mayHaveCommitted(err) {
		return
	}
	w.mu.Lock()
	w.lostRuns = append(w.lostRuns, store.Fence{RunID: run, Epoch: 1})
	w.mu.Unlock()
	select { // the claim loop hands it back now, not at its next poll
	case w.lostDue <- struct{}{}:
	default:
	}
}

// handLostBack hands back the runs of lost claims and eager starts that are still
// leased under them. What it cannot do now (the database is still out of reach) it
// tries again before the next claim.
func (w *Worker) handLostBack(ctx context.Context) {
	w.mu.Lock()
	claims, fences := w.lostClaims, w.lostRuns
	w.lostClaims, w.lostRuns = nil, nil
	w.mu.Unlock()
	if len(claims) == 0 && len(fences) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.LeaseDuration)
	defer cancel()
	var keep []store.LostClaim
	for _, l := range claims {
		if time.Since(l.To) > lostTTL*w.cfg.LeaseDuration {
			continue
		}
		held, err := store.LostClaimRuns(ctx, w.client.pool, l)
		if err != nil {
			keep = append(keep, l)
			continue
		}
		fences = append(fences, held...)
	}
	var err error
	if len(fences) > 0 {
		err = store.ReleaseRuns(ctx, w.client.pool, fences)
	}
	if err == nil && len(fences) > 0 {
		w.logger.Info("kagzi: handed back the runs of claims whose answers were lost", "runs", len(fences))
	}
	w.mu.Lock()
	w.lostClaims = append(w.lostClaims, keep...)
	if err != nil {
		w.lostRuns = append(w.lostRuns, fences...)
	}
	w.mu.Unlock()
}
