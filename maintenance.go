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
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !w.registered.Load() { // the database was unreachable at start
			if err := w.register(ctx); err == nil {
				w.logger.Info("kagzi: worker registered", "worker", w.cfg.ID)
			}
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
		// Not cancelled with ctx: a stopping worker waits for its last beat's answer
		// rather than leave the statement to commit after its OFFLINE (see Run).
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.beatTimeout())
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
// flow-control rate windows no limit can count any more; it archives finished runs,
// and deletes the namespace's archived runs when its retention is shorter than the
// one the history's partitions go by. Before it archives, it registers the
// namespace's retention (store.HistoryHorizon): a process of another namespace that
// drops history partitions counts it, so no day this namespace archives into is
// dropped before its retention passes (found from outside: a namespace archiving for
// the first time lost runs to another's drops). The drops run on their own
// (dropHistory): a detach that waits for a long transaction does not hold archiving up.
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
		_, _, shorter, err := store.HistoryHorizon(ctx, w.client.pool, w.client.ns, w.client.retention)
		if err != nil {
			if ctx.Err() == nil {
				w.logger.Warn("kagzi: registering the namespace's retention failed; archiving waits for the next pass", "error", err)
			}
			continue
		}
		if w.client.archiveAfter >= 0 {
			w.archiveFinished(ctx)
		}
		if shorter {
			w.pruneArchived(ctx)
		}
	}
}

// archiveBatch is how many finished runs one archiving statement moves, and
// archivePass how many statements a pass runs at most.
const (
	archiveBatch = 1000
	archivePass  = 600
)

// archiveFinished moves the namespace's runs that finished more than ArchiveAfter ago
// into the history, a batch per statement, until none is left (or archivePass
// batches: the rest waits for the next pass).
func (w *Worker) archiveFinished(ctx context.Context) {
	total := w.inBatches(ctx, "archiving finished runs", archivePass, archiveBatch, func(ctx context.Context, n int) (int64, error) {
		return store.ArchiveFinished(ctx, w.client.pool, w.client.ns, w.client.archiveAfter, w.client.retention, n)
	})
	if total > 0 {
		w.archived.Add(total)
		w.logger.Debug("kagzi: archived finished runs", "runs", total)
	}
}

// dropHistory drops, every PruneInterval, the history partitions of the days past the
// longest retention of the namespaces (one process at a time, under a lease), unless
// a namespace whose rows are in a day's partition still keeps them, and attaches again
// the partitions of kept days an interrupted pass left detached (see
// store.DropHistoryBefore).
func (w *Worker) dropHistory(ctx context.Context) {
	t := time.NewTicker(w.cfg.PruneInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		horizon, droppable, _, err := store.HistoryHorizon(ctx, w.client.pool, w.client.ns, w.client.retention)
		if err != nil {
			if ctx.Err() == nil {
				w.logger.Warn("kagzi: reading the history's retention failed", "error", err)
			}
			continue
		}
		if !droppable {
			// Nothing to drop (a namespace keeps its runs for ever), but a pass still
			// attaches again what an interrupted one left detached.
			horizon = time.Time{}
		}
		// Without cancel: a lease taken as the worker stops is known, and released.
		ok, err := store.TakeHistoryDrops(context.WithoutCancel(ctx), w.client.pool, w.ID(), historyDropsLease)
		if err != nil {
			if ctx.Err() == nil {
				w.logger.Warn("kagzi: taking the history drops' lease failed", "error", err)
			}
			continue
		}
		if !ok {
			continue
		}
		var dropped []string
		if err = store.MarkHistoryDrops(ctx, w.client.pool, w.ID(), horizon); err == nil {
			dropped, err = w.dropUnderLease(ctx, horizon)
		}
		if err != nil && ctx.Err() == nil {
			w.logger.Warn("kagzi: dropping history partitions failed", "error", err)
		}
		if len(dropped) > 0 {
			w.historyDropped.Add(int64(len(dropped)))
			w.logger.Info("kagzi: dropped history partitions", "partitions", dropped, "before", horizon)
		}
		if err := store.ReleaseHistoryDrops(context.WithoutCancel(ctx), w.client.pool, w.ID()); err != nil && ctx.Err() == nil {
			w.logger.Warn("kagzi: releasing the history drops' lease failed", "error", err)
		}
	}
}

// dropUnderLease drops the history partitions before horizon, renewing the drops'
// lease every minute while it does: a pass that waits (a detach waits for the
// transactions that read the history) keeps its lease, and with it its mark, so no
// other pass begins meanwhile with another.
func (w *Worker) dropUnderLease(ctx context.Context, horizon time.Time) ([]string, error) {
	done := make(chan struct{})
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		t := time.NewTicker(time.Minute)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if _, err := store.TakeHistoryDrops(context.WithoutCancel(ctx), w.client.pool, w.ID(), historyDropsLease); err != nil && ctx.Err() == nil {
					w.logger.Warn("kagzi: renewing the history drops' lease failed", "error", err)
				}
			}
		}
	}()
	defer func() { close(done); <-renewed }()
	return store.DropHistoryBefore(ctx, w.client.pool, horizon)
}

// historyDropsLease is how long a pass of history drops holds its lease without
// renewing it (a process that died mid-pass leaves it for that long).
const historyDropsLease = 10 * time.Minute

// pruneArchived deletes the namespace's archived runs past its retention, which is
// shorter than the one the partitions' drops go by (or than for ever).
func (w *Worker) pruneArchived(ctx context.Context) {
	total := w.inBatches(ctx, "pruning archived runs", 10, 500, func(ctx context.Context, n int) (int64, error) {
		return store.PruneHistory(ctx, w.client.pool, w.client.ns, w.client.retention, n)
	})
	if total > 0 {
		w.pruned.Add(total)
		w.logger.Info("kagzi: pruned archived runs", "runs", total, "retention", w.client.retention)
	}
}

// pruneFinished deletes the namespace's finished runs still in the live tables past
// the retention, a few batches of 500 a pass.
func (w *Worker) pruneFinished(ctx context.Context) {
	total := w.inBatches(ctx, "pruning finished runs", 10, 500, func(ctx context.Context, n int) (int64, error) {
		return store.PruneFinished(ctx, w.client.pool, w.client.ns, w.client.retention, n)
	})
	if total > 0 {
		w.pruned.Add(total)
		w.logger.Info("kagzi: pruned finished runs", "runs", total, "retention", w.client.retention)
	}
}

// inBatches runs batch (what: for the log) up to passes times, size rows at a
// time, until a batch does less than size or fails, and returns the rows done.
func (w *Worker) inBatches(ctx context.Context, what string, passes, size int,
	batch func(ctx context.Context, size int) (int64, error)) int64 {
	var total int64
	for range passes {
		n, err := batch(ctx, size)
		if err != nil {
			if ctx.Err() == nil {
				w.logger.Warn("kagzi: "+what+" failed", "error", err)
			}
			break
		}
		total += n
		if n < int64(size) {
			break
		}
	}
	return total
}
