package store

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/kagzi/kagzi/internal/vocab"
)

// WorkerRow is one row of kagzi.workers.
type WorkerRow struct {
	Namespace         string
	WorkerID          string
	Hostname          string
	PID               int
	Version           string
	Labels            map[string]string
	WorkflowTypes     []string
	WorkflowVersions  []string
	MaxConcurrent     int
	HeartbeatInterval time.Duration
	Status            vocab.WorkerStatus
	ActiveRuns        int
	CompletedTotal    int64
	FailedTotal       int64
	StartedAt         time.Time
	LastHeartbeatAt   time.Time
	StoppedAt         *time.Time
}

// workerLiveSQL is true for a live worker row w: ONLINE or DRAINING, and not silent
// (workerSilenceSQL). A worker's heartbeat marks the silent workers of its
// namespace OFFLINE, but when every worker of a namespace died none is left to do it:
// whoever reads the registry judges silence itself.
const workerLiveSQL = `(w.status <> 'OFFLINE' AND w.last_heartbeat_at >= ` + readNowSQL + ` - ` + workerSilenceSQL + `)`

// workerStatusSQL is a worker's status as readers see it: OFFLINE once it is silent
// for three heartbeat intervals, whether or not a heartbeat marked it so yet.
const workerStatusSQL = `CASE WHEN w.status <> 'OFFLINE' AND w.last_heartbeat_at < ` + readNowSQL + ` - ` + workerSilenceSQL + `
	THEN 'OFFLINE' ELSE w.status END`

// workerSilenceSQL is how long a worker row w must go without a heartbeat for readers
// to take it for dead: three of its intervals, and at least five seconds, so that a
// loaded process whose beats run late (a test's 250 ms beats on a busy box) does not
// flicker OFFLINE between two of them.
const workerSilenceSQL = `greatest(3 * w.heartbeat_interval_ms, 5000) * interval '1 millisecond'`

const workerColumns = `w.namespace, w.worker_id, w.hostname, w.pid, w.version, w.labels, w.workflow_types,
	w.workflow_versions, w.max_concurrent, w.heartbeat_interval_ms, ` + workerStatusSQL + `, w.active_runs, w.completed_total, w.failed_total,
	w.started_at, w.last_heartbeat_at, w.stopped_at`

func scanWorker(row pgx.Row) (WorkerRow, error) {
	var w WorkerRow
	var intervalMS int64
	err := row.Scan(&w.Namespace, &w.WorkerID, &w.Hostname, &w.PID, &w.Version, &w.Labels,
		&w.WorkflowTypes, &w.WorkflowVersions, &w.MaxConcurrent, &intervalMS, &w.Status, &w.ActiveRuns, &w.CompletedTotal,
		&w.FailedTotal, &w.StartedAt, &w.LastHeartbeatAt, &w.StoppedAt)
	w.HeartbeatInterval = time.Duration(intervalMS) * time.Millisecond
	return w, err
}

