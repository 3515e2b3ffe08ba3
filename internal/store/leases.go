package store

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// renewLeaseSQL extends the lease of one run the caller holds ($1 the run, $2 its
// epoch) to $3 milliseconds from now, and tells whether a cancel was requested. It
// matches nothing once another claim bumped the epoch or the run ended.
const renewLeaseSQL = `
UPDATE kagzi.runs SET available_at = now() + $3 * interval '1 millisecond'
WHERE run_id = $1 AND lease_epoch = $2 AND status = 'RUNNING'
RETURNING cancel_requested`

// RenewLease extends the lease of a run the caller holds, at once. A worker calls it
// before something with effects outside the database begins (a step body, a child's
// start) when, by its own clock, the lease may have passed: a frozen process must not
// act on a run another worker has taken over. It returns ErrLeaseLost when the caller
// no longer holds the run.
func RenewLease(ctx context.Context, db DBTX, runID uuid.UUID, epoch int64, lease time.Duration) (cancelRequested bool, err error) {
	err = db.QueryRow(ctx, renewLeaseSQL, [16]byte(runID), epoch, lease.Milliseconds()).Scan(&cancelRequested)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, ErrLeaseLost
	}
	return cancelRequested, err
}
