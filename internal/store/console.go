package store

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi/internal/vocab"
)

// The operator console's reads (package ui). Each reads an index range of bounded
// size: the console's pages must cost the same with a million runs as with a hundred,
// so counts are capped (the caller shows them as "at least") instead of counting a
// whole table.

// The unfinished runs that have an available_at lie in two partial indexes, whose
// predicates a query must imply to be read through them (else PostgreSQL reads the
// whole table, finished runs included): runs_claimable holds every one but the runs
// of a concurrency key not started yet, which runs_key_due holds (its priority >= 0
// is always true). Both are (namespace, workflow_type, available_at). The run is
// aliased r.
const (
	inRunsClaimableSQL = `r.status IN ('PENDING', 'RUNNING', 'SLEEPING') AND r.available_at IS NOT NULL
	  AND (r.flow_key IS NULL OR r.started_at IS NOT NULL)`
	inRunsKeyDueSQL = `r.flow_key IS NOT NULL AND r.started_at IS NULL AND r.status = 'PENDING' AND r.priority >= 0
	  AND r.available_at IS NOT NULL`
)

// unfinishedOfTypeSQL is the SELECT of columns of the unfinished runs (with an
// available_at) of one workflow type (the namespace and type are the SQL expressions
// ns and typ; the runs also match cond when it is not empty), in available_at order,
// the first limit of them: a merge of the two partial indexes' ranges.
func unfinishedOfTypeSQL(columns, ns, typ, cond, limit string) string {
	if cond != "" {
		cond = " AND " + cond
	}
	part := func(in string) string {
		return `(SELECT ` + columns + ` FROM kagzi.runs r
		WHERE r.namespace = ` + ns + ` AND r.workflow_type = ` + typ + ` AND ` + in + cond + `
		ORDER BY r.available_at LIMIT ` + limit + `)`
	}
	return `
	SELECT * FROM (` + part(inRunsClaimableSQL) + `
		UNION ALL ` + part(inRunsKeyDueSQL) + `) u
	ORDER BY u.available_at LIMIT ` + limit
}

// activeRunsOfType is the active runs of one workflow type ($1: namespace, t.workflow_type
// from the enclosing query) in available_at order, the first $3 of them: the runs
// claimable now come first (available_at in the past), then those waiting.
var activeRunsOfType = unfinishedOfTypeSQL(
	`r.run_id, r.workflow_id, r.workflow_type, r.status, r.available_at, r.created_at, r.locked_by, r.lease_epoch, r.takeovers`,
	"$1", "t.workflow_type", "", "$3")

// unfinishedTypesSQL lists the namespace's ($1) workflow types with unfinished runs
// (with an available_at), in order: a skip scan of the two partial indexes, one probe
// of each per type.
const unfinishedTypesSQL = `
	WITH RECURSIVE active(workflow_type) AS (
		SELECT least(
			(SELECT r.workflow_type FROM kagzi.runs r WHERE r.namespace = $1 AND ` + inRunsClaimableSQL + `
			 ORDER BY r.workflow_type LIMIT 1),
			(SELECT r.workflow_type FROM kagzi.runs r WHERE r.namespace = $1 AND ` + inRunsKeyDueSQL + `
			 ORDER BY r.workflow_type LIMIT 1))
		UNION ALL
		SELECT least(
			(SELECT r.workflow_type FROM kagzi.runs r WHERE r.namespace = $1 AND ` + inRunsClaimableSQL + `
			   AND r.workflow_type > a.workflow_type ORDER BY r.workflow_type LIMIT 1),
			(SELECT r.workflow_type FROM kagzi.runs r WHERE r.namespace = $1 AND ` + inRunsKeyDueSQL + `
			   AND r.workflow_type > a.workflow_type ORDER BY r.workflow_type LIMIT 1))
		FROM active a WHERE a.workflow_type IS NOT NULL
	)
	SELECT workflow_type FROM active WHERE workflow_type IS NOT NULL`

// consoleTypesSQL is ConsoleTypes' statement.
const consoleTypesSQL = `
	WITH known AS (
		(SELECT workflow_type FROM (` + unfinishedTypesSQL + `) a LIMIT $2)
		UNION
		(SELECT unnest(workflow_types) FROM kagzi.workers WHERE namespace = $1 LIMIT $2)
		UNION
		(SELECT workflow_type FROM kagzi.schedules WHERE namespace = $1 LIMIT $2)
	)
	SELECT workflow_type FROM known ORDER BY 1 LIMIT $2`

