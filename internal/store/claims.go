package store

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/kagzi/kagzi/internal/vocab"
)

// ClaimedRun is a run a worker has just claimed, with every step it has recorded.
type ClaimedRun struct {
	RunID           uuid.UUID
	Namespace       string
	WorkflowID      string
	WorkflowType    string
	Version         string
	Input           []byte
	Attempt         int
	LeaseEpoch      int64
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
			&c.LeaseEpoch, &c.CancelRequested, &c.Deadline, &c.CreatedAt, &c.DBNow, &c.AvailableAt, &c.Carrier, &hasSteps, &c.Takeovers); err != nil {
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
		held := make([]HeldRun, len(claimed))
		for i, c := range claimed {
			held[i] = HeldRun{RunID: c.RunID, Epoch: c.LeaseEpoch}
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		return nil, errors.Join(err, ReleaseRuns(rctx, db, held))
	}
	return claimed, nil
}

// genericPlanSQL makes the statement sent after it in the same implicit transaction
// use its generic plan (made once per connection) instead of one planned for its
// parameters, and plan it as KeyedPlansSQL says. It is set_config(..., true), not
// SET LOCAL: the pipelined statements share a transaction, but not a transaction
// block, and SET LOCAL outside one makes Postgres log a WARNING (and send it to the
// client) at every claim.
const genericPlanSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
	set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)`

// batcher is a DBTX that can pipeline statements (a pool, a connection, a transaction).
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// queryAfter runs setup (transaction-local settings: genericPlanSQL, KeyedPlansSQL)
// and then the query, in one round trip and one implicit transaction, when db can
// pipeline; otherwise the query alone. Inside the caller's own transaction the
// settings last until that transaction ends.
func queryAfter(ctx context.Context, db DBTX, setup, sql string, args ...any) (pgx.Rows, error) {
	b, ok := db.(batcher)
	if !ok {
		return db.Query(ctx, sql, args...)
	}
	var batch pgx.Batch
	batch.Queue(setup)
	batch.Queue(sql, args...)
	br := b.SendBatch(ctx, &batch)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// batchRows closes its batch with its rows.
type batchRows struct {
	pgx.Rows
	br  pgx.BatchResults
	err error // from closing the batch: the commit's, if it failed
}

func (r *batchRows) Close() {
	r.Rows.Close()
	if err := r.br.Close(); err != nil && r.Rows.Err() == nil {
		r.err = err
	}
}

func (r *batchRows) Err() error {
	if r.err != nil {
		return r.err
	}
	return r.Rows.Err()
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

// HeldRun names a run a worker holds and the epoch it holds it with.
type HeldRun struct {
	RunID uuid.UUID
	Epoch int64
}

// HeartbeatResult is what a heartbeat learns of one run it still holds.
type HeartbeatResult struct {
	RunID           uuid.UUID
	CancelRequested bool
	// Extended: the beat extended the run's lease. A run whose row another
	// transaction was writing is not waited for, nor extended, this beat.
	Extended bool
}

// ReleaseRuns hands runs back at once (a worker shutting down): they become PENDING
// and claimable now, and the workers of their types are notified. A run whose cancel
// was requested ends CANCELLED instead. Runs whose lease this worker no longer holds
// are left alone.
func ReleaseRuns(ctx context.Context, db DBTX, held []HeldRun) error {
	ids := make([]uuid.UUID, len(held))
	epochs := make([]int64, len(held))
	for i, h := range held {
		ids[i], epochs[i] = h.RunID, h.Epoch
	}
	rows, err := queryAfter(ctx, db, KeyedPlansSQL, releaseRunsSQL, ids, epochs)
	if err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// releaseRunsSQL: see ReleaseRuns and KeyedPlansSQL.
const releaseRunsSQL = `
WITH upd AS (
	UPDATE kagzi.runs r SET
		status = CASE WHEN r.cancel_requested THEN 'CANCELLED' ELSE 'PENDING' END,
		finished_at = CASE WHEN r.cancel_requested THEN now() END,
		available_at = now(), locked_by = NULL, updated_at = now()
	FROM unnest($1::uuid[], $2::bigint[]) AS h(run_id, epoch)
	WHERE r.run_id = h.run_id AND r.lease_epoch = h.epoch AND coalesce(r.status, '') = 'RUNNING'
	RETURNING r.run_id, r.namespace, r.workflow_type, r.status, r.available_at
)
SELECT ` + notifyRunSQL + ` FROM upd`

// ownerCTE is the fence of a worker's write that adds to a run (a step, a sleep, a
// signal taken): "owner" holds the run only while it is RUNNING under the caller's
// lease epoch ($1 the run, $2 the epoch). FOR KEY SHARE holds off a concurrent claim,
// which would bump the epoch, until the write commits; a claim that committed first
// leaves "owner" empty, and the write records nothing.
const ownerCTE = `owner AS (
	SELECT run_id FROM kagzi.runs
	WHERE run_id = $1 AND lease_epoch = $2 AND status = 'RUNNING'
	FOR KEY SHARE
)`

// StepWrite records the outcome of one step attempt.
type StepWrite struct {
	RunID uuid.UUID
	Epoch int64
	Key   string
	Name  string
	// Position is the step's among the calls of its scope.
	Position int
	// Status is the attempt's: COMPLETED, FAILED or TIMED_OUT.
	Status vocab.StepStatus
	// StepStatus is the step's after this attempt: COMPLETED, RETRYING or FAILED.
	StepStatus vocab.StepStatus
	Output     []byte
	Error      []byte
	StartedAt  time.Time
	FinishedAt time.Time
	// RetryIn, when set, also releases the run until the next attempt is due: it
	// becomes PENDING, claimable after RetryIn (or at its deadline, if sooner), and
	// holds no slot meanwhile.
	RetryIn *time.Duration
}

// ErrStepRecorded means the step already has a recorded output; the caller must use it.
var ErrStepRecorded = errors.New("step already recorded")

// recordStepCTEs record a step attempt ($1 run, $2 epoch, $3 key, $4 name, $5 the
// attempt's status, $6 output, $7 error, $8 started, $9 finished, $10 the step's
// status, $11 position): the step row (its output once it completed, the attempt's
// start and end) and, unless the step completed at its first attempt (the step row
// tells all of that one), the attempt's history row. They are fenced: the run must
// be RUNNING under the caller's lease epoch. FOR KEY SHARE holds off a concurrent
// claim (which would bump the epoch) until this commits; a claim that committed first
// makes the owner CTE empty. A completed step's output is never overwritten.
const recordStepCTEs = `
WITH ` + ownerCTE + `, step AS (
	INSERT INTO kagzi.steps AS s (run_id, step_key, name, kind, status, output, error, attempts, position,
		started_at, finished_at)
	SELECT $1, $3, $4, 'STEP', $10, $6, $7, 1, $11, $8, $9
	FROM owner
	ON CONFLICT (run_id, step_key) DO UPDATE SET
		status = excluded.status, output = excluded.output, error = excluded.error,
		attempts = s.attempts + 1, started_at = excluded.started_at, finished_at = excluded.finished_at,
		updated_at = now()
	WHERE s.status <> 'COMPLETED'
	RETURNING attempts
), attempt AS (
	INSERT INTO kagzi.step_attempts (run_id, step_key, attempt, status, error, started_at, finished_at)
	SELECT $1, $3, attempts, $5, $7, $8, $9 FROM step WHERE NOT (attempts = 1 AND $5 = 'COMPLETED')
)`

// recordStepSQL records a step attempt in one statement; see recordStepCTEs.
// Concurrent records share one statement: see recordStepsSQL.
const recordStepSQL = recordStepCTEs + `
SELECT (SELECT count(*) FROM owner), (SELECT attempts FROM step), NULL::text`

// recordStepReleaseSQL is recordStepSQL for a retry that waits out of process: it
// also releases the run until the next attempt is due ($12 milliseconds, or its
// deadline if sooner), and tells the workers of its type.
const recordStepReleaseSQL = recordStepCTEs + `, release AS (
	UPDATE kagzi.runs r SET
		status = CASE WHEN r.cancel_requested THEN 'CANCELLED' ELSE 'PENDING' END,
		finished_at = CASE WHEN r.cancel_requested THEN now() END,
		available_at = least(now() + $12 * interval '1 millisecond', r.deadline_at),
		locked_by = NULL, updated_at = now()
	FROM step
	WHERE r.run_id = $1
	RETURNING r.run_id, r.namespace, r.workflow_type, r.status, r.available_at
)
SELECT (SELECT count(*) FROM owner), (SELECT attempts FROM step),
	(SELECT (` + notifyRunSQL + `)::text FROM release)`

// notifyRunSQL is the notification for a run that was just released (columns run_id,
// namespace, workflow_type, status, available_at): its waiters when it ended
// CANCELLED, else the workers of its type with its next available time.
const notifyRunSQL = `CASE WHEN status = 'CANCELLED' THEN pg_notify('` + Channel + `', 'd|' || run_id || '|' || status)
	ELSE pg_notify('` + Channel + `', 'w|' || octet_length(namespace) || ':' || namespace || '|' || workflow_type || '|'
		|| (extract(epoch FROM available_at) * 1000)::bigint) END`

// Run ids go to hot statements as [16]byte: pgx encodes a uuid.UUID through its
// driver.Valuer (a string per id), a [16]byte as binary directly.

// RecordStep records a step attempt and returns its attempt number. It returns
// ErrLeaseLost when the caller no longer holds the run, and ErrStepRecorded when the
// step was already recorded as completed.
func RecordStep(ctx context.Context, db DBTX, w StepWrite) (attempt int, err error) {
	var owned int
	var att *int
	var notified *string
	if w.RetryIn == nil {
		err = db.QueryRow(ctx, recordStepSQL, [16]byte(w.RunID), w.Epoch, w.Key, w.Name, string(w.Status), w.Output,
			w.Error, w.StartedAt, w.FinishedAt, string(w.StepStatus), w.Position).Scan(&owned, &att, &notified)
	} else {
		err = db.QueryRow(ctx, recordStepReleaseSQL, [16]byte(w.RunID), w.Epoch, w.Key, w.Name, string(w.Status), w.Output,
			w.Error, w.StartedAt, w.FinishedAt, string(w.StepStatus), w.Position, w.RetryIn.Milliseconds()).Scan(&owned, &att, &notified)
	}
	switch {
	case err != nil:
		return 0, err
	case owned == 0:
		return 0, ErrLeaseLost
	case att == nil:
		return 0, ErrStepRecorded
	}
	return *att, nil
}

// RetryRun ends the current attempt of a run whose workflow function failed and
// schedules the next one after delay (or at the deadline, if sooner): the run becomes
// PENDING with its attempt number bumped and the error recorded. Fenced.
func RetryRun(ctx context.Context, db DBTX, runID uuid.UUID, epoch int64, errDetail []byte, delay time.Duration) error {
	var ignored string
	err := db.QueryRow(ctx, `
		WITH upd AS (
			UPDATE kagzi.runs r SET
				status = CASE WHEN r.cancel_requested THEN 'CANCELLED' ELSE 'PENDING' END,
				finished_at = CASE WHEN r.cancel_requested THEN now() END,
				attempt = r.attempt + 1, error = $3,
				available_at = least(now() + $4 * interval '1 millisecond', r.deadline_at),
				locked_by = NULL, updated_at = now()
			WHERE r.run_id = $1 AND r.lease_epoch = $2 AND r.status = 'RUNNING'
			RETURNING r.run_id, r.namespace, r.workflow_type, r.status, r.available_at
		)
		SELECT (`+notifyRunSQL+`)::text FROM upd`, runID, epoch, errDetail, delay.Milliseconds()).Scan(&ignored)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrLeaseLost
	}
	return err
}

// GetStepOutput reads a completed step's output.
func GetStepOutput(ctx context.Context, db DBTX, runID uuid.UUID, key string) ([]byte, error) {
	var out []byte
	err := db.QueryRow(ctx, `SELECT output FROM kagzi.steps WHERE run_id = $1 AND step_key = $2
		AND status = 'COMPLETED'`, runID, key).Scan(&out)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	return out, err
}

// SleepWrite records a durable sleep.
type SleepWrite struct {
	RunID    uuid.UUID
	Epoch    int64
	Key      string
	Name     string
	Position int
	// WakeAt is the absolute wake time; when nil, the wake time is the database's
	// now() plus Duration.
	WakeAt   *time.Time
	Duration time.Duration
}

// RecordSleep records a sleep step and returns its wake time and the database's
// clock. The run keeps running (an in-process sleep). Fenced like RecordStep.
func RecordSleep(ctx context.Context, db DBTX, w SleepWrite) (wakeAt, dbNow time.Time, err error) {
	var owned int
	var wake *time.Time
	err = db.QueryRow(ctx, `
		WITH `+ownerCTE+`, step AS (
			INSERT INTO kagzi.steps (run_id, step_key, name, kind, status, wake_at, position)
			SELECT $1, $3, $4, 'SLEEP', 'COMPLETED', coalesce($5, now() + $6 * interval '1 millisecond'), $7
			FROM owner
			ON CONFLICT (run_id, step_key) DO UPDATE SET updated_at = now()
			RETURNING wake_at
		)
		SELECT (SELECT count(*) FROM owner), (SELECT wake_at FROM step), now()`,
		w.RunID, w.Epoch, w.Key, w.Name, w.WakeAt, w.Duration.Milliseconds(), w.Position).Scan(&owned, &wake, &dbNow)
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	if owned == 0 || wake == nil {
		return time.Time{}, time.Time{}, ErrLeaseLost
	}
	return *wake, dbNow, nil
}

// suspendSQL releases a running run until a wake time, recording the sleep step
// first when it is new ($3 not empty), in one statement: the run becomes SLEEPING with
// available_at = the wake time (or its deadline, if sooner), holds no lease and no worker slot, and every worker
// of its type is told the wake time. A run whose cancel was requested ends CANCELLED.
const suspendSQL = `
WITH owner AS (
	SELECT run_id, cancel_requested, coalesce($5, now() + $6 * interval '1 millisecond') AS wake_at
	FROM kagzi.runs
	WHERE run_id = $1 AND lease_epoch = $2 AND status = 'RUNNING'
	FOR UPDATE
), step AS (
	INSERT INTO kagzi.steps (run_id, step_key, name, kind, status, wake_at, position)
	SELECT $1, $3, $4, 'SLEEP', 'COMPLETED', wake_at, $7 FROM owner WHERE $3 <> ''
	ON CONFLICT (run_id, step_key) DO NOTHING
), upd AS (
	UPDATE kagzi.runs r SET
		status = CASE WHEN o.cancel_requested THEN 'CANCELLED' ELSE 'SLEEPING' END,
		finished_at = CASE WHEN o.cancel_requested THEN now() END,
		available_at = least(o.wake_at, r.deadline_at), locked_by = NULL, updated_at = now()
	FROM owner o
	WHERE r.run_id = o.run_id
	RETURNING r.run_id, r.namespace, r.workflow_type, r.status, r.available_at
)
SELECT status, (` + notifyRunSQL + `)::text FROM upd`

// Suspend puts a running run to sleep until its wake time and releases it; see
// suspendSQL. With an empty Key the sleep is already recorded and WakeAt must be set.
// It returns the run's new status (SLEEPING, or CANCELLED).
func Suspend(ctx context.Context, db DBTX, w SleepWrite) (status vocab.RunStatus, err error) {
	var ignored string
	err = db.QueryRow(ctx, suspendSQL, [16]byte(w.RunID), w.Epoch, w.Key, w.Name, w.WakeAt,
		w.Duration.Milliseconds(), w.Position).Scan(&status, &ignored)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrLeaseLost
	}
	return status, err
}

// finishRunSQL ends a run the caller holds: COMPLETED with its output, FAILED with its
// error, or CANCELLED. A cancel requested before this commits wins: the run ends
// CANCELLED and the output is discarded. Waiters in other clients are notified when
// there are any (see remoteWaitersSQL); the caller ($12, its client) tells its own
// client's waiters in process. When $6 (a step key)
// is set, the same statement also records that step as completed (output $8): the
// run's last step, whose record was held back until the end so that both share one
// write (see FinishRun). The update of the run is the fence: the step is recorded
// only if the run was still held under the caller's epoch.
var finishRunSQL = `
WITH upd AS (
	UPDATE kagzi.runs r SET
		status = CASE WHEN r.cancel_requested THEN 'CANCELLED' ELSE $3 END,
		output = CASE WHEN r.cancel_requested THEN NULL ELSE $4::jsonb END,
		error = CASE WHEN r.cancel_requested THEN NULL ELSE $5::jsonb END,
		finished_at = now(), locked_by = NULL, updated_at = now()
	WHERE r.run_id = $1 AND r.lease_epoch = $2 AND r.status = 'RUNNING'
	RETURNING r.run_id, r.namespace, r.status
), step AS (
	INSERT INTO kagzi.steps AS s (run_id, step_key, name, kind, status, output, attempts, position,
		started_at, finished_at)
	SELECT $1, $6, $7, 'STEP', 'COMPLETED', $8, 1, $11, $9, $10 FROM upd WHERE $6::text IS NOT NULL
	ON CONFLICT (run_id, step_key) DO UPDATE SET
		status = 'COMPLETED', output = excluded.output, error = NULL, attempts = s.attempts + 1,
		started_at = excluded.started_at, finished_at = excluded.finished_at, updated_at = now()
	WHERE s.status <> 'COMPLETED'
	RETURNING attempts
), attempt AS (
	INSERT INTO kagzi.step_attempts (run_id, step_key, attempt, status, started_at, finished_at)
	SELECT $1, $6, attempts, 'COMPLETED', $9, $10 FROM step WHERE attempts > 1
)
SELECT status, coalesce(CASE WHEN ` + remoteWaitersSQL("upd.namespace", "$12::uuid") + `
	THEN pg_notify('` + Channel + `', 'd|' || run_id || '|' || status)::text END, '') FROM upd`

// remoteWaitersSQL is true when a client other than me waits for run ends in the
// namespace (kagzi.waiters). A run's end notifies only then: a notifying transaction
// holds a server-wide lock through its commit, and the ending worker tells its own
// client's waiters in process.
func remoteWaitersSQL(namespace, me string) string {
	return `EXISTS (SELECT 1 FROM kagzi.waiters w WHERE w.namespace = ` + namespace +
		` AND w.client_id <> ` + me + ` AND w.expires_at > now())`
}

// RegisterWaiter records that the client waits for run ends in the namespace until ttl
// from now (see remoteWaitersSQL), and deletes the namespace's registrations expired
// for an hour.
func RegisterWaiter(ctx context.Context, db DBTX, namespace string, clientID uuid.UUID, ttl time.Duration) error {
	_, err := db.Exec(ctx, `
