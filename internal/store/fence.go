package store

import (
	"errors"

	"github.com/google/uuid"
)

// Fence names a run and the lease epoch its worker claimed it with. Every write a
// worker makes for a run takes one: the write matches the run only while the run is
// RUNNING under that epoch, and records nothing (ErrLeaseLost) once another claim
// has bumped the epoch or the run has ended. The writes that add rows beside the run
// (steps, attempts, signals taken, events) hold FOR KEY SHARE on the run while they
// commit, which the claim's SKIP LOCKED skips: a fenced write either commits before a
// takeover or is rejected after it. TestEveryFencedWriteWithAStaleEpochWritesNothing
// runs each of them with a stale epoch.
type Fence struct {
	RunID uuid.UUID
	Epoch int64
}

// ErrLeaseLost is what a fenced write returns when its fence no longer holds.
var ErrLeaseLost = errors.New("lease lost")

// fenceArgs declares a fenced statement's @run_id and @epoch parameters, read from
// its input's Fence.
func fenceArgs[W interface{ fence() Fence }]() []param[W] {
	return []param[W]{
		arg("run_id", "uuid", func(w W) [16]byte { return w.fence().RunID }),
		arg("epoch", "bigint", func(w W) int64 { return w.fence().Epoch }),
	}
}

func (f Fence) fence() Fence { return f }

// ownerSQL is the fence of a single-run write that adds rows beside its run (a
// step, a signal taken, an event): "owner" holds the run only while it is RUNNING
// under @epoch. FOR KEY SHARE holds off a concurrent claim, which would bump the
// epoch, until the write commits; a claim that committed first leaves "owner" empty,
// and the write records nothing.
const ownerSQL = `owner AS (
	SELECT run_id FROM kagzi.runs
	WHERE run_id = @run_id AND lease_epoch = @epoch AND status = 'RUNNING'
	FOR KEY SHARE
)`

// releaseSQL is the SET list that releases a run its worker held, to status `to`
// (PENDING, claimable at availableAt; or SLEEPING, woken then): no lease, no worker,
// never claimable later than its deadline. A run whose cancel was requested ends
// CANCELLED instead, at once. The run is the table aliased r.
func releaseSQL(to, availableAt string) string {
	return `status = CASE WHEN r.cancel_requested THEN 'CANCELLED' ELSE '` + to + `' END,
		finished_at = CASE WHEN r.cancel_requested THEN now() END,
		available_at = least(` + availableAt + `, r.deadline_at),
		locked_by = NULL, updated_at = now()`
}

// releasedColumns are the columns a statement that released runs returns for
// notifyRunSQL.
const releasedColumns = `r.run_id, r.namespace, r.workflow_type, r.status, r.available_at`

// notifyRunSQL is the notification for a run that was just released (columns of
// releasedColumns): its waiters when it ended CANCELLED, else the workers of its
// type with its next available time.
const notifyRunSQL = `CASE WHEN status = 'CANCELLED' THEN pg_notify('` + Channel + `', 'd|' || run_id || '|' || status)
	ELSE pg_notify('` + Channel + `', 'w|' || octet_length(namespace) || ':' || namespace || '|' || workflow_type || '|'
		|| (extract(epoch FROM available_at) * 1000)::bigint) END`
