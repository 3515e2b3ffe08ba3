package store

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// ScheduleTopic is notified when a schedule of the namespace is created, changed or
// resumed, so that schedulers look again at when the next tick is due; the extra
// part is the schedule's next fire time in Unix milliseconds (empty when paused).
func ScheduleTopic(namespace string) string { return "s|" + namespace }

// Overlap policies, as stored.
const (
	OverlapAllow     = "ALLOW"
	OverlapSkip      = "SKIP"
	OverlapBufferOne = "BUFFER_ONE"
)

// Schedule is one row of kagzi.schedules.
type Schedule struct {
	Namespace      string
	ScheduleID     string
	WorkflowType   string
	Cron           string
	CronSeconds    bool
	TimeZone       string
	Input          []byte
	Paused         bool
	MaxCatchup     int
	Overlap        string
	NextFireAt     *time.Time
	LastFiredAt    *time.Time
	LastRunID      *uuid.UUID
	BufferedTick   *time.Time
	CatchupSkipped int64
	OverlapSkipped int64
	CreatedAt      time.Time
	UpdatedAt      time.Time
}

const scheduleColumns = `namespace, schedule_id, workflow_type, cron, cron_seconds, time_zone, input,
	paused, max_catchup, overlap, next_fire_at, last_fired_at, last_run_id, buffered_tick,
	catchup_skipped, overlap_skipped, created_at, updated_at`

func scanSchedule(row pgx.Row, extra ...any) (Schedule, error) {
	var s Schedule
	dest := []any{&s.Namespace, &s.ScheduleID, &s.WorkflowType, &s.Cron, &s.CronSeconds, &s.TimeZone,
		&s.Input, &s.Paused, &s.MaxCatchup, &s.Overlap, &s.NextFireAt, &s.LastFiredAt, &s.LastRunID,
		&s.BufferedTick, &s.CatchupSkipped, &s.OverlapSkipped, &s.CreatedAt, &s.UpdatedAt}
	err := row.Scan(append(dest, extra...)...)
	return s, err
}

// notifySchedule is the pg_notify that tells schedulers a schedule changed; it reads
// the row as RETURNING gives it.
const notifySchedule = `pg_notify('` + Channel + `', 's|' || namespace || '|' ||
	coalesce(((extract(epoch FROM next_fire_at) * 1000)::bigint)::text, ''))`

// ScheduleDefinition is what a user sets on a schedule.
type ScheduleDefinition struct {
	WorkflowType string
	Cron         string
	CronSeconds  bool
	TimeZone     string
	Input        []byte
	MaxCatchup   int
	Overlap      string
}

// insertScheduleSQL creates a schedule and notifies the schedulers in one statement;
// it returns no row when the id is taken.
const insertScheduleSQL = `
INSERT INTO kagzi.schedules (namespace, schedule_id, workflow_type, cron, cron_seconds, time_zone,
	input, paused, max_catchup, overlap, next_fire_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (namespace, schedule_id) DO NOTHING
RETURNING ` + scheduleColumns + `, ` + notifySchedule + `::text`

// InsertSchedule creates a schedule; nextFireAt is nil for a paused one. It returns
// inserted = false, and writes nothing, when the id is taken.
func InsertSchedule(ctx context.Context, db DBTX, namespace, id string, d ScheduleDefinition,
	nextFireAt *time.Time) (s Schedule, inserted bool, err error) {
	var notified string
	s, err = scanSchedule(db.QueryRow(ctx, insertScheduleSQL, namespace, id, d.WorkflowType, d.Cron,
		d.CronSeconds, d.TimeZone, d.Input, nextFireAt == nil, d.MaxCatchup, d.Overlap, nextFireAt), &notified)
	if errors.Is(err, pgx.ErrNoRows) {
		return Schedule{}, false, nil
	}
	return s, err == nil, err
}

