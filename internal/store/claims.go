package store

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/kagzi/kagzi/internal/vocab"
)

// ClaimedRun is a run a worker has just claimed, with every step it has recorded.
type ClaimedRun struct {
	// Fence is the run and the epoch this claim took it with: every write of this
	// execution carries it.
	Fence
	Namespace       string
	WorkflowID      string
	WorkflowType    string
	Version         string
	Input           []byte
	Attempt         int
	CancelRequested bool
	Deadline        *time.Time
	CreatedAt       time.Time
	// DBNow is the database's clock at the claim, so that a worker can tell how far
	// a recorded wake time is without trusting its own clock to agree.
	DBNow time.Time
	// Takeovers counts the claims, this one included, that took the run over after
	// its worker's lease passed.
	Takeovers int
	Steps     map[string]StepRecord
	// AvailableAt is when the run became claimable (before this claim); Carrier the
	// trace context stored at its start (nil: none).
	AvailableAt time.Time
	Carrier     []byte
}

// StepRecord is a recorded step as replay needs it.
type StepRecord struct {
	Name     string
	Position *int
	Kind     vocab.StepKind
	Status   vocab.StepStatus
	Output   []byte
	Error    []byte
	Attempts int
	WakeAt   *time.Time
}

// claimSQL claims up to $4 claimable runs of the worker's types in one statement:
// PENDING runs whose start time has come, SLEEPING runs whose wake time has come,
// and RUNNING runs whose lease expired (their worker died or stalled). It reads only
// the partial index runs_claimable, one ordered index range per workflow type (a
// single range over all types could not come out in available_at order, and the
// planner would sort every claimable run on each claim), and SKIP LOCKED lets any
// number of workers claim side by side without waiting on each other. Each claim
// bumps the lease epoch. A worker claims only the versions it registered ($6,
// parallel to the types $2); a run started without a version is pinned to the
// claiming worker's. It also tells, per run, whether the run can have recorded steps:
// only a run claimed before (its epoch was already bumped) or a fork (its steps were
// copied in before its first claim) can; every other step write is fenced by the
// run's own lease.
//
// It runs with Postgres's generic plan (see genericPlanSQL and KeyedPlansSQL): planning it anew at each
// claim, as Postgres chose to, took 0.26 ms, more than the claim of one run itself
// (0.15 ms). The redundant "= ANY (ARRAY(...))" keeps that plan reading runs by its
// primary key: a generic plan cannot know the limit $4 and assumes a tenth of the
// claimable runs, for which a join through a sequential scan of runs looked cheaper.
const claimSQL = `
WITH locked AS (
	SELECT c.run_id, c.available_at, t.version AS claim_version
	FROM unnest($2::text[], $6::text[]) AS t(workflow_type, version),
	LATERAL (
		SELECT run_id, available_at FROM kagzi.runs
		WHERE namespace = $1 AND workflow_type = t.workflow_type
		  AND status IN ('PENDING', 'RUNNING', 'SLEEPING') AND available_at <= now()
		  AND (version IS NULL OR version = t.version)
		ORDER BY available_at
		LIMIT $4
		FOR UPDATE SKIP LOCKED
	) c
	ORDER BY c.available_at
	LIMIT $4
)
UPDATE kagzi.runs r SET
	status = 'RUNNING',
	locked_by = $3,
	lease_epoch = r.lease_epoch + 1,
	available_at = now() + $5 * interval '1 millisecond',
	started_at = coalesce(r.started_at, now()),
	waiting_signal = NULL, wake_pending = false,
	version = coalesce(r.version, locked.claim_version),
	takeovers = r.takeovers + CASE WHEN r.status = 'RUNNING' THEN 1 ELSE 0 END,
	updated_at = now()
FROM locked
WHERE r.run_id = locked.run_id AND r.run_id = ANY (ARRAY(SELECT run_id FROM locked))
RETURNING r.run_id, r.namespace, r.workflow_id, r.workflow_type, r.version, r.input, r.attempt,
	r.lease_epoch, r.cancel_requested, r.deadline_at, r.created_at, now(), locked.available_at, r.trace_carrier,
	r.lease_epoch > 1 OR r.forked_from_run_id IS NOT NULL, r.takeovers`

