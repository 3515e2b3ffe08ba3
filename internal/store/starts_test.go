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

// Found from outside: a worker frozen past its parent run's lease went on to insert the
// child it was starting after another worker had ended the parent CANCELLED, and the
// child, started after the cancel went down the tree, ran on. A child's insert is
// fenced by its parent's lease.
func TestAChildIsStartedOnlyUnderItsParentsLease(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	parent := runningRun(t, pool, 2, false) // taken over: epoch 2
	child := func(epoch int64) (bool, error) {
		n := NewRun{RunID: uuid.Must(uuid.NewV7()), Namespace: "default", WorkflowID: uuid.NewString(),
			WorkflowType: "child", Input: []byte(`1`), ParentRunID: &parent, ParentStepKey: "c#1",
			ParentFence: &Fence{RunID: parent, Epoch: epoch}, ReuseNever: true}
		_, inserted, err := InsertRun(ctx, pool, n)
		return inserted, err
	}
	if inserted, err := child(1); !errors.Is(err, ErrLeaseLost) || inserted {
		t.Fatalf("a child started under the parent's lost lease: inserted %v, %v; want ErrLeaseLost", inserted, err)
	}
	if inserted, err := child(2); err != nil || !inserted {
		t.Fatalf("a child started under the parent's lease: inserted %v, %v", inserted, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'CANCELLED', finished_at = now() WHERE run_id = $1`,
		parent); err != nil {
		t.Fatal(err)
	}
	if inserted, err := child(2); !errors.Is(err, ErrLeaseLost) || inserted {
		t.Fatalf("a child started after its parent ended: inserted %v, %v; want ErrLeaseLost", inserted, err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.runs WHERE parent_run_id = $1`, parent).Scan(&n); err != nil || n != 1 {
		t.Fatalf("children of the parent: %d, %v; want the one started under its lease", n, err)
	}
}
