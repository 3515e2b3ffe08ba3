package store

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// SignalRow is one signal sent to a run.
type SignalRow struct {
	ID        int64
	Name      string
	Payload   []byte
	CreatedAt time.Time
	// ConsumedBy is the key of the WaitSignal step that received it; nil while pending.
	ConsumedBy *string
}

// EventRow is one event a run published.
type EventRow struct {
	Key       string
	Value     []byte
	UpdatedAt time.Time
}

// ListSignals reads up to limit signals of a run of the namespace in the order they
// were sent, from the one after afterID on (index signals_by_run). It returns
// ErrNotFound when the run is not in the namespace.
func ListSignals(ctx context.Context, db DBTX, namespace string, runID uuid.UUID, afterID int64, limit int) ([]SignalRow, error) {
	if err := runExists(ctx, db, namespace, runID); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `
		SELECT id, name, payload, created_at, consumed_by FROM kagzi.signals_all
		WHERE run_id = $1 AND id > $2 ORDER BY id LIMIT $3`, runID, afterID, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (SignalRow, error) {
		var s SignalRow
		err := row.Scan(&s.ID, &s.Name, &s.Payload, &s.CreatedAt, &s.ConsumedBy)
		return s, err
	})
}

// ListEvents reads up to limit events of a run of the namespace by key, from the
// key after afterKey on. It returns ErrNotFound when the run is not in the namespace.
func ListEvents(ctx context.Context, db DBTX, namespace string, runID uuid.UUID, afterKey string, limit int) ([]EventRow, error) {
	if err := runExists(ctx, db, namespace, runID); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `
		SELECT key, value, updated_at FROM kagzi.events_all
		WHERE run_id = $1 AND key > $2 ORDER BY key LIMIT $3`, runID, afterKey, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (EventRow, error) {
		var e EventRow
		err := row.Scan(&e.Key, &e.Value, &e.UpdatedAt)
		return e, err
	})
}

func runExists(ctx context.Context, db DBTX, namespace string, runID uuid.UUID) error {
	var ok bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM kagzi.runs_all WHERE namespace = $1 AND run_id = $2)`,
		namespace, runID).Scan(&ok)
	if err == nil && !ok {
		return ErrNotFound
	}
	return err
}
