package store

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kagzi/kagzi/internal/vocab"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi/internal/testdb"
)

func TestAPageOfRunsIsReadInOrderFromRunsCreatedWithoutSortingOrScanningRuns(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	ids := analyzedPendingRuns(t, pool, 2000)
	after := time.Now().Add(time.Hour)
	for _, p := range []ListRunsParams{
		{Namespace: "default", Limit: 50},
		{Namespace: "default", Limit: 50, Statuses: []vocab.RunStatus{vocab.StatusPending}, WorkflowType: "wf"},
		{Namespace: "default", Limit: 50, AfterCreated: &after, AfterRunID: ids[0]},
	} {
		sql, args := listRunsQuery(p)
		rows, err := pool.Query(ctx, "EXPLAIN "+sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Join(plan, "\n")
		if strings.Contains(text, "Sort") || strings.Contains(text, "Seq Scan") || !strings.Contains(text, "runs_created_pkey") {
			t.Fatalf("%+v: want runs_created_pkey read in order, no sort, no sequential scan:\n%s", p, text)
		}
	}
}

func TestPruningARunRemovesItFromTheListOrder(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	ids := []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())}
	if err := InsertRuns(ctx, pool, "default", "wf", nil, ids, [][]byte{[]byte(`1`), []byte(`2`)}, make([][]byte, 2),
		time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'COMPLETED', finished_at = now() - interval '2 days'
		WHERE run_id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	if n, err := PruneFinished(ctx, pool, "default", 24*time.Hour, 10); err != nil || n != 1 {
		t.Fatalf("pruned %d runs (%v), want 1", n, err)
	}
	var listed []uuid.UUID
	rows, err := pool.Query(ctx, `SELECT run_id FROM kagzi.runs_created ORDER BY created_at`)
	if err != nil {
		t.Fatal(err)
	}
	if listed, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID]); err != nil {
		t.Fatal(err)
	}
	if len(listed) != 1 || listed[0] != ids[1] {
		t.Fatalf("list order holds %v, want only the unpruned run %s", listed, ids[1])
	}
	page, err := ListRuns(ctx, pool, ListRunsParams{Namespace: "default", Limit: 10})
	if err != nil || len(page) != 1 || page[0].RunID != ids[1] {
		t.Fatalf("listed %d runs (%v), want the unpruned one", len(page), err)
	}
}

// analyzedPendingRuns starts n runs of type "wf" in the default namespace, analyzes the
// tables, and returns the runs' ids.
func analyzedPendingRuns(t *testing.T, pool *pgxpool.Pool, n int) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	ids, inputs := make([]uuid.UUID, n), make([][]byte, n)
	for i := range ids {
		ids[i], inputs[i] = uuid.Must(uuid.NewV7()), []byte(`1`)
	}
	if err := InsertRuns(ctx, pool, "default", "wf", nil, ids, inputs, make([][]byte, n), time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "ANALYZE kagzi.runs, kagzi.runs_created"); err != nil {
		t.Fatal(err)
	}
	return ids
}