// claimedStepsSQL loads the recorded steps of runs the caller has just claimed ($1).
// It runs after the claim committed, so it sees every step the previous owner
// recorded: a fenced step write holds a lock on the run that the claim's SKIP LOCKED
// skips, so it either committed before the claim or records nothing.
const claimedStepsSQL = `
SELECT run_id, step_key, name, position, kind, status, output, error, attempts, wake_at
FROM kagzi.steps WHERE run_id = ANY($1)`

// ClaimRuns claims up to limit runs for the worker and loads their recorded steps:
// one round trip, and a second one when a claimed run can have steps (a run resumed
// after a sleep, a retry, a crash or a hand-back, or a fork). The claim has committed
// by then: when the steps cannot be loaded, the claimed runs are handed back at once
// (or, if that fails too, when their lease passes) and the error returned.
func ClaimRuns(ctx context.Context, db DBTX, namespace string, types, versions []string, workerID string,
	lease time.Duration, limit int) ([]ClaimedRun, error) {
	rows, err := queryAfter(ctx, db, genericPlanSQL, claimSQL, namespace, types, workerID, limit, lease.Milliseconds(), versions)
	if err != nil {
		return nil, err
	}
	var resumed [][16]byte
	var claimed []ClaimedRun
	for rows.Next() {
		var c ClaimedRun
		var hasSteps bool
		if err := rows.Scan(&c.RunID, &c.Namespace, &c.WorkflowID, &c.WorkflowType, &c.Version, &c.Input, &c.Attempt,
			&c.Epoch, &c.CancelRequested, &c.Deadline, &c.CreatedAt, &c.DBNow, &c.AvailableAt, &c.Carrier, &hasSteps, &c.Takeovers); err != nil {
			rows.Close()
			return nil, err
		}
		c.Steps = map[string]StepRecord{}
		if hasSteps {
			resumed = append(resumed, c.RunID)
		}
		claimed = append(claimed, c)
	}
	rows.Close() // after the commit: Err tells whether it failed
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(resumed) == 0 {
		return claimed, nil
	}
	if err := loadSteps(ctx, db, claimed, resumed); err != nil {
		held := make([]Fence, len(claimed))
		for i, c := range claimed {
			held[i] = c.Fence
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		return nil, errors.Join(err, ReleaseRuns(rctx, db, held))
	}
	return claimed, nil
}

// loadSteps fills in the recorded steps of the claimed runs named in ids.
func loadSteps(ctx context.Context, db DBTX, claimed []ClaimedRun, ids [][16]byte) error {
	byID := make(map[uuid.UUID]*ClaimedRun, len(claimed))
	for i := range claimed {
		byID[claimed[i].RunID] = &claimed[i]
	}
	rows, err := queryAfter(ctx, db, KeyedPlansSQL, claimedStepsSQL, ids)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var runID uuid.UUID
		var key string
		var s StepRecord
		if err := rows.Scan(&runID, &key, &s.Name, &s.Position, &s.Kind, &s.Status, &s.Output, &s.Error, &s.Attempts, &s.WakeAt); err != nil {
			return err
		}
		if c := byID[runID]; c != nil {
			c.Steps[key] = s
		}
	}
	return rows.Err()
}

// NextWake returns when the earliest unfinished run of the worker's types becomes
// claimable (a delayed start, a wake time, a lease that others hold), or nil if there
// is none. The worker sets a timer for it instead of polling.
func NextWake(ctx context.Context, db DBTX, namespace string, types, versions []string, workerID string) (*time.Time, error) {
	var t *time.Time
	err := db.QueryRow(ctx, nextWakeSQL, namespace, types, workerID, versions).Scan(&t)
	return t, err
}

const nextWakeSQL = `
SELECT min(available_at) FROM kagzi.runs
WHERE namespace = $1 AND workflow_type = ANY($2)
  AND status IN ('PENDING', 'RUNNING', 'SLEEPING') AND available_at IS NOT NULL
  AND (status <> 'RUNNING' OR locked_by IS DISTINCT FROM $3)
  AND (version IS NULL OR (workflow_type, version) IN (SELECT * FROM unnest($2::text[], $4::text[])))`
