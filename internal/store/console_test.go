package store

import (
	"context"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kagzi/kagzi/internal/testdb"
)

// The console's and Health's reads of unfinished runs go through the partial indexes
// that hold them (runs_claimable, and runs_key_due for keyed runs not started yet),
// never through a scan of the whole table: with finished runs filling it, a scan per
// type made the console's overview take seconds (found from outside: 2.4-5.4 s at
// 124,000 runs). And they count the keyed runs waiting for their key.
func TestTheConsoleAndHealthReadUnfinishedRunsThroughTheirIndexesKeyedOnesIncluded(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input, available_at, finished_at, started_at)
		SELECT gen_random_uuid(), 'default', 'done' || g, CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, 'COMPLETED', '1',
			now() - interval '1 second' * g, now() - interval '1 second' * g, now() - interval '1 second' * g
		FROM generate_series(1, 30000) g;
		INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input, available_at)
		SELECT gen_random_uuid(), 'default', 'a' || g, 'a', 'PENDING', '1', now() - interval '1 minute' FROM generate_series(1, 20000) g;
		INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input, available_at, flow_key)
		SELECT gen_random_uuid(), 'default', 'b' || g, 'b', 'PENDING', '1', now() - interval '1 minute', 'k' FROM generate_series(1, 2) g;
		INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input, available_at, started_at)
		VALUES (gen_random_uuid(), 'default', 'c1', 'c', 'SLEEPING', '1', now() + interval '1 hour', now());
		ANALYZE kagzi.runs`); err != nil {
		t.Fatal(err)
	}

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	types := []string{"a", "b", "c"}
	for name, q := range map[string]struct {
		sql  string
		args []any
	}{
		"ConsoleTypes":              {consoleTypesSQL, []any{"default", 10}},
		"ActivityByType":            {activityByTypeSQL, []any{"default", types, 5000}},
		"StuckRuns":                 {stuckRunsSQL, []any{"default", types, 5000, 10}},
		"QueueStats":                {queueStatsSQL, []any{"default"}},
		"PendingTypesWithoutWorker": {pendingTypesWithoutWorkerSQL, []any{"default"}},
	} {
		for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
			if plan := explainPlan(t, conn.Conn(), "SELECT 1", mode, q.sql, q.args...); strings.Contains(plan, "Seq Scan on runs") {
				t.Errorf("%s (%s) reads the whole runs table:\n%s", name, mode, plan)
			}
		}
	}

	if got, err := ConsoleTypes(ctx, pool, "default", 10); err != nil || !slices.Equal(got, types) {
		t.Errorf("ConsoleTypes: %v (%v), want %v", got, err, types)
	}
	acts, err := ActivityByType(ctx, pool, "default", types, 5000)
	if err != nil || len(acts) != 3 {
		t.Fatalf("ActivityByType: %v (%v)", acts, err)
	}
	for i, want := range [][2]int64{{5000, 0}, {2, 0}, {0, 1}} { // ready (of the 5,000 read), sleeping
		if acts[i].Ready != want[0] || acts[i].Sleeping != want[1] {
			t.Errorf("ActivityByType of %s: %d ready, %d sleeping, want %d and %d", acts[i].WorkflowType,
				acts[i].Ready, acts[i].Sleeping, want[0], want[1])
		}
	}
	stats, err := QueueStats(ctx, pool, "default")
	if err != nil || len(stats) != 3 || stats[0].Ready != 20000 || stats[1].Ready != 2 || stats[2].Waiting != 1 {
		t.Errorf("QueueStats: %+v (%v), want a: 20,000 ready, b: 2 ready, c: 1 waiting", stats, err)
	}
	if got, err := PendingTypesWithoutWorker(ctx, pool, "default"); err != nil || !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("PendingTypesWithoutWorker: %v (%v), want [a b]", got, err)
	}
}

// QueueStats backs every metrics scrape: its plan must stay cheap, also with limited
// types (the count of runs their limits hold back). Joined laterally to the grouped
// stats, that count was charged the whole table once per estimated group, the estimate
// passed jit_above_cost, and JIT compiled ~150 functions a scrape (2.3 s at 1,000 keys x
// 20 runs against 25 ms before).
func TestQueueStatsOfLimitedTypesIsPlannedBelowTheJITThreshold(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		INSERT INTO kagzi.flow_limits (namespace, workflow_type, concurrency, key_concurrency) VALUES ('default', 'k', 500, 1),
			('default', 't', 10, NULL);
		INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input, available_at, flow_key)
		SELECT gen_random_uuid(), 'default', 'q' || g, 'k', 'PENDING', '1', now() - interval '1 minute', 'key' || (g % 1000)
		FROM generate_series(1, 20000) g;
		INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input, available_at, flow_key,
			started_at, locked_by, lease_epoch, holds_type_slot)
		SELECT gen_random_uuid(), 'default', 'h' || g, 'k', 'RUNNING', '1', now() + interval '1 minute', 'key' || g,
			now(), 'w', 1, true
		FROM generate_series(0, 999) g;
		INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input, available_at)
		SELECT gen_random_uuid(), 'default', 't' || g, 't', 'PENDING', '1', now() - interval '1 minute'
		FROM generate_series(1, 20000) g;
		ANALYZE kagzi.runs`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var jitAbove float64
	if err := conn.QueryRow(ctx, `SELECT current_setting('jit_above_cost')::float8`).Scan(&jitAbove); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
		plan := explainPlan(t, conn.Conn(), "SELECT 1", mode, queueStatsSQL, "default")
		var total float64
		if m := regexp.MustCompile(`cost=[0-9.]+\.\.([0-9.]+)`).FindStringSubmatch(plan); m == nil {
			t.Fatalf("no cost in the plan:\n%s", plan)
		} else if total, err = strconv.ParseFloat(m[1], 64); err != nil {
			t.Fatal(err)
		}
		if total >= jitAbove {
			t.Errorf("QueueStats (%s) is estimated at %.0f, past jit_above_cost %.0f:\n%s", mode, total, jitAbove, plan)
		}
	}
	stats, err := QueueStats(ctx, pool, "default")
	if err != nil || len(stats) != 2 {
		t.Fatalf("QueueStats: %+v, %v", stats, err)
	}
	// k: 1,000 keys each held, 20,000 queued: all held. t: 10 slots, none held: 10 ready.
	if k, tt := stats[0], stats[1]; k.Ready != 0 || k.Held != 20000 || tt.Ready != 10 || tt.Held != 19990 {
		t.Errorf("QueueStats: %+v; want k 0 ready 20,000 held, t 10 ready 19,990 held", stats)
	}
}