// GetSchedule reads one schedule of the namespace.
func GetSchedule(ctx context.Context, db DBTX, namespace, id string) (Schedule, error) {
	s, err := scanSchedule(db.QueryRow(ctx, `SELECT `+scheduleColumns+` FROM kagzi.schedules
		WHERE namespace = $1 AND schedule_id = $2`, namespace, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Schedule{}, ErrNotFound
	}
	return s, err
}

// LockSchedule reads one schedule and locks it for the rest of the transaction,
// waiting for a scheduler that is firing it.
func LockSchedule(ctx context.Context, tx pgx.Tx, namespace, id string) (Schedule, error) {
	s, err := scanSchedule(tx.QueryRow(ctx, `SELECT `+scheduleColumns+` FROM kagzi.schedules
		WHERE namespace = $1 AND schedule_id = $2 FOR UPDATE`, namespace, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Schedule{}, ErrNotFound
	}
	return s, err
}

// ListSchedulesParams filters ListSchedules. Zero fields do not filter.
type ListSchedulesParams struct {
	Namespace    string
	WorkflowType string
	Paused       *bool
	// AfterID is the keyset cursor: the id of the last schedule of the previous page.
	AfterID string
	Limit   int
}

// ListSchedules lists schedules by id, one page at a time.
func ListSchedules(ctx context.Context, db DBTX, p ListSchedulesParams) ([]Schedule, error) {
	args := []any{p.Namespace}
	where := "namespace = $1"
	add := func(cond string, v any) {
		args = append(args, v)
		where += " AND " + cond + "$" + strconv.Itoa(len(args))
	}
	if p.WorkflowType != "" {
		add("workflow_type = ", p.WorkflowType)
	}
	if p.Paused != nil {
		add("paused = ", *p.Paused)
	}
	if p.AfterID != "" {
		add("schedule_id > ", p.AfterID)
	}
	args = append(args, p.Limit)
	rows, err := db.Query(ctx, `SELECT `+scheduleColumns+` FROM kagzi.schedules WHERE `+where+
		` ORDER BY schedule_id LIMIT $`+strconv.Itoa(len(args)), args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Schedule, error) { return scanSchedule(row) })
}

// updateScheduleSQL replaces a schedule's definition, pause state and next fire time,
// and notifies the schedulers. A buffered tick survives only while the schedule stays
// active under BUFFER_ONE. The caller holds the row lock (LockSchedule).
const updateScheduleSQL = `
UPDATE kagzi.schedules SET
	workflow_type = $3, cron = $4, cron_seconds = $5, time_zone = $6, input = $7,
	max_catchup = $8, overlap = $9, paused = $10::timestamptz IS NULL, next_fire_at = $10,
	buffered_tick = CASE WHEN $10::timestamptz IS NOT NULL AND $9 = 'BUFFER_ONE' THEN buffered_tick END,
	updated_at = now()
WHERE namespace = $1 AND schedule_id = $2
RETURNING ` + scheduleColumns + `, ` + notifySchedule + `::text`

// UpdateSchedule writes a schedule's definition; nextFireAt nil pauses it.
func UpdateSchedule(ctx context.Context, db DBTX, namespace, id string, d ScheduleDefinition,
	nextFireAt *time.Time) (Schedule, error) {
	var notified string
	s, err := scanSchedule(db.QueryRow(ctx, updateScheduleSQL, namespace, id, d.WorkflowType, d.Cron,
		d.CronSeconds, d.TimeZone, d.Input, d.MaxCatchup, d.Overlap, nextFireAt), &notified)
	if errors.Is(err, pgx.ErrNoRows) {
		return Schedule{}, ErrNotFound
	}
	return s, err
}

// pauseScheduleSQL pauses a schedule: it stops firing, and a buffered tick is dropped.
// It waits for a scheduler that is firing the schedule (the row lock).
const pauseScheduleSQL = `
UPDATE kagzi.schedules SET paused = true, next_fire_at = NULL, buffered_tick = NULL,
	updated_at = CASE WHEN paused THEN updated_at ELSE now() END
WHERE namespace = $1 AND schedule_id = $2`

// PauseSchedule pauses a schedule; pausing a paused one changes nothing.
func PauseSchedule(ctx context.Context, db DBTX, namespace, id string) error {
	tag, err := db.Exec(ctx, pauseScheduleSQL, namespace, id)
	if err == nil && tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return err
}

// resumeScheduleSQL resumes a paused schedule at nextFireAt and notifies the
// schedulers. The caller holds the row lock and saw it paused.
const resumeScheduleSQL = `
UPDATE kagzi.schedules SET paused = false, next_fire_at = $3, updated_at = now()
WHERE namespace = $1 AND schedule_id = $2 AND paused
RETURNING ` + notifySchedule + `::text`

// ResumeSchedule resumes a paused schedule; its next tick is nextFireAt.
func ResumeSchedule(ctx context.Context, db DBTX, namespace, id string, nextFireAt time.Time) error {
	var notified string
	err := db.QueryRow(ctx, resumeScheduleSQL, namespace, id, nextFireAt).Scan(&notified)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	return err
}

// DeleteSchedule deletes a schedule. It waits for a scheduler that is firing it, and
// leaves the runs it fired alone.
func DeleteSchedule(ctx context.Context, db DBTX, namespace, id string) error {
	tag, err := db.Exec(ctx, `DELETE FROM kagzi.schedules WHERE namespace = $1 AND schedule_id = $2`, namespace, id)
	if err == nil && tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return err
}

// claimDueSchedulesSQL locks up to $3 schedules of the namespace that have something
// to fire at time $2: a tick that is due, or a buffered tick whose blocking run
// finished. SKIP LOCKED lets every process's scheduler claim side by side; a schedule
// another scheduler is firing is skipped, and is no longer due once that commits.
const claimDueSchedulesSQL = `
SELECT ` + scheduleColumns + ` FROM kagzi.schedules s
WHERE namespace = $1 AND NOT paused AND NOT (schedule_id = ANY($4))
  AND (next_fire_at <= $2
       OR (buffered_tick IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM kagzi.runs r
           WHERE r.namespace = s.namespace AND r.schedule_id = s.schedule_id
             AND r.status IN ('PENDING', 'RUNNING', 'SLEEPING'))))
ORDER BY next_fire_at
LIMIT $3
FOR UPDATE SKIP LOCKED`

// ClaimDueSchedules locks the schedules that have something to fire at now, for the
// rest of the transaction tx, except those of passedOver (which the caller cannot read).
func ClaimDueSchedules(ctx context.Context, tx pgx.Tx, namespace string, now time.Time, limit int,
	passedOver []string) ([]Schedule, error) {
	if passedOver == nil {
		passedOver = []string{}
	}
	rows, err := tx.Query(ctx, claimDueSchedulesSQL, namespace, now, limit, passedOver)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Schedule, error) { return scanSchedule(row) })
}

