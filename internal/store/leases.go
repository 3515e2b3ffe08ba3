package store

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// renewLease extends the lease of one run its worker holds to @lease_ms from now,
// and tells whether a cancel was requested.
var renewLease = named(`
UPDATE kagzi.runs SET available_at = now() + @lease_ms * interval '1 millisecond'
WHERE run_id = @run_id AND lease_epoch = @epoch AND lease_token IS NOT DISTINCT FROM @token AND status = 'RUNNING'
  AND `+slotHeldSQL+`
RETURNING cancel_requested`,
	append(fenceArgs[leaseRenewal](),
		arg("lease_ms", "bigint", func(r leaseRenewal) int64 { return r.lease.Milliseconds() }))...)

type leaseRenewal struct {
	Fence
	lease time.Duration
}

// RenewLease extends the lease of a run its worker holds, at once. A worker calls it
// before something with effects outside the database begins (a step body, a child's
// start) when, by its own clock, the lease may have passed: a frozen process must not
// act on a run another worker has taken over. It returns ErrLeaseLost when the caller
// no longer holds the run.
func RenewLease(ctx context.Context, db DBTX, f Fence, lease time.Duration) (cancelRequested bool, err error) {
	err = db.QueryRow(ctx, renewLease.sql, renewLease.args(leaseRenewal{f, lease})...).Scan(&cancelRequested)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, ErrLeaseLost
	}
	return cancelRequested, err
}

// HeartbeatResult is what a heartbeat learns of one run it still holds.
type HeartbeatResult struct {
	RunID           uuid.UUID
	CancelRequested bool
	// Extended: the beat extended the run's lease. A run whose row another
	// transaction was writing is not waited for, nor extended, this beat.
	Extended bool
}

// fenceArrays returns the run ids, epochs and tokens of fences, as parallel array
// parameters.
func fenceArrays(fences []Fence) (ids, epochs, tokens any) {
	is := make([][16]byte, len(fences))
	es := make([]int64, len(fences))
	ts := make([]pgtype.UUID, len(fences))
	for i, f := range fences {
		is[i], es[i], ts[i] = f.RunID, f.Epoch, f.token()
	}
	return pgArray(is), pgArray(es), pgArray(ts)
}

// ReleaseRuns hands runs back at once (a worker shutting down): they become PENDING
// and claimable now, and the workers of their types are notified. A run whose cancel
// was requested ends CANCELLED instead. Runs whose fence no longer holds are left
// alone.
func ReleaseRuns(ctx context.Context, db DBTX, held []Fence) error {
	return releaseRuns(ctx, db, releaseRunsSQL, held)
}

// releaseRuns runs a statement of releaseRunsAt for the runs, with more arguments
// after the fences' ($4 on).
func releaseRuns(ctx context.Context, db DBTX, sql string, held []Fence, more ...any) error {
	ids, epochs, tokens := fenceArrays(held)
	rows, err := queryAfter(ctx, db, KeyedPlansSQL, sql, append([]any{ids, epochs, tokens}, more...)...)
	if err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// stampReapedSQL follows a CTE named freed, the runs a reap freed (run_id and the
// lease_epoch it gave them): it stamps that epoch on the record of each that executed
// alone (the worker's "kagzi#alone" step, see the root package's solo.go), so that the
// claim that takes it over can tell the reap that moved its epoch on from a claim
// that never ran it. A data-modifying CTE runs whether or not the query reads it.
const stampReapedSQL = `stamped AS (
	UPDATE kagzi.steps s SET output = s.output || jsonb_build_object('reaped', f.lease_epoch)
	FROM freed f
	WHERE s.run_id = f.run_id AND s.step_key = 'kagzi#alone'
)`

// ReleaseRunsInPlace is ReleaseRuns that puts each run back in its place in the
// queue (its creation, less its priority), as a reap does, not behind the runs
// queued since: a worker that claimed runs it must not execute now (beside a run
// that executes alone) gives them back to be claimed first.
func ReleaseRunsInPlace(ctx context.Context, db DBTX, held []Fence) error {
	return releaseRuns(ctx, db, releaseRunsInPlaceSQL, held)
}

// ParkRuns is ReleaseRuns that makes the runs claimable again only after delay: a
// worker that claimed runs it must not execute now, nor hold (runs to execute alone,
// while it executes another), parks them, so that its next claims, and those of the
// other workers, do not take them straight back.
func ParkRuns(ctx context.Context, db DBTX, held []Fence, delay time.Duration) error {
	return releaseRuns(ctx, db, parkRunsSQL, held, delay.Milliseconds())
}

// Ancestors returns the run's parent, its parent's parent, and so on (at most 64).
func Ancestors(ctx context.Context, db DBTX, run uuid.UUID) ([]uuid.UUID, error) {
	var ids []uuid.UUID
	err := db.QueryRow(ctx, ancestorsSQL, run).Scan(&ids)
	return ids, err
}

// ancestorsSQL: see Ancestors.
const ancestorsSQL = `
WITH RECURSIVE up (run_id, depth) AS (
	SELECT parent_run_id, 1 FROM kagzi.runs WHERE run_id = $1 AND parent_run_id IS NOT NULL
	UNION ALL
	SELECT r.parent_run_id, up.depth + 1 FROM up JOIN kagzi.runs r ON r.run_id = up.run_id
	WHERE r.parent_run_id IS NOT NULL AND up.depth < 64
)
SELECT coalesce(array_agg(run_id ORDER BY depth), '{}') FROM up`

// releaseRunsSQL, releaseRunsInPlaceSQL and parkRunsSQL: see ReleaseRuns,
// ReleaseRunsInPlace, ParkRuns and KeyedPlansSQL.
var (
	releaseRunsSQL        = releaseRunsAt("now()")
	releaseRunsInPlaceSQL = releaseRunsAt("least(now(), r.created_at - r.priority * interval '1 second')")
	parkRunsSQL           = releaseRunsAt("now() + $4::bigint * interval '1 millisecond'")
)

func releaseRunsAt(availableAt string) string {
	return `
WITH upd AS (
	UPDATE kagzi.runs r SET ` + releaseSQL("PENDING", availableAt) + `
	FROM unnest($1::uuid[], $2::bigint[], $3::uuid[]) AS h(run_id, epoch, token)
	WHERE r.run_id = h.run_id AND r.lease_epoch = h.epoch AND r.lease_token IS NOT DISTINCT FROM h.token AND coalesce(r.status, '') = 'RUNNING'
	  AND r.run_id = ANY ($1::uuid[]) -- reads only these runs, whichever join is planned (see heartbeatSQL)
	RETURNING ` + releasedColumns + `
)
SELECT ` + notifyRunSQL + ` FROM upd`
}
