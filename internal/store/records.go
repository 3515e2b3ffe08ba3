package store

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/kagzi/kagzi/internal/vocab"
)

// The step records and sleeps of a worker's runs: set writes (see setWrite), which the
// worker's committer sends for one run alone or merged for many.

// StepWrite records the outcome of one step attempt.
type StepWrite struct {
	Fence
	Key  string
	Name string
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

// recordStepsSQL records step attempts: the step row (its output once it completed,
// the attempt's start and end) and, unless the step completed at its first attempt
// (the step row tells all of that one), the attempt's history row. The fence is per
// run (one row lock for the records of a run's parallel branches). A completed
// step's output is never overwritten. Each input returns whether its fence held and
// the step's attempt count (NULL: the step was already completed). With release, the
// statement also releases each run until its next attempt is due (retry_in_ms) and
// tells the workers of its type: the same statement with two more CTEs, which would
// cost every step record a fifth of its time if it were always there.
func recordStepsSQL(release bool) string {
	sql := `
owner AS (
	SELECT run_id, lease_epoch, lease_token FROM kagzi.runs
	WHERE run_id IN (SELECT run_id FROM i) AND coalesce(status, '') = 'RUNNING' -- see KeyedPlansSQL
	  AND ` + slotHeldSQL + `
	FOR KEY SHARE
), step AS (
	INSERT INTO kagzi.steps AS s (run_id, step_key, name, kind, status, output, error, attempts, position,
		started_at, finished_at)
	SELECT i.run_id, i.step_key, i.name, 'STEP', i.step_status, i.output, i.error, 1, i.position,
		i.started_at, i.finished_at
	FROM i JOIN owner o ON o.run_id = i.run_id AND o.lease_epoch = i.epoch AND o.lease_token IS NOT DISTINCT FROM i.token
	ON CONFLICT (run_id, step_key) DO UPDATE SET
		status = excluded.status, output = excluded.output, error = excluded.error,
		-- The same attempt written again (a try whose answer the connection lost, then
		-- tried again: its start time is the attempt's) is not another attempt.
		attempts = s.attempts + CASE WHEN s.started_at = excluded.started_at THEN 0 ELSE 1 END,
		started_at = excluded.started_at, finished_at = excluded.finished_at,
		updated_at = now()
	WHERE s.status <> 'COMPLETED'
	RETURNING s.run_id, s.step_key, s.attempts
), attempt AS (
	INSERT INTO kagzi.step_attempts (run_id, step_key, attempt, status, error, started_at, finished_at)
	SELECT i.run_id, i.step_key, st.attempts, i.status, i.error, i.started_at, i.finished_at
	FROM step st JOIN i ON i.run_id = st.run_id AND i.step_key = st.step_key
	WHERE NOT (st.attempts = 1 AND i.status = 'COMPLETED')
	ON CONFLICT (run_id, step_key, attempt) DO NOTHING
)`
	notified := "0::bigint"
	if release {
		sql += `, release AS (
	UPDATE kagzi.runs r SET ` + releaseSQL("PENDING", "now() + i.retry_in_ms * interval '1 millisecond'") + `
	FROM i JOIN step st ON st.run_id = i.run_id AND st.step_key = i.step_key
	WHERE r.run_id = i.run_id
	RETURNING ` + releasedColumns + `
), notified AS (
	SELECT (` + notifyRunSQL + `)::text FROM release
)`
		notified = "(SELECT count(*) FROM notified)"
	}
	return sql + `
SELECT i.ord, (o.run_id IS NOT NULL)::integer, st.attempts, ` + notified + `
FROM i
LEFT JOIN owner o ON o.run_id = i.run_id AND o.lease_epoch = i.epoch AND o.lease_token IS NOT DISTINCT FROM i.token
LEFT JOIN step st ON st.run_id = i.run_id AND st.step_key = i.step_key`
}

// stepArgs are the parameters of the step records.
func stepArgs(release bool) []param[*StepWrite] {
	args := append(fenceArgs[*StepWrite](),
		arg("step_key", "text", func(w *StepWrite) string { return w.Key }),
		arg("name", "text", func(w *StepWrite) string { return w.Name }),
		arg("status", "text", func(w *StepWrite) string { return string(w.Status) }),
		arg("output", "jsonb", func(w *StepWrite) []byte { return w.Output }),
		arg("error", "jsonb", func(w *StepWrite) []byte { return w.Error }),
		arg("started_at", "timestamptz", func(w *StepWrite) time.Time { return w.StartedAt }),
		arg("finished_at", "timestamptz", func(w *StepWrite) time.Time { return w.FinishedAt }),
		arg("step_status", "text", func(w *StepWrite) string { return string(w.StepStatus) }),
		arg("position", "integer", func(w *StepWrite) int32 { return int32(w.Position) }),
	)
	if release {
		args = append(args, arg("retry_in_ms", "bigint", func(w *StepWrite) int64 { return w.RetryIn.Milliseconds() }))
	}
	return args
}

// recordSteps and recordStepsReleasing are the two forms of recordStepsSQL: without
// and with the release of the run until the next attempt (StepWrite.RetryIn).
var (
	recordSteps          = newSetWrite("record steps", recordStepsSQL(false), stepArgs(false)...)
	recordStepsReleasing = newSetWrite("record steps and release", recordStepsSQL(true), stepArgs(true)...)
)

// RecordStep records a step attempt and returns its attempt number. It returns
// ErrLeaseLost when the caller no longer holds the run, and ErrStepRecorded when the
// step was already recorded as completed.
func RecordStep(ctx context.Context, db Writer, w StepWrite) (attempt int, err error) {
	// Targets pgx scans into without allocating (see committer.ReadOne).
	var owned int32
	var att pgtype.Int4
	var notified int64
	s := recordSteps
	if w.RetryIn != nil {
		s = recordStepsReleasing
	}
	if err := write(ctx, db, s, &w, &owned, &att, &notified); err != nil {
		return 0, err
	}
	switch {
	case owned == 0:
		return 0, ErrLeaseLost
	case !att.Valid:
		return 0, ErrStepRecorded
	}
	return int(att.Int32), nil
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
	Fence
	// Key and Name are the sleep step's; an empty Key (Suspend only) means the sleep
	// is already recorded, and WakeAt must be set.
	Key      string
	Name     string
	Position int
	// WakeAt is the absolute wake time; when nil, the wake time is the database's
	// now() plus Duration.
	WakeAt   *time.Time
	Duration time.Duration
}

// sleepArgs are the parameters of the sleep writes.
func sleepArgs() []param[*SleepWrite] {
	return append(fenceArgs[*SleepWrite](),
		arg("step_key", "text", func(w *SleepWrite) string { return w.Key }),
		arg("name", "text", func(w *SleepWrite) string { return w.Name }),
		arg("wake_at", "timestamptz", func(w *SleepWrite) *time.Time { return w.WakeAt }),
		arg("duration_ms", "bigint", func(w *SleepWrite) int64 { return w.Duration.Milliseconds() }),
		arg("position", "integer", func(w *SleepWrite) int32 { return int32(w.Position) }),
	)
}

// recordSleeps records sleep steps of runs that keep running (in-process sleeps): the
// wake time is fixed by the first record and kept by any later one. Each input
// returns whether its fence held, the step's wake time, and the database's clock.
var recordSleeps = newSetWrite[*SleepWrite]("record sleeps", `
owner AS (
	SELECT run_id, lease_epoch, lease_token FROM kagzi.runs
	WHERE run_id IN (SELECT run_id FROM i) AND coalesce(status, '') = 'RUNNING' -- see KeyedPlansSQL
	  AND `+slotHeldSQL+`
	FOR KEY SHARE
), step AS (
	INSERT INTO kagzi.steps AS s (run_id, step_key, name, kind, status, wake_at, position)
	SELECT i.run_id, i.step_key, i.name, 'SLEEP', 'COMPLETED',
		coalesce(i.wake_at, now() + i.duration_ms * interval '1 millisecond'), i.position
	FROM i JOIN owner o ON o.run_id = i.run_id AND o.lease_epoch = i.epoch AND o.lease_token IS NOT DISTINCT FROM i.token
	ON CONFLICT (run_id, step_key) DO UPDATE SET updated_at = now()
	RETURNING s.run_id, s.step_key, s.wake_at
)
SELECT i.ord, (o.run_id IS NOT NULL)::integer, st.wake_at, now()
FROM i
LEFT JOIN owner o ON o.run_id = i.run_id AND o.lease_epoch = i.epoch AND o.lease_token IS NOT DISTINCT FROM i.token
LEFT JOIN step st ON st.run_id = i.run_id AND st.step_key = i.step_key`, sleepArgs()...)

// RecordSleep records a sleep step and returns its wake time and the database's
// clock. The run keeps running (an in-process sleep).
func RecordSleep(ctx context.Context, db Writer, w SleepWrite) (wakeAt, dbNow time.Time, err error) {
	var owned int32
	var wake pgtype.Timestamptz
	if err := write(ctx, db, recordSleeps, &w, &owned, &wake, &dbNow); err != nil {
		return time.Time{}, time.Time{}, err
	}
	if owned == 0 || !wake.Valid {
		return time.Time{}, time.Time{}, ErrLeaseLost
	}
	return wake.Time, dbNow, nil
}

// suspends release running runs until a wake time, recording each one's sleep step
// first when it is new (step_key not empty): the run becomes SLEEPING, holds no lease
// and no worker slot, and the workers of its type are told the wake time. A run whose
// cancel was requested ends CANCELLED. Each input that held its fence returns the
// run's new status.
var suspends = newSetWrite[*SleepWrite]("suspends", `
owner AS (
	SELECT r.run_id, i.ord, coalesce(i.wake_at, now() + i.duration_ms * interval '1 millisecond') AS wake_at
	FROM kagzi.runs r JOIN i ON r.run_id = i.run_id AND r.lease_epoch = i.epoch
		AND r.lease_token IS NOT DISTINCT FROM i.token
	WHERE coalesce(r.status, '') = 'RUNNING' -- see KeyedPlansSQL
	  AND `+slotHeldRSQL+`
	FOR UPDATE OF r
), step AS (
	INSERT INTO kagzi.steps (run_id, step_key, name, kind, status, wake_at, position)
	SELECT i.run_id, i.step_key, i.name, 'SLEEP', 'COMPLETED', o.wake_at, i.position
	FROM owner o JOIN i ON i.ord = o.ord
	WHERE i.step_key <> ''
	ON CONFLICT (run_id, step_key) DO NOTHING
), upd AS (
	UPDATE kagzi.runs r SET `+releaseSQL("SLEEPING", "o.wake_at")+`
	FROM owner o
	WHERE r.run_id = o.run_id
	RETURNING o.ord, `+releasedColumns+`
)
SELECT ord, status, (`+notifyRunSQL+`)::text FROM upd`, sleepArgs()...)

// Suspend puts a running run to sleep until its wake time and releases it; see
// suspends. It returns the run's new status (SLEEPING, or CANCELLED).
func Suspend(ctx context.Context, db Writer, w SleepWrite) (vocab.RunStatus, error) {
	var status, notified string // not vocab.RunStatus: pgx scans a named type through reflection
	err := write(ctx, db, suspends, &w, &status, &notified)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrLeaseLost
	}
	return vocab.RunStatus(status), err
}

