package kagzi

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/kagzi/kagzi/internal/store"
)

// A worker's maintenance loops, each one of the services Worker.Run starts: the
// heartbeat that keeps its runs' leases, and the pruning of finished runs past the
// client's retention. (Failing waiting runs past their deadline: deadlines.go.)

// heartbeat extends the leases of all the worker's runs and refreshes its registry
// row, one statement per beat. Runs the beat no longer holds are cancelled with
// errLeaseLost; runs whose cancel was requested are cancelled with ErrCancelled.
// When beats fail for longer than a lease, every run is given up: another worker
// may hold them by now.
func (w *Worker) heartbeat(ctx context.Context) {
	t := time.NewTicker(w.cfg.HeartbeatInterval)
	defer t.Stop()
	registered := true
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !registered { // the database was unreachable at start
			registered = w.register(ctx) == nil
		}
		w.mu.Lock()
		held := make([]store.Fence, 0, len(w.active))
		execs := make(map[uuid.UUID]*execution, len(w.active))
		for id, x := range w.active {
			held = append(held, x.run.Fence)
			execs[id] = x
		}
		w.mu.Unlock()
		beat := time.Now()
		bctx, cancel := context.WithTimeout(ctx, w.cfg.HeartbeatInterval)
		res, err := store.Heartbeat(bctx, w.client.pool, w.beat(), held, w.cfg.LeaseDuration)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.logger.Warn("kagzi: heartbeat failed", "error", err, "runs", len(held))
			for _, x := range execs {
				if monoNow() > x.leaseUntil.Load() {
					x.cancel(errLeaseLost)
				}
			}
			continue
		}
		w.lastBeat.Store(beat.UnixNano())
		kept := make(map[uuid.UUID]bool, len(res))
		for _, r := range res {
			kept[r.RunID] = true
			x := execs[r.RunID]
			if r.Extended {
				x.extendLease(beat, w.cfg.LeaseDuration)
			}
			if r.CancelRequested {
				x.cancel(ErrCancelled)
			}
		}
		for id, x := range execs {
			if !kept[id] {
				x.cancel(errLeaseLost)
			}
		}
	}
}

// prune deletes finished runs past the retention (none when it is negative), a few
// small batches per interval so that no statement holds many locks for long, and the
// flow-control rate windows no limit can count any more.
func (w *Worker) prune(ctx context.Context) {
	t := time.NewTicker(w.cfg.PruneInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := store.PruneFlowRates(ctx, w.client.pool, w.client.ns); err != nil && ctx.Err() == nil {
			w.logger.Warn("kagzi: pruning rate windows failed", "error", err)
		}
		if w.client.retention >= 0 {
			w.pruneFinished(ctx)
		}
	}
}

func (w *Worker) pruneFinished(ctx context.Context) {
	var total int64
	for range 10 {
		n, err := store.PruneFinished(ctx, w.client.pool, w.client.ns, w.client.retention, 500)
		if err != nil {
			if ctx.Err() == nil {
				w.logger.Warn("kagzi: pruning finished runs failed", "error", err)
			}
			break
		}
		total += n
		if n < 500 {
			break
		}
	}
	if total > 0 {
		w.pruned.Add(total)
		w.logger.Info("kagzi: pruned finished runs", "runs", total, "retention", w.client.retention)
	}
}
