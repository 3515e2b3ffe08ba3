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

func TestAPageOfRunsIsReadInOrderFromAnIndexWithoutSortingOrScanningRuns(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ids := listingRuns(t, pool)
	version := "v1"
	later, earlier := time.Now().Add(time.Hour), time.Now().Add(-time.Hour)
	failed := []vocab.RunStatus{vocab.StatusFailed}
	for index, filters := range map[string][]ListRunsParams{
		"runs_created_pkey": {
			{},
			{WorkflowTypes: []string{"wf", "other"}},
			{Statuses: failed, ErrorCode: "card_declined"},
			{ErrorCode: "no_such_code"},
			{WorkflowIDPrefix: "0"},
			{RootOnly: true, Version: &version},
			{CreatedAfter: &earlier, CreatedBefore: &later, Statuses: failed},
		},
		// One type: its runs in order, from runs_created_by_type (which a type with few
		// runs needs: see TestAPageOfARareTypeReadsItsRunsOnly), or from the pkey when
		// the type is most runs.
		"runs_created": {
			{Statuses: []vocab.RunStatus{vocab.StatusPending}, WorkflowTypes: []string{"wf"}},
			{WorkflowTypes: []string{"wf"}, ErrorCode: "card_declined"},
		},
		"runs_by_schedule": {
			{ScheduleID: "nightly"},
			{ScheduleID: "nightly", Statuses: []vocab.RunStatus{vocab.StatusPending}},
		},
		"runs_by_parent": {
			{ParentRunID: &ids[0]},
			{ParentRunID: &ids[0], Statuses: failed, Payloads: true},
		},
	} {
		for _, f := range filters {
			for _, ascending := range []bool{false, true} {
				for _, after := range []*time.Time{nil, &later, &earlier} {
					p := f
					p.Namespace, p.Limit, p.Ascending = "default", 50, ascending
					if after != nil {
						p.AfterCreated, p.AfterRunID = after, ids[1]
					}
					plan := explainList(t, pool, p)
					if strings.Contains(plan, "Sort") || strings.Contains(plan, "Seq Scan") || !strings.Contains(plan, index) {
						t.Errorf("%+v: want %s read in order, no sort, no sequential scan:\n%s", p, index, plan)
					}
				}
			}
		}
	}
}

func TestAPageOfARareTypeReadsItsRunsOnly(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	listingRuns(t, pool)
	ctx := context.Background()
	if err := InsertRuns(ctx, pool, "default", "rare", nil, []uuid.UUID{uuid.Must(uuid.NewV7())}, [][]byte{[]byte(`1`)},
		make([][]byte, 1), time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE kagzi.runs_created`); err != nil {
		t.Fatal(err)
	}
	for _, ascending := range []bool{false, true} {
		plan := explainList(t, pool, ListRunsParams{Namespace: "default", Limit: 50, WorkflowTypes: []string{"rare"},
			Ascending: ascending})
		if !strings.Contains(plan, "runs_created_by_type") || strings.Contains(plan, "Sort") || strings.Contains(plan, "Seq Scan") {
			t.Errorf("a page of a type with one run of thousands: want runs_created_by_type in order:\n%s", plan)
		}
	}
}

func TestAPageOfAWorkflowIDsRunsReadsItsTwoIndexes(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	listingRuns(t, pool)
	for _, ascending := range []bool{false, true} {
		plan := explainList(t, pool, ListRunsParams{Namespace: "default", Limit: 50, WorkflowID: "x", Ascending: ascending})
		for _, index := range []string{"runs_one_active_per_workflow_id", "runs_finished_by_workflow_id"} {
			if !strings.Contains(plan, index) || strings.Contains(plan, "Seq Scan") {
				t.Errorf("ascending %v: want %s, no sequential scan:\n%s", ascending, index, plan)
			}
		}
	}
}

func TestAPageOfRunsSelectedByAttributesReadsTheirGINIndex(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	listingRuns(t, pool)
	for _, ascending := range []bool{false, true} {
		p := ListRunsParams{Namespace: "default", Limit: 50, Attributes: []byte(`{"customer": "c7"}`), Ascending: ascending}
		if plan := explainList(t, pool, p); !strings.Contains(plan, "runs_by_attributes") || strings.Contains(plan, "Seq Scan") {
			t.Errorf("ascending %v: want runs_by_attributes, no sequential scan:\n%s", ascending, plan)
		}
	}
}

// explainList returns the plans of ListRuns' statements for p, planned with their
// settings: the first read of a newest page, bounded to the day before (see
// ListRuns), when it has one, and the unbounded read.
func explainList(t *testing.T, pool *pgxpool.Pool, p ListRunsParams) string {
	t.Helper()
	plan := explainListRead(t, pool, p, nil)
	if bound, ok := recentBound(p); ok {
		plan = explainListRead(t, pool, p, &bound) + "\n-- unbounded:\n" + plan
	}
	return plan
}

func explainListRead(t *testing.T, pool *pgxpool.Pool, p ListRunsParams, bound *time.Time) string {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	setup, sql, args := listRunsQuery(p, bound)
	if setup != "" {
		if _, err := tx.Exec(ctx, setup); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := tx.Query(ctx, "EXPLAIN "+sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(plan, "\n")
}

// listingRuns starts 3,000 runs of type "wf" and makes some of them what listings
// select by: children of the first, runs of a schedule, failed runs (some with the
// code card_declined), runs with attributes; then analyzes the tables. It returns the
// runs' ids.
func listingRuns(t *testing.T, pool *pgxpool.Pool) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	ids := analyzedPendingRuns(t, pool, 3000)
	for _, stmt := range []string{
		`UPDATE kagzi.runs SET parent_run_id = ($1::uuid[])[1] WHERE run_id = ANY(($1::uuid[])[2:40])`,
		`UPDATE kagzi.runs SET schedule_id = 'nightly' WHERE run_id = ANY(($1::uuid[])[41:80])`,
		`UPDATE kagzi.runs SET status = 'FAILED', finished_at = now(),
			error = jsonb_build_object('code', CASE WHEN random() < 0.1 THEN 'card_declined' ELSE 'other' END)
		 WHERE run_id = ANY(($1::uuid[])[81:1500])`,
		`UPDATE kagzi.runs SET attributes = jsonb_build_object('customer', 'c' || (random() * 1000)::int)
		 WHERE run_id = ANY(($1::uuid[])[1501:2500])`,
	} {
		if _, err := pool.Exec(ctx, stmt, ids); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, "ANALYZE kagzi.runs"); err != nil {
		t.Fatal(err)
	}
	return ids
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