WITH gone AS (
	DELETE FROM kagzi.waiters WHERE namespace = $1 AND expires_at < now() - interval '1 hour'
)
INSERT INTO kagzi.waiters (namespace, client_id, expires_at)
VALUES ($1, $2, now() + $3 * interval '1 millisecond')
ON CONFLICT (namespace, client_id) DO UPDATE SET expires_at = excluded.expires_at`,
		namespace, clientID, ttl.Milliseconds())
	return err
}

// FinishRun ends a run for the worker of the client clientID; see finishRunSQL. It
// returns the status the run ended with.
// last, when not nil, is a completed step not yet recorded: it is recorded in the
// same statement (its Status and StepStatus are COMPLETED, Error is nil).
func FinishRun(ctx context.Context, db DBTX, clientID, runID uuid.UUID, epoch int64, status vocab.RunStatus,
	output, errDetail []byte, last *StepWrite) (vocab.RunStatus, error) {
	var final vocab.RunStatus
	var ignored string
	var key, name *string
	var stepOut []byte
	var started, finished *time.Time
	var position *int
	if last != nil {
		key, name, stepOut = &last.Key, &last.Name, last.Output
		started, finished, position = &last.StartedAt, &last.FinishedAt, &last.Position
	}
	err := db.QueryRow(ctx, finishRunSQL, [16]byte(runID), epoch, string(status), output, errDetail,
		key, name, stepOut, started, finished, position, [16]byte(clientID)).Scan(&final, &ignored)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrLeaseLost
	}
	return final, err
}