// RegisterWorker records a starting worker (ONLINE). A row of the same id (a worker
// restarted with a fixed id) is taken over and reset, and the runs it still held
// (RUNNING, locked by that id: a starting worker holds none, so they are its previous
// process's, which died) are made claimable now and fenced (their epoch moves on), as
// the look for dead workers does, and their types' workers told: the liveness key that look goes by is the new
// process's from now on.
//
// The row keeps no liveness key but ownKey: the registering worker records its own
// once it holds the key's lock (SetLivenessKey).
//
// held are the runs the registering worker holds itself (one that registers late, at
// a heartbeat, after its start found the database unreachable): they are not freed.
//
// liveBefore tells that the row's liveness key (other than ownKey, the registering
// worker's) was locked by a live session: a worker of the same id runs in another
// process (ids must be unique among live workers), and its runs were taken from it.
func RegisterWorker(ctx context.Context, db DBTX, w WorkerRow, held [][16]byte, ownKey int64) (liveBefore bool, err error) {
	labels := w.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	var freed int
	err = db.QueryRow(ctx, `
		WITH live AS (
			SELECT 1 FROM kagzi.workers w
			WHERE w.namespace = $1 AND w.worker_id = $2 AND w.status <> 'OFFLINE'
			  AND w.liveness_key IS NOT NULL AND w.liveness_key <> $12
			  AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
				AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
				AND ((l.classid::bigint << 32) | l.objid::bigint) = w.liveness_key)
		), reg AS (
		INSERT INTO kagzi.workers (namespace, worker_id, hostname, pid, version, labels, workflow_types,
			max_concurrent, heartbeat_interval_ms, status, workflow_versions)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'ONLINE', $10)
		ON CONFLICT (namespace, worker_id) DO UPDATE SET
			hostname = excluded.hostname, pid = excluded.pid, version = excluded.version,
			labels = excluded.labels, workflow_types = excluded.workflow_types,
			workflow_versions = excluded.workflow_versions,
			max_concurrent = excluded.max_concurrent, heartbeat_interval_ms = excluded.heartbeat_interval_ms,
			status = 'ONLINE', active_runs = 0, completed_total = 0, failed_total = 0,
			started_at = now(), last_heartbeat_at = now(), stopped_at = NULL,
			-- The previous process's key goes: no session holds its lock, and a look for
			-- dead workers would take this live one for dead until its own key is
			-- recorded. Its own key stays (recorded before a late registration).
			liveness_key = CASE WHEN kagzi.workers.liveness_key = $12 THEN $12 END
		RETURNING 1
		), freed AS (
			-- Back in their places in the queue, as a reap frees them (see
			-- reapDeadWorkersSQL).
			UPDATE kagzi.runs r SET available_at = least(now(), r.created_at - r.priority * interval '1 second'), updated_at = now(),
				lease_epoch = r.lease_epoch + 1,
				holds_type_slot = false -- fenced: its slot is free at once (see slotGraceSQL)
			WHERE r.namespace = $1 AND r.status = 'RUNNING' AND r.locked_by = $2 AND r.available_at > now()
			  AND r.run_id <> ALL (coalesce($11::uuid[], '{}'))
			RETURNING r.run_id, r.lease_epoch, r.workflow_type, r.available_at
		), `+stampReapedSQL+`
		SELECT (SELECT count(*) FROM reg) + (SELECT count(pg_notify('`+Channel+`', 'w|' || octet_length($1::text) || ':'
			|| $1 || '|' || t.workflow_type || '|' || (extract(epoch FROM t.at) * 1000)::bigint))
			FROM (SELECT workflow_type, min(available_at) AS at FROM freed GROUP BY workflow_type) t),
			EXISTS (SELECT 1 FROM live)`,
		w.Namespace, w.WorkerID, w.Hostname, w.PID, w.Version, labels, w.WorkflowTypes,
		w.MaxConcurrent, w.HeartbeatInterval.Milliseconds(), w.WorkflowVersions, held, ownKey).Scan(&freed, &liveBefore)
	return liveBefore, err
}

// SetWorkerStatus marks a worker DRAINING or OFFLINE (with its final counters).
func SetWorkerStatus(ctx context.Context, db DBTX, namespace, workerID string, status vocab.WorkerStatus, beat WorkerBeat) error {
	_, err := db.Exec(ctx, `
		UPDATE kagzi.workers SET status = $3, active_runs = $4, completed_total = $5, failed_total = $6,
			last_heartbeat_at = now(), stopped_at = CASE WHEN $3 = 'OFFLINE' THEN now() END
		WHERE namespace = $1 AND worker_id = $2`,
		namespace, workerID, status, beat.ActiveRuns, beat.Completed, beat.Failed)
	return err
}

// WorkerBeat is what a heartbeat reports of its worker.
type WorkerBeat struct {
	Namespace  string
	WorkerID   string
	ActiveRuns int
	Completed  int64
	Failed     int64
}

