package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// LockLiveness takes the session-level advisory lock a live worker holds on conn (a
// connection of its own, not a pool's): it returns false when another session holds
// key.
func LockLiveness(ctx context.Context, conn *pgx.Conn, key int64) (bool, error) {
	var ok bool
	err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&ok)
	return ok, err
}

// SetLivenessKey records the key of the worker's liveness lock (0: none, when the
// worker lost the connection that holds it: leases alone govern its runs then). A
// worker a reaper marked OFFLINE while it could not hold its lock is ONLINE again
// with its key.
func SetLivenessKey(ctx context.Context, db DBTX, namespace, workerID string, key int64) error {
	tag, err := db.Exec(ctx, `UPDATE kagzi.workers SET liveness_key = nullif($3::bigint, 0),
			status = CASE WHEN status = 'OFFLINE' AND $3::bigint <> 0 THEN 'ONLINE' ELSE status END,
			stopped_at = CASE WHEN status = 'OFFLINE' AND $3::bigint <> 0 THEN NULL ELSE stopped_at END
		WHERE namespace = $1 AND worker_id = $2`, namespace, workerID, key)
	if err == nil && tag.RowsAffected() == 0 {
		return ErrNotFound // not registered (yet): the caller records the key later
	}
	return err
}

// reapDeadWorkersSQL finds the namespace's workers that record a liveness key whose
// lock no session holds any more (their process died, or lost its connection), marks
// them OFFLINE, makes their RUNNING runs claimable now (giving their type slots back),
// back in their places in the queue (ahead of the runs started after them), and
// notifies those runs' types.
// It fences the runs it frees (their lease epoch moves on): a worker taken for dead may
// be alive (its sessions were terminated), and its writes and heartbeats for those runs
// must fail from now on, not renew a lease that no limit counts any more.
// It also tells whether a live worker of the namespace other than $2 reported runs in
// hand at its last heartbeat (a death to watch for).
// An advisory lock on a bigint key k shows in pg_locks as classid = k >> 32 and
// objid = k & 0xffffffff, with objsubid 1 (keys are positive: see the worker).
const reapDeadWorkersSQL = `
WITH held AS (
	SELECT (l.classid::bigint << 32) | l.objid::bigint AS key
	FROM pg_locks l
	WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
	  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
), dead AS (
	UPDATE kagzi.workers w SET status = 'OFFLINE', stopped_at = now()
	WHERE w.namespace = $1 AND w.status <> 'OFFLINE' AND w.liveness_key IS NOT NULL
	  AND NOT EXISTS (SELECT 1 FROM held h WHERE h.key = w.liveness_key)
	RETURNING w.worker_id
), freed AS (
	-- A freed run takes back its place in the queue, from its start (its creation, less
	-- its priority), not from now: it is work begun, and the claims take it before the
	-- runs queued after it (a run of a type at its concurrency limit was taken over
	-- after the whole backlog, tens of seconds after the kill).
	UPDATE kagzi.runs r SET available_at = least(now(), r.created_at - r.priority * interval '1 second'), updated_at = now(),
		lease_epoch = r.lease_epoch + 1,
		holds_type_slot = false -- fenced: its slot is free at once (see slotGraceSQL)
	FROM dead d
	WHERE r.namespace = $1 AND r.status = 'RUNNING' AND r.locked_by = d.worker_id AND r.available_at > now()
	  AND EXISTS (SELECT 1 FROM dead) -- read no run when no worker died, whichever side the plan joins first
	RETURNING r.run_id, r.lease_epoch, r.workflow_type, r.available_at
), ` + stampReapedSQL + `
SELECT (SELECT count(*) FROM dead), (SELECT count(*) FROM freed),
	EXISTS (SELECT 1 FROM kagzi.workers o WHERE o.namespace = $1 AND o.worker_id <> $2 AND o.status <> 'OFFLINE'
		AND o.active_runs > 0),
	(SELECT count(pg_notify('` + Channel + `', 'w|' || octet_length($1::text) || ':' || $1 || '|' || t.workflow_type
		|| '|' || (extract(epoch FROM t.at) * 1000)::bigint))
	 FROM (SELECT workflow_type, min(available_at) AS at FROM freed GROUP BY workflow_type) t), -- the time lowers the floors
	EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
		AND l.pid = pg_backend_pid() AND ((l.classid::bigint << 32) | l.objid::bigint) = $3)`

// Reaped is what a look for dead workers found.
type Reaped struct {
	// Workers and Runs count the dead workers marked OFFLINE and their runs made
	// claimable; Busy says another live worker reported runs in hand.
	Workers, Runs int
	Busy          bool
	// LockHere says the session that ran the look holds the looking worker's own
	// liveness lock, as it must: a connection that does not keep its session (a
	// transaction-pooling proxy) runs each statement on whichever server session
	// is free, and the lock was left on another.
	LockHere bool
}

// ReapDeadWorkers marks the namespace's dead workers OFFLINE and makes their runs
// claimable at once (see reapDeadWorkersSQL), as the worker me, whose liveness key is
// key, on the session that should hold its lock.
func ReapDeadWorkers(ctx context.Context, db DBTX, namespace, me string, key int64) (r Reaped, err error) {
	var notified int
	err = db.QueryRow(ctx, reapDeadWorkersSQL, namespace, me, key).Scan(&r.Workers, &r.Runs, &r.Busy, &notified, &r.LockHere)
	return r, err
}
