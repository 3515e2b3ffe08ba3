package kagzi

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi/internal/store"
)

// Dead-process detection. A worker's lease bounds how long its runs wait after its
// process dies (10 s by default). A process that died can be told from one that is
// slow: its database sessions end. So a worker holds a session-level advisory lock
// (its liveness lock, on a random key it records in the registry) on its client's
// direct connection, the one the client LISTENs on (all the client's workers share
// it: one connection per client, whatever its workers), and every ReapInterval it
// looks, on that same connection, for workers of its namespace whose lock no session
// holds: it marks them OFFLINE and makes their runs claimable at once
// (store.ReapDeadWorkers). A stalled process (SIGSTOP, a long GC pause) keeps its
// connection and its lock: its lease and fencing govern it as before. A process that
// loses only that connection clears its keys as soon as it notices, so that its runs
// are not taken from it; until then (at most a ReapInterval), they may be.
//
// The lock is session state: it needs a real session, not a pooler's transaction
// (Config.DirectConnConfig). A client without a direct connection
// (Config.DisableDirectConn) holds no liveness lock: its workers' runs are taken over
// when their leases pass.

// DefaultReapInterval is WorkerConfig.ReapInterval when none is given.
const DefaultReapInterval = 500 * time.Millisecond

// IdleReapFactor slows an idle worker's reaper: while no other worker of the
// namespace reported runs in hand at its last heartbeat and this one has seen no work
// (a run it claimed, a notification of runs to claim) for a HeartbeatInterval, it
// looks for dead workers every IdleReapFactor × ReapInterval (2 s by default). The
// look is most of an idle process's statements (two a second of its three by default).
// A worker that claims runs reports them at its next heartbeat, and every reaper looks
// every ReapInterval again from its next look on: only the runs of a worker that dies
// before that heartbeat, claimed without a notification the others heard (a start
// notifies them, and so does a sleep or a retry when it is recorded), can wait up to
// IdleReapFactor × ReapInterval after the death, still far less than their lease.
const IdleReapFactor = 4

// liveness is a worker's liveness lock, kept on the client's direct connection (a
// notifier.Keeper: its methods run on the listener's goroutine, one at a time).
type liveness struct {
	w        *Worker
	key      int64
	locked   bool // the lock is held on the current connection
	recorded bool // the registry holds key for the worker
	// stopped: the worker is about to record itself OFFLINE, and the key is recorded
	// no more (recording it brings a row marked OFFLINE back ONLINE). mu makes stop
	// wait for a recording in flight.
	mu      sync.Mutex
	stopped bool
	since   time.Time // when the lock was taken
	// reapedAt is when the last look for dead workers was made, and busy whether it
	// found another worker with runs in hand (or a dead one).
	reapedAt time.Time
	busy     bool
	// warnedPooler: the warning that the direct connection does not keep its
	// session was logged (once a worker).
	warnedPooler bool
}

// keepLiveness keeps the worker's liveness lock until release is called. The worker
// calls stop before it records itself OFFLINE: it waits for a recording of the key in
// flight and makes the keeper record it no more, so that a short-lived worker whose
// key was recorded late does not come back ONLINE after its stop.
func (w *Worker) keepLiveness() (stop, release func()) {
	l := &liveness{w: w, key: w.livenessKey}
	return l.stop, w.client.notifier.Keep(l, w.cfg.ReapInterval)
}

// stop ends the recording of the key; see keepLiveness.
func (l *liveness) stop() {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
}

// Open takes the lock on a new connection and records its key.
func (l *liveness) Open(ctx context.Context, conn *pgx.Conn) error {
	l.locked, l.recorded = false, false
	return l.lock(ctx, conn)
}