// heartbeatSQL is a worker's one statement per beat: it extends the leases of every
// run the worker holds (matched by run and epoch), refreshes the worker's registry
// row, and marks OFFLINE the workers of the namespace that stopped beating (three of
// their own intervals) and prunes those offline for a day. SKIP LOCKED keeps two
// beating workers from waiting on (or deadlocking over) the same dead rows, and its
// own row too (me): two workers that each looked stale to the other (after a database
// restart, a paused process) each locked the other's row to mark it OFFLINE and then
// waited for its own, held by the other: a deadlock at every beat, and the beats of
// every worker failed together for as long as they kept looking stale to each other
// (24 s in a chaos run). A beat whose own row is held skips refreshing it: its next
// beat does (and brings it back ONLINE if another marked it OFFLINE meanwhile).
//
// It never waits for a run's row either: a run whose row another transaction holds
// (the worker's own committer ending it, most often) is skipped, and comes back as
// held but not extended. Waiting there deadlocked with merged run ends, which lock
// their rows in another order, once or twice a minute under load; each deadlock
// stalled both statements for a second (deadlock_timeout) and failed the beat.
const heartbeatSQL = `
WITH me AS (
	UPDATE kagzi.workers SET last_heartbeat_at = now(), active_runs = $5, completed_total = $6,
		failed_total = $7, status = CASE WHEN status = 'OFFLINE' THEN 'ONLINE' ELSE status END,
		stopped_at = NULL
	WHERE (namespace, worker_id) IN (
		SELECT namespace, worker_id FROM kagzi.workers WHERE namespace = $3 AND worker_id = $4
		FOR UPDATE SKIP LOCKED)
	RETURNING 1
), silent AS (
	UPDATE kagzi.workers w SET status = 'OFFLINE', stopped_at = now()
	WHERE (w.namespace, w.worker_id) IN (
		SELECT namespace, worker_id FROM kagzi.workers
		WHERE namespace = $3 AND status <> 'OFFLINE' AND worker_id <> $4
		  AND last_heartbeat_at < now() - greatest(3 * heartbeat_interval_ms, 5000) * interval '1 millisecond' -- workerSilenceSQL
		FOR UPDATE SKIP LOCKED)
	RETURNING 1
), pruned AS (
	DELETE FROM kagzi.workers
	WHERE (namespace, worker_id) IN (
		SELECT namespace, worker_id FROM kagzi.workers
		WHERE namespace = $3 AND status = 'OFFLINE' AND stopped_at < now() - interval '1 day'
		FOR UPDATE SKIP LOCKED)
	RETURNING 1
), mine AS (
	SELECT r.run_id, r.lease_epoch, r.lease_token, r.cancel_requested
	FROM kagzi.runs r JOIN unnest($1::uuid[], $2::bigint[], $9::uuid[]) AS h(run_id, epoch, token)
		ON r.run_id = h.run_id AND r.lease_epoch = h.epoch AND r.lease_token IS NOT DISTINCT FROM h.token
	-- run_id = ANY bounds the read of runs to the held ones whichever join the planner
	-- picks: for a few thousand held runs it hashed every row of runs (a scan of the
	-- whole table per beat).
	WHERE r.run_id = ANY ($1::uuid[]) AND coalesce(r.status, '') = 'RUNNING' -- see KeyedPlansSQL
	  AND ` + slotHeldRSQL + `
), free AS (
	SELECT r.run_id FROM kagzi.runs r JOIN mine m ON r.run_id = m.run_id
	WHERE r.lease_epoch = m.lease_epoch AND r.lease_token IS NOT DISTINCT FROM m.lease_token
	  AND coalesce(r.status, '') = 'RUNNING'
	FOR NO KEY UPDATE OF r SKIP LOCKED
), extended AS (
	UPDATE kagzi.runs r SET available_at = now() + $8 * interval '1 millisecond'
	FROM free f WHERE r.run_id = f.run_id
	RETURNING r.run_id
)
-- One row per held run, with whether this beat extended it: grouped, not joined, so
-- that its cost stays linear in the runs held whatever the planner estimates (a nested
-- loop of the two CTEs, chosen on estimates of a few rows, compared every pair: 3 s a
-- beat for 2,000 runs, and every end of those runs waited for it).
SELECT run_id, bool_or(cancel_requested), bool_or(extended)
FROM (
	SELECT run_id, cancel_requested, false AS extended FROM mine
	UNION ALL
	SELECT run_id, false, true FROM extended
) held
GROUP BY run_id`

