package store

import (
	"errors"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// Fence names a run, the lease epoch its worker claimed it with and the claim's
// token. Every write a worker makes for a run takes one: the write matches the run
// only while the run is RUNNING under that epoch and token, and records nothing
// (ErrLeaseLost) once another claim has bumped the epoch or the run has ended. The
// writes that add rows beside the run (steps, attempts, signals taken, events) hold
// FOR KEY SHARE on the run while they commit, which the claim's SKIP LOCKED skips: a
// fenced write either commits before a takeover or is rejected after it.
// TestEveryFencedWriteWithAStaleEpochWritesNothing runs each of them with a stale
// epoch.
//
// The token is drawn at random for each claim (and each eager start): claims commit
// without waiting for their WAL flush, so a claim lost in a crash of PostgreSQL leaves
// the run with the epoch it had, and the next claim takes it with the epoch the lost
// one had; the token, which no claim repeats, keeps the lost claim's execution from
// writing under the new one (migration 00018). A zero Token matches a run claimed
// without one: by an eager start (the start's own transaction claims the run, and
// commits synchronously), or by a library from before that migration.
type Fence struct {
	RunID uuid.UUID
	Epoch int64
	Token uuid.UUID
}

// token is the fence's token as a parameter: NULL when it has none.
func (f Fence) token() pgtype.UUID {
	return pgtype.UUID{Bytes: f.Token, Valid: f.Token != uuid.Nil}
}

// ErrLeaseLost is what a fenced write returns when its fence no longer holds.
var ErrLeaseLost = errors.New("lease lost")

// fenceArgs declares a fenced statement's @run_id, @epoch and @token parameters,
// read from its input's Fence.
func fenceArgs[W interface{ fence() Fence }]() []param[W] {
	return []param[W]{
		arg("run_id", "uuid", func(w W) [16]byte { return w.fence().RunID }),
		arg("epoch", "bigint", func(w W) int64 { return w.fence().Epoch }),
		arg("token", "uuid", func(w W) pgtype.UUID { return w.fence().token() }),
	}
}

func (f Fence) fence() Fence { return f }

// slotHeldSQL (slotHeldRSQL: of the run aliased r) is a fenced write's condition
// besides its epoch and token: a run that holds a slot of its type's concurrency limit
// and whose lease passed (holds_type_slot AND available_at <= clock_timestamp()) is lost to its
// worker, even when no claim took it over yet. The limit counts a holder only while
// its lease lasts, so that a dead worker's runs give their slots back; a claim may
// have admitted another run of the type in that slot meanwhile, and a worker frozen
// past its lease that renewed it and went on recording (as a run of a type without a
// limit may) would put a second run in one slot. Such a run records nothing more,
// stops at its next heartbeat, and is claimed again when the limit has room. Every
// fenced write, the lease renewal and the heartbeat carry it; a hand-back, which
// records nothing, does not.
//
// The lease's end is compared with clock_timestamp(), not now(): a write that waited
// for the run's row lock (a caller's transaction that signalled the run holds it)
// re-checks its conditions on the row when it gets it, and now() is still the time
// it began. Even so, a claim, counting holders without locking them, reads the row as
// it stood before a renewal in flight. A
// renewal that checked the lease just before it ended and commits just after would
// then keep the run while a claim in between gave its slot to another. So a claim (and
// an eager start) counts a slot holder for slotGraceSQL past its lease end: a write would have to take longer than the grace between its check
// and its commit to put two runs in one slot, and a lapsed holder's slot is given to
// another run that much later (a reaped run, fenced by the reap, at once).
// TestARenewalInFlightAtALeasesEndKeepsTheSlotFromAClaim. Migration 00021 has the same
// grace in kagzi.claim.
const (
	slotHeldSQL  = `NOT (holds_type_slot AND available_at <= clock_timestamp())`
	slotHeldRSQL = `NOT (r.holds_type_slot AND r.available_at <= clock_timestamp())`
	// slotGraceSQL: a claim counts a RUNNING run holding a type slot among the type's
	// holders while its available_at (the lease's end) > now() - slotGraceSQL.
	slotGraceSQL = `interval '2 seconds'`
)

// ownerSQL is the fence of a single-run write that adds rows beside its run (a
// step, a signal taken, an event): "owner" holds the run only while it is RUNNING
// under @epoch and @token. FOR KEY SHARE holds off a concurrent claim, which would bump the
// epoch, until the write commits; a claim that committed first leaves "owner" empty,
// and the write records nothing.
const ownerSQL = `owner AS (
	SELECT run_id FROM kagzi.runs
	WHERE run_id = @run_id AND lease_epoch = @epoch AND lease_token IS NOT DISTINCT FROM @token AND status = 'RUNNING'
	  AND ` + slotHeldSQL + `
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