// lock takes the lock, unless another session holds the key (then the next tick
// tries again), and records the key; an error only when conn failed.
func (l *liveness) lock(ctx context.Context, conn *pgx.Conn) error {
	w := l.w
	cctx, cancel := context.WithTimeout(ctx, w.beatTimeout())
	defer cancel()
	if !l.locked {
		ok, err := store.LockLiveness(cctx, conn, l.key)
		if err != nil {
			return err
		}
		if !ok {
			w.logger.Debug("kagzi: cannot take the liveness lock yet: another session holds its key")
			return nil
		}
		l.locked, l.since = true, time.Now()
	}
	if !l.recorded {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.stopped {
			return nil
		}
		if err := store.SetLivenessKey(cctx, w.client.pool, w.client.ns, w.cfg.ID, l.key); err != nil {
			w.logger.Debug("kagzi: cannot record the liveness key yet", "error", err)
			return nil
		}
		l.recorded = true
	}
	return nil
}

// Tick reaps dead workers, once the lock is a few intervals old.
func (l *liveness) Tick(ctx context.Context, conn *pgx.Conn) error {
	w := l.w
	if !l.locked || !l.recorded {
		return l.lock(ctx, conn)
	}
	// After a database restart every worker takes its lock again, some later than
	// others: a worker reaps only once its own lock is four intervals old.
	if time.Since(l.since) < 4*w.cfg.ReapInterval {
		return nil
	}
	now := time.Now()
	if now.Sub(l.reapedAt) < l.reapEvery(now)-w.cfg.ReapInterval/4 { // the ticks come every ReapInterval
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, w.beatTimeout())
	defer cancel()
	r, err := store.ReapDeadWorkers(rctx, conn, w.client.ns, w.cfg.ID, l.key)
	if err != nil {
		return err
	}
	l.reapedAt, l.busy = now, r.Busy || r.Workers > 0
	if r.Workers > 0 {
		w.logger.Warn("kagzi: workers whose process died are OFFLINE; their runs are claimable now",
			"workers", r.Workers, "runs", r.Runs)
	}
	if !r.LockHere && !l.warnedPooler {
		// The lock was taken on this connection, which no longer runs on the session
		// that holds it: a transaction pooler between the client and the server. Its
		// LISTEN is as unreliable, and the lock outlives the process.
		l.warnedPooler = true
		w.logger.Warn("kagzi: the client's direct connection does not keep its session (a transaction-pooling "+
			"proxy such as PgBouncer?): notifications arrive late or never, and a dead worker's runs wait for their "+
			"leases; give Config.DirectConnConfig the server's own address, or set DisableDirectConn",
			"worker", w.cfg.ID)
	}
	return nil
}

// reapEvery is how often the worker looks for dead workers now: every ReapInterval
// while another worker reported runs in hand (or the last look found a dead one), or
// this one saw work in the last HeartbeatInterval; IdleReapFactor times as seldom
// otherwise.
func (l *liveness) reapEvery(now time.Time) time.Duration {
	w := l.w
	if l.busy || now.Sub(time.Unix(0, w.sawWork.Load())) <= w.cfg.HeartbeatInterval {
		return w.cfg.ReapInterval
	}
	return IdleReapFactor * w.cfg.ReapInterval
}

// Close releases the lock of a worker that stopped (its registry row is OFFLINE).
func (l *liveness) Close(ctx context.Context, conn *pgx.Conn) {
	if !l.locked {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, l.w.beatTimeout())
	defer cancel()
	_, _ = conn.Exec(cctx, `SELECT pg_advisory_unlock($1)`, l.key)
}

// Lost clears the worker's key after its connection failed, so that no reaper takes
// its runs while it lives without its lock.
func (l *liveness) Lost(err error) {
	w := l.w
	held := l.locked && l.recorded
	l.locked = false
	if !l.recorded {
		return
	}
	if held {
		w.logger.Warn("kagzi: the liveness connection failed; leases alone keep this worker's runs until it is back",
			"error", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.beatTimeout())
	defer cancel()
	if err := store.SetLivenessKey(ctx, w.client.pool, w.client.ns, w.cfg.ID, 0); err != nil && !errors.Is(err, store.ErrNotFound) {
		w.logger.Warn("kagzi: cannot clear the worker's liveness key", "error", err)
		return // recorded stays true: the next Open records the new lock's key
	}
	l.recorded = false
}