// activeScheduleRunsSQL lists which of the schedules have a run that is not finished.
// Run after the claim, it takes a fresh snapshot that sees every run fired before the
// claim's locks were granted.
const activeScheduleRunsSQL = `
SELECT DISTINCT schedule_id FROM kagzi.runs
WHERE namespace = $1 AND schedule_id = ANY($2) AND status IN ('PENDING', 'RUNNING', 'SLEEPING')`

// ActiveScheduleRuns reports which of the schedules have an active run.
func ActiveScheduleRuns(ctx context.Context, db DBTX, namespace string, ids []string) (map[string]bool, error) {
	rows, err := db.Query(ctx, activeScheduleRunsSQL, namespace, ids)
	if err != nil {
		return nil, err
	}
	active, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(active))
	for _, id := range active {
		out[id] = true
	}
	return out, nil
}

// Fired is what a scheduler pass did to one schedule, recorded by RecordFired in the
// transaction that inserted the runs.
type Fired struct {
	// NextFireAt is the schedule's next tick; nil when it will never fire again
	// (the schedule is paused).
	NextFireAt *time.Time
	// LastFiredAt and LastRunID are the newest tick fired and its run; nil when the pass
	// fired nothing.
	LastFiredAt *time.Time
	LastRunID   *uuid.UUID
	// BufferedTick is the tick held back under BUFFER_ONE, nil for none.
	BufferedTick   *time.Time
	CatchupSkipped int64
	OverlapSkipped int64
}

// recordFiredSQL advances a schedule after a fire; the caller holds the row lock
// (ClaimDueSchedules or LockSchedule). It leaves updated_at, which tells when the
// definition last changed, alone.
const recordFiredSQL = `
UPDATE kagzi.schedules SET
	next_fire_at = $3, paused = $3::timestamptz IS NULL,
	last_fired_at = coalesce($4, last_fired_at), last_run_id = coalesce($5, last_run_id),
	buffered_tick = $6,
	catchup_skipped = catchup_skipped + $7, overlap_skipped = overlap_skipped + $8
WHERE namespace = $1 AND schedule_id = $2`

// RecordFired records a scheduler pass over a schedule.
func RecordFired(ctx context.Context, tx pgx.Tx, namespace, id string, f Fired) error {
	tag, err := tx.Exec(ctx, recordFiredSQL, namespace, id, f.NextFireAt, f.LastFiredAt, f.LastRunID,
		f.BufferedTick, f.CatchupSkipped, f.OverlapSkipped)
	if err == nil && tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return err
}

// recordTriggerSQL records a fire asked for by TriggerSchedule; the next tick stays.
const recordTriggerSQL = `
UPDATE kagzi.schedules SET last_fired_at = $3, last_run_id = $4
WHERE namespace = $1 AND schedule_id = $2`

// RecordTrigger records an extra fire of the schedule at tick, with its run.
func RecordTrigger(ctx context.Context, tx pgx.Tx, namespace, id string, tick time.Time, runID uuid.UUID) error {
	_, err := tx.Exec(ctx, recordTriggerSQL, namespace, id, tick, runID)
	return err
}

// nextScheduleWakeSQL tells a scheduler when to look again: the earliest next tick of
// the namespace's active schedules (from the partial index schedules_due), and the
// active runs that hold back a buffered tick (whose completion it should listen for).
const nextScheduleWakeSQL = `
SELECT
	(SELECT min(next_fire_at) FROM kagzi.schedules WHERE namespace = $1 AND NOT paused
		AND NOT (schedule_id = ANY($3))),
	coalesce((SELECT array_agg(run_id) FROM (
		SELECT r.run_id FROM kagzi.schedules s
		JOIN kagzi.runs r ON r.namespace = s.namespace AND r.schedule_id = s.schedule_id
			AND r.status IN ('PENDING', 'RUNNING', 'SLEEPING')
		WHERE s.namespace = $1 AND NOT s.paused AND s.buffered_tick IS NOT NULL
		ORDER BY r.run_id
		LIMIT $2) blocking), '{}')`

// NextScheduleWake returns the earliest next tick (nil when no schedule is active) of
// the schedules not in passedOver and up to limit runs whose completion releases a
// buffered tick.
func NextScheduleWake(ctx context.Context, db DBTX, namespace string, limit int,
	passedOver []string) (next *time.Time, blockers []uuid.UUID, err error) {
	if passedOver == nil {
		passedOver = []string{}
	}
	err = db.QueryRow(ctx, nextScheduleWakeSQL, namespace, limit, passedOver).Scan(&next, &blockers)
	return next, blockers, err
}