// retryRun ends the current attempt of a run whose workflow function failed and
// schedules the next one: the run becomes PENDING with its attempt bumped and the
// error recorded.
var retryRun = named(`
WITH upd AS (
	UPDATE kagzi.runs r SET attempt = r.attempt + 1, error = @error,
		`+releaseSQL("PENDING", "now() + @delay_ms * interval '1 millisecond'")+`
	WHERE r.run_id = @run_id AND r.lease_epoch = @epoch AND r.lease_token IS NOT DISTINCT FROM @token AND r.status = 'RUNNING'
	  AND `+slotHeldRSQL+`
	RETURNING `+releasedColumns+`
)
SELECT (`+notifyRunSQL+`)::text FROM upd`,
	append(fenceArgs[runRetry](),
		arg("error", "jsonb", func(r runRetry) []byte { return r.detail }),
		arg("delay_ms", "bigint", func(r runRetry) int64 { return r.delay.Milliseconds() }))...)

type runRetry struct {
	Fence
	detail []byte
	delay  time.Duration
}

// RetryRun schedules the next attempt of a run whose workflow function failed after
// delay (or at the deadline, if sooner), recording its error; see retryRun.
func RetryRun(ctx context.Context, db DBTX, f Fence, errDetail []byte, delay time.Duration) error {
	var notified string
	err := db.QueryRow(ctx, retryRun.sql, retryRun.args(runRetry{f, errDetail, delay})...).Scan(&notified)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrLeaseLost
	}
	return err
}
