package kagzi

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi/internal/store"
)

// Dead-process detection. A worker's lease bounds how long its runs wait after its
// process dies (10 s by default). A process that died can be told from one that is
// slow: its database sessions end. So a worker holds a session-level advisory lock on
// a connection of its own (its liveness lock, on a random key it records in the
// registry), and every ReapInterval it looks, on that same connection, for workers of
// its namespace whose lock no session holds: it marks them OFFLINE and makes their runs
// claimable at once (store.ReapDeadWorkers). A stalled process (SIGSTOP, a long GC
// pause) keeps its connection and its lock: its lease and fencing govern it as before.
// A process that loses only that connection clears its key as soon as it notices, so
// that its runs are not taken from it; until then (at most a ReapInterval), they may be.

// DefaultReapInterval is WorkerConfig.ReapInterval when none is given.
const DefaultReapInterval = 500 * time.Millisecond

// liveness holds the worker's liveness lock and reaps dead workers until ctx ends.
func (w *Worker) liveness(ctx context.Context) {
	key := rand.Int64N(1<<62) + 1 // positive: see store.ReapDeadWorkers
	var conn *pgx.Conn
	var since time.Time // when conn took the lock
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	t := time.NewTicker(w.cfg.ReapInterval)
	defer t.Stop()
	for {
		if conn == nil {
			if conn = w.lockLiveness(ctx, key); conn != nil {
				since = time.Now()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if conn == nil {
			continue
		}
		// After a database restart every worker takes its lock again (each tries every
		// ReapInterval), some later than others: a worker reaps only once its own lock
		// is four intervals old.
		if time.Since(since) < 4*w.cfg.ReapInterval {
			if err := conn.Ping(ctx); err != nil && ctx.Err() == nil {
				conn = w.lostLiveness(conn, key, err)
			}
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, w.cfg.HeartbeatInterval)
		workers, runs, err := store.ReapDeadWorkers(rctx, conn, w.client.ns)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			conn = w.lostLiveness(conn, key, err)
		case workers > 0:
			w.logger.Warn("kagzi: workers whose process died are OFFLINE; their runs are claimable now",
				"workers", workers, "runs", runs)
		}
	}
}

// lockLiveness opens the liveness connection, takes the lock and records its key;
// nil when it cannot (the next tick tries again).
func (w *Worker) lockLiveness(ctx context.Context, key int64) *pgx.Conn {
	cctx, cancel := context.WithTimeout(ctx, w.cfg.HeartbeatInterval)
	defer cancel()
	conn, err := w.client.connectDirect(cctx)
	if err != nil {
		w.logger.Debug("kagzi: cannot open the liveness connection yet", "error", err)
		return nil
	}
	ok, err := store.LockLiveness(cctx, conn, key)
	if err == nil && ok {
		err = store.SetLivenessKey(cctx, w.client.pool, w.client.ns, w.cfg.ID, key)
	}
	if err != nil || !ok {
		w.logger.Debug("kagzi: cannot take the liveness lock yet", "error", err, "taken_by_another", err == nil)
		conn.Close(context.Background())
		return nil
	}
	return conn
}

// lostLiveness closes a liveness connection that failed and clears the worker's key,
// so that no reaper takes its runs while it lives without its lock.
func (w *Worker) lostLiveness(conn *pgx.Conn, key int64, err error) *pgx.Conn {
	w.logger.Warn("kagzi: the liveness connection failed; leases alone keep this worker's runs until it is back",
		"error", err)
	conn.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.HeartbeatInterval)
	defer cancel()
	if err := store.SetLivenessKey(ctx, w.client.pool, w.client.ns, w.cfg.ID, 0); err != nil {
		w.logger.Warn("kagzi: cannot clear the worker's liveness key", "error", err)
	}
	return nil
}
