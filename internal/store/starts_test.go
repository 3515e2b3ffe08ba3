package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi/internal/testdb"
)

// racingPool is the pool, except that its first lose runs of the start statement
// come back empty, as they do when concurrent starts and ends of the workflow id
// commit between the statement's conflict and its look (a hot id, started and
// ended back to back by many callers).
type racingPool struct {
	*pgxpool.Pool
	lose  int
	tries int
}

func (p *racingPool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if sql == insertRuns[notEager][0].sql {
		p.tries++
		if p.tries <= p.lose {
			return firstRow{err: pgx.ErrNoRows}
		}
	}
	return p.Pool.QueryRow(ctx, sql, args...)
}

func TestAStartThatLosesManyRacesForItsWorkflowIDInARowStillStartsOrFindsTheRun(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	db := &racingPool{Pool: pool, lose: 12}
	n := NewRun{RunID: uuid.Must(uuid.NewV7()), Namespace: "default", WorkflowID: "hot", WorkflowType: "wf",
		Input: []byte(`1`)}
	run, inserted, err := InsertRun(ctx, db, n)
	if err != nil {
		t.Fatalf("a start that lost 12 races in a row: %v (want the run)", err)
	}
	if !inserted || run.RunID != n.RunID || db.tries != 13 {
		t.Fatalf("inserted %v, run %v (want %v), %d tries (want 13)", inserted, run.RunID, n.RunID, db.tries)
	}
}

func TestAStartThatKeepsLosingRacesForItsWorkflowIDEndsWithItsContext(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	db := &racingPool{Pool: pool, lose: 1 << 30}
	n := NewRun{RunID: uuid.Must(uuid.NewV7()), Namespace: "default", WorkflowID: "hot", WorkflowType: "wf",
		Input: []byte(`1`)}
	_, _, err := InsertRun(ctx, db, n)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the context's deadline", err)
	}
	var count int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM kagzi.runs`).Scan(&count); err != nil || count != 0 {
		t.Fatalf("runs: %d, %v (want none)", count, err)
	}
}