// ConsoleTypes lists the namespace's workflow types the console knows of: those with
// unfinished runs (a skip scan of runs_claimable and runs_key_due: a probe of each per
// type), those live or recent workers registered, and those of schedules, at most
// limit of them.
func ConsoleTypes(ctx context.Context, db DBTX, namespace string, limit int) ([]string, error) {
	rows, err := db.Query(ctx, consoleTypesSQL, namespace, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// TypeActivity is the state of one workflow type's unfinished runs, from the first
// Scanned of them in available_at order.
type TypeActivity struct {
	WorkflowType string
	// Ready counts runs claimable now: PENDING or SLEEPING runs whose time came, and
	// RUNNING runs whose lease passed (LeaseExpired counts those).
	Ready        int64
	LeaseExpired int64
	// Delayed counts PENDING runs whose time has not come (a delayed start, a backoff).
	Delayed  int64
	Running  int64
	Sleeping int64
	// TakenOver counts runs taken over at least once.
	TakenOver int64
	// Scanned is how many runs were read; when it equals the cap, the counts of
	// runs not claimable now are lower bounds (Ready and LeaseExpired too, when every
	// scanned run was ready).
	Scanned int64
	// OldestReady is when the run claimable longest became claimable (nil: none):
	// its available_at, or its creation when that is later. A start with a priority
	// p (and no start time) sets available_at p seconds before the start, to order
	// the run among its type's, and a start time already past is before it too;
	// neither run could be claimed before it existed. (A run's later available_at, a
	// wake time, a backoff, a lease's end, is after its creation.)
	OldestReady *time.Time
}

// activityByTypeSQL is ActivityByType's statement.
var activityByTypeSQL = `
		SELECT t.workflow_type,
			count(*) FILTER (WHERE a.available_at <= ` + readNowSQL + `),
			count(*) FILTER (WHERE a.status = 'RUNNING' AND a.available_at <= ` + readNowSQL + `),
			count(*) FILTER (WHERE a.status = 'PENDING' AND a.available_at > ` + readNowSQL + `),
			count(*) FILTER (WHERE a.status = 'RUNNING' AND a.available_at > ` + readNowSQL + `),
			count(*) FILTER (WHERE a.status = 'SLEEPING' AND a.available_at > ` + readNowSQL + `),
			count(*) FILTER (WHERE a.takeovers > 0),
			count(a.run_id),
			min(greatest(a.available_at, a.created_at)) FILTER (WHERE a.available_at <= ` + readNowSQL + `)
		FROM unnest($2::text[]) AS t(workflow_type)
		LEFT JOIN LATERAL (` + activeRunsOfType + `) a ON true
		GROUP BY t.workflow_type ORDER BY t.workflow_type`

// ActivityByType reads the state of the unfinished runs of each type, reading at
// most perType runs of each (activeRunsOfType).
func ActivityByType(ctx context.Context, db DBTX, namespace string, types []string, perType int) ([]TypeActivity, error) {
	rows, err := db.Query(ctx, activityByTypeSQL, namespace, types, perType)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (TypeActivity, error) {
		var a TypeActivity
		err := row.Scan(&a.WorkflowType, &a.Ready, &a.LeaseExpired, &a.Delayed, &a.Running, &a.Sleeping,
			&a.TakenOver, &a.Scanned, &a.OldestReady)
		return a, err
	})
}

// StuckRun is a run the console flags: RUNNING past its lease, or taken over.
type StuckRun struct {
	RunID        uuid.UUID
	WorkflowID   string
	WorkflowType string
	Status       vocab.RunStatus
	AvailableAt  time.Time
	LockedBy     *string
	LeaseEpoch   int64
	Takeovers    int
}

// stuckRunsSQL is StuckRuns' statement.
var stuckRunsSQL = `
		SELECT a.run_id, a.workflow_id, a.workflow_type, a.status, a.available_at, a.locked_by, a.lease_epoch, a.takeovers
		FROM unnest($2::text[]) AS t(workflow_type)
		CROSS JOIN LATERAL (` + activeRunsOfType + `) a
		WHERE (a.status = 'RUNNING' AND a.available_at <= ` + readNowSQL + `) OR a.takeovers > 0
		ORDER BY a.available_at
		LIMIT $4`

// StuckRuns lists up to limit runs RUNNING past their lease or taken over at least
// once, among the first perType unfinished runs of each type (activeRunsOfType).
func StuckRuns(ctx context.Context, db DBTX, namespace string, types []string, perType, limit int) ([]StuckRun, error) {
	rows, err := db.Query(ctx, stuckRunsSQL, namespace, types, perType, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (StuckRun, error) {
		var s StuckRun
		err := row.Scan(&s.RunID, &s.WorkflowID, &s.WorkflowType, &s.Status, &s.AvailableAt, &s.LockedBy,
			&s.LeaseEpoch, &s.Takeovers)
		return s, err
	})
}

// MinuteCount is how many runs of a type reached a status in one minute. Started
// runs have the status "STARTED" and no type.
type MinuteCount struct {
	WorkflowType string
	Status       string
	Minute       time.Time
	Count        int64
}

// Throughput counts the runs started (runs_created) and finished (runs_finished)
// since the time, by minute, reading at most limit of each, newest first. When a
// kind reached the limit, its counts cover only its newest runs: the caller says so.
func Throughput(ctx context.Context, db DBTX, namespace string, since time.Time, limit int) ([]MinuteCount, error) {
	rows, err := db.Query(ctx, `
		SELECT '', 'STARTED', date_trunc('minute', s.created_at), count(*)
		FROM (SELECT created_at FROM kagzi.runs_created_all WHERE namespace = $1 AND created_at >= $2
			ORDER BY created_at DESC LIMIT $3) s
		GROUP BY 3
		UNION ALL
		SELECT f.workflow_type, f.status, date_trunc('minute', f.finished_at), count(*)
		FROM (SELECT workflow_type, status, finished_at FROM kagzi.runs_all
			WHERE namespace = $1 AND status IN ('COMPLETED', 'FAILED', 'CANCELLED') AND finished_at >= $2
			ORDER BY finished_at DESC LIMIT $3) f
		GROUP BY 1, 2, 3`, namespace, since, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (MinuteCount, error) {
		var m MinuteCount
		err := row.Scan(&m.WorkflowType, &m.Status, &m.Minute, &m.Count)
		return m, err
	})
}

// RunLease is what the console shows of a run besides RunInfo: its lease epoch and
// deadline.
type RunLease struct {
	LeaseEpoch int64
	Deadline   *time.Time
}

// GetRunLease reads a run's lease epoch and deadline.
func GetRunLease(ctx context.Context, db DBTX, namespace string, runID uuid.UUID) (RunLease, error) {
	var l RunLease
	err := db.QueryRow(ctx, `SELECT lease_epoch, deadline_at FROM kagzi.runs_all WHERE namespace = $1 AND run_id = $2`,
		namespace, runID).Scan(&l.LeaseEpoch, &l.Deadline)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, ErrNotFound
	}
	return l, err
}
