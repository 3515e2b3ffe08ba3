package kagzi

import (
	"context"
	"time"

	"github.com/kagzi/kagzi/internal/schema"
	"github.com/kagzi/kagzi/internal/store"
)

// HealthReport is what Health finds. Health never fails: a problem is a field. Its
// JSON (snake_case) is what `kagzi health --json` prints.
type HealthReport struct {
	// DatabaseOK reports that the database answered; DatabaseError says why not.
	DatabaseOK    bool   `json:"database_ok"`
	DatabaseError string `json:"database_error,omitempty"`
	// ReadPoolError, when Config.ReadPool is set and does not answer, says why: the
	// listings it serves fail meanwhile. It leaves Healthy true: starts, workers and
	// fresh reads use the pool.
	ReadPoolError string `json:"read_pool_error,omitempty"`
	// SchemaVersion is the applied migration version (0 for a database never
	// migrated); LatestSchemaVersion the newest this build knows (filled in even when
	// the database does not answer). SchemaCurrent is true when they are equal;
	// SchemaNewer when a later release of Kagzi migrated the database past this build,
	// which keeps working beside it (a rolling deploy migrates first: see
	// docs/deployment.md), so that is healthy too.
	SchemaVersion       int64 `json:"schema_version"`
	LatestSchemaVersion int64 `json:"latest_schema_version"`
	SchemaCurrent       bool  `json:"schema_current"`
	SchemaNewer         bool  `json:"schema_newer,omitempty"`
	// Workers are the workers running in this process on this client.
	Workers []LocalWorkerHealth `json:"workers,omitempty"`
	// PendingTypesWithoutWorker lists workflow types with runs ready to run (PENDING
	// and due, SLEEPING past their wake time, RUNNING past their lease) but no live
	// worker registered for them in the namespace (for a run pinned to a version, none
	// registered with that version). A worker silent for three heartbeat intervals
	// (at least 5 s) is not live. It looks at each type's 5,000 runs ready longest.
	PendingTypesWithoutWorker []string `json:"pending_types_without_worker,omitempty"`
}

// LocalWorkerHealth is the state of a worker of this process.
type LocalWorkerHealth struct {
	ID     string       `json:"worker_id"`
	Status WorkerStatus `json:"status"`
	// LastHeartbeat is when its last heartbeat succeeded (zero: none yet). A worker
	// whose heartbeats fail for longer than its lease gives its runs up.
	LastHeartbeat time.Time `json:"last_heartbeat_at"`
	ActiveRuns    int       `json:"active_runs"`
	// AbandonedSteps counts step goroutines that ignored their timeout.
	AbandonedSteps int64 `json:"abandoned_steps"`
	// Stale reports an ONLINE worker whose heartbeats have failed for three of its
	// intervals (its leases are being given up).
	Stale bool `json:"stale"`
}

// Healthy reports whether the database answers, the schema is current (or newer:
// see SchemaNewer) and no local worker is Stale.
func (h *HealthReport) Healthy() bool {
	for _, w := range h.Workers {
		if w.Stale {
			return false
		}
	}
	return h.DatabaseOK && (h.SchemaCurrent || h.SchemaNewer)
}

// readPoolPingTimeout bounds Health's look at Config.ReadPool.
const readPoolPingTimeout = time.Second

// Health checks the database (and Config.ReadPool, if set, for at most a second), the
// schema version, this process's workers and the namespace's pending work that no live
// worker can take. Use it for readiness and liveness probes. It takes no lock: the
// schema version is read with a plain query of goose's version table (none: version
// 0), so a migration in progress elsewhere does not hold it up, and it creates nothing.
// Of a nil or zero Client it reports DatabaseError (ErrInvalidArgument's text), not
// healthy.
func (c *Client) Health(ctx context.Context) *HealthReport {
	h := &HealthReport{}
	h.LatestSchemaVersion, _ = schema.Latest()
	if err := c.usable("Health"); err != nil {
		h.DatabaseError = err.Error()
		return h
	}
	c.mu.Lock()
	for w := range c.workers {
		lh := LocalWorkerHealth{ID: w.cfg.ID, ActiveRuns: w.beat().ActiveRuns, AbandonedSteps: w.abandoned.Load()}
		if s, ok := w.status.Load().(WorkerStatus); ok {
			lh.Status = s
		}
		if ns := w.lastBeat.Load(); ns != 0 {
			lh.LastHeartbeat = time.Unix(0, ns)
		}
		since := lh.LastHeartbeat
		if since.IsZero() {
			since = w.startedAt
		}
		lh.Stale = lh.Status == WorkerOnline && time.Since(since) > 3*w.cfg.HeartbeatInterval
		h.Workers = append(h.Workers, lh)
	}
	c.mu.Unlock()

	if c.read != c.pool {
		// Beside the other checks, bounded on its own: a read pool that does not
		// answer must not spend the deadline of the checks that decide Healthy.
		readCtx, cancel := context.WithTimeout(ctx, readPoolPingTimeout)
		defer cancel()
		pinged := make(chan error, 1)
		go func() { pinged <- c.read.Ping(readCtx) }()
		defer func() {
			if err := <-pinged; err != nil {
				h.ReadPoolError = dbError("kagzi: health of the read pool", err).Error()
			}
		}()
	}
	if err := c.pool.Ping(ctx); err != nil {
		h.DatabaseError = dbError("kagzi: health", err).Error()
		return h
	}
	h.DatabaseOK = true
	current, latest, err := schema.Version(ctx, c.pool)
	h.SchemaVersion, h.LatestSchemaVersion = current, latest
	if err != nil {
		h.DatabaseError = "schema version: " + err.Error()
		return h
	}
	h.SchemaCurrent, h.SchemaNewer = current == latest, current > latest
	if !h.SchemaCurrent && !h.SchemaNewer {
		return h
	}
	types, err := store.PendingTypesWithoutWorker(ctx, c.pool, c.ns)
	if err != nil {
		h.DatabaseError = "pending types: " + err.Error()
		return h
	}
	h.PendingTypesWithoutWorker = types
	return h
}
