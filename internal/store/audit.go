package store

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// AuditEntry is one action taken through the console (kagzi.console_audit).
type AuditEntry struct {
	ID        int64
	Namespace string
	At        time.Time
	Who       string
	Action    string
	Target    string
	RunIDs    []uuid.UUID
	RunCount  int64
	// Detail is a JSON object: the action's parameters and result.
	Detail []byte
	// Outcome is nil while the action runs, then "ok" or the error.
	Outcome    *string
	FinishedAt *time.Time
}

const auditColumns = `id, namespace, at, who, action, target, run_ids, run_count, detail, outcome, finished_at`

func scanAudit(row pgx.CollectableRow) (AuditEntry, error) {
	var a AuditEntry
	err := row.Scan(&a.ID, &a.Namespace, &a.At, &a.Who, &a.Action, &a.Target, &a.RunIDs, &a.RunCount, &a.Detail,
		&a.Outcome, &a.FinishedAt)
	return a, err
}

// BeginAudit records an action about to run and returns its id.
func BeginAudit(ctx context.Context, db DBTX, a AuditEntry) (int64, error) {
	if a.RunIDs == nil {
		a.RunIDs = []uuid.UUID{}
	}
	if a.Detail == nil {
		a.Detail = []byte("{}")
	}
	var id int64
	err := db.QueryRow(ctx, `
		INSERT INTO kagzi.console_audit (namespace, who, action, target, run_ids, run_count, detail)
		VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id`,
		a.Namespace, a.Who, a.Action, a.Target, a.RunIDs, a.RunCount, a.Detail).Scan(&id)
	return id, err
}

// EndAudit completes an action's record with its outcome, the runs it acted on (nil:
// as recorded) and a detail object merged into the recorded one.
func EndAudit(ctx context.Context, db DBTX, id int64, outcome string, runIDs []uuid.UUID, runCount int64, detail []byte) error {
	if detail == nil {
		detail = []byte("{}")
	}
	_, err := db.Exec(ctx, `
		UPDATE kagzi.console_audit SET outcome = $2, finished_at = now(),
			run_ids = coalesce($3, run_ids), run_count = greatest(run_count, $4), detail = detail || $5
		WHERE id = $1`, id, outcome, runIDs, runCount, detail)
	return err
}

// ListAudit lists up to limit actions of the namespace, newest first, older than the
// id beforeID (0: from the newest); with runID set, only those on that run.
func ListAudit(ctx context.Context, db DBTX, namespace string, runID *uuid.UUID, beforeID int64, limit int) ([]AuditEntry, error) {
	sql := `SELECT ` + auditColumns + ` FROM kagzi.console_audit
		WHERE namespace = $1 AND ($2::bigint = 0 OR id < $2::bigint)`
	args := []any{namespace, beforeID, limit}
	if runID != nil {
		sql += ` AND run_ids @> ARRAY[$4::uuid]`
		args = append(args, *runID)
	}
	rows, err := db.Query(ctx, sql+` ORDER BY id DESC LIMIT $3`, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanAudit)
}