// Heartbeat extends the leases of all the given runs and refreshes the worker's row,
// in one statement. Runs missing from the result are no longer held by this worker:
// their lease was taken over or they finished. A run in the result but not Extended
// is still held; its row was being written, so its lease keeps its old end.
func Heartbeat(ctx context.Context, db DBTX, beat WorkerBeat, held []Fence, lease time.Duration) ([]HeartbeatResult, error) {
	ids, epochs, tokens := fenceArrays(held)
	rows, err := queryAfter(ctx, db, KeyedPlansSQL, heartbeatSQL, ids, epochs, beat.Namespace, beat.WorkerID,
		beat.ActiveRuns, beat.Completed, beat.Failed, lease.Milliseconds(), tokens)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (HeartbeatResult, error) {
		var h HeartbeatResult
		err := row.Scan(&h.RunID, &h.CancelRequested, &h.Extended)
		return h, err
	})
}

// GetWorker reads one worker of the namespace.
func GetWorker(ctx context.Context, db DBTX, namespace, workerID string) (WorkerRow, error) {
	w, err := scanWorker(db.QueryRow(ctx, `SELECT `+workerColumns+` FROM kagzi.workers w
		WHERE w.namespace = $1 AND w.worker_id = $2`, namespace, workerID))
	if errors.Is(err, pgx.ErrNoRows) {
		return WorkerRow{}, ErrNotFound
	}
	return w, err
}

// ListWorkersParams filters ListWorkers; zero fields do not filter.
type ListWorkersParams struct {
	Namespace    string
	Statuses     []string
	WorkflowType string
	// AfterID is the keyset cursor: the id of the last worker of the previous page.
	AfterID string
	Limit   int
}

// ListWorkers lists workers by id.
func ListWorkers(ctx context.Context, db DBTX, p ListWorkersParams) ([]WorkerRow, error) {
	args := []any{p.Namespace}
	where := "w.namespace = $1"
	if len(p.Statuses) > 0 {
		args = append(args, p.Statuses)
		where += " AND " + workerStatusSQL + " = ANY($" + strconv.Itoa(len(args)) + ")"
	}
	if p.WorkflowType != "" {
		args = append(args, p.WorkflowType)
		where += " AND $" + strconv.Itoa(len(args)) + " = ANY(w.workflow_types)"
	}
	if p.AfterID != "" {
		args = append(args, p.AfterID)
		where += " AND w.worker_id > $" + strconv.Itoa(len(args))
	}
	args = append(args, p.Limit)
	rows, err := db.Query(ctx, `SELECT `+workerColumns+` FROM kagzi.workers w WHERE `+where+
		` ORDER BY w.worker_id LIMIT $`+strconv.Itoa(len(args)), args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (WorkerRow, error) { return scanWorker(row) })
}

// pendingTypesWithoutWorkerSQL is PendingTypesWithoutWorker's statement: for each type
// with unfinished runs (a skip scan), its first 5,000 ready runs in available_at order
// against the live workers of the type (and version).
var pendingTypesWithoutWorkerSQL = `
		SELECT t.workflow_type FROM (` + unfinishedTypesSQL + `) t
		WHERE EXISTS (
			SELECT 1 FROM (` + unfinishedOfTypeSQL("r.version, r.available_at", "$1", "t.workflow_type",
	"r.available_at <= "+readNowSQL, "5000") + `) x
			WHERE NOT EXISTS (
				SELECT 1 FROM kagzi.workers w
				WHERE w.namespace = $1 AND ` + workerLiveSQL + ` AND t.workflow_type = ANY(w.workflow_types)
				  AND (x.version IS NULL
				       OR w.workflow_versions[array_position(w.workflow_types, t.workflow_type)] = x.version)))
		ORDER BY 1`

// PendingTypesWithoutWorker lists the workflow types that have runs ready now (PENDING
// and due, SLEEPING past their wake time, RUNNING past their lease) but no live (see
// workerLiveSQL) worker registered for them in the namespace, with the run's version
// when it has one (a run pinned to a version only a worker of that version claims).
// It looks at each type's 5,000 runs ready longest: runs no worker claims stay at the
// head of the type's ready runs while the others are claimed, but a run pinned to a
// version no live worker has, behind more than 5,000 older ready runs (a backlog, or
// runs a limit holds back), is not seen until it is among them.
func PendingTypesWithoutWorker(ctx context.Context, db DBTX, namespace string) ([]string, error) {
	rows, err := db.Query(ctx, pendingTypesWithoutWorkerSQL, namespace)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
