package store

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi/internal/committer"
	"github.com/kagzi/kagzi/internal/testdb"
)

// explainPlan returns the plan Postgres uses for sql with args under the given
// transaction-local settings and plan cache mode, as a prepared statement would run.
func explainPlan(t *testing.T, conn *pgx.Conn, settings, mode, sql string, args ...any) string {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		tx.Rollback(ctx)
		conn.Exec(ctx, "DEALLOCATE planned") // PREPARE outlives its transaction
	}()
	if _, err := tx.Exec(ctx, settings); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT set_config('plan_cache_mode', $1, true)", mode); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "PREPARE planned AS "+sql); err != nil {
		t.Fatal(err)
	}
	// EXECUTE takes no parameters of its own: its arguments go in as literals.
	var types []string
	if err := tx.QueryRow(ctx, `SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = 'planned'`).
		Scan(&types); err != nil {
		t.Fatal(err)
	}
	literals := make([]string, len(args))
	for i, arg := range args {
		var lit string
		if err := tx.QueryRow(ctx, fmt.Sprintf("SELECT quote_nullable(($1::%s)::text)", types[i]), arg).Scan(&lit); err != nil {
			t.Fatal(err)
		}
		literals[i] = lit + "::" + types[i]
	}
	rows, err := tx.Query(ctx, "EXPLAIN EXECUTE planned("+strings.Join(literals, ", ")+")")
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

func TestSetBasedStatementsReachRunsByKeyWhateverTheTablesStatistics(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	// 1,000 running runs with a step each, never analyzed: the planner knows the
	// table's size but nothing of its columns, as in a new installation's first minute.
	if _, err := pool.Exec(ctx, `
		INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input, available_at, lease_epoch)
		SELECT gen_random_uuid(), 'default', 'w' || g, 'wf', 'RUNNING', '1', now(), 1 FROM generate_series(1, 1000) g;
		INSERT INTO kagzi.steps (run_id, step_key, name, kind, status)
		SELECT run_id, 's#1', 's', 'STEP', 'COMPLETED' FROM kagzi.runs`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()

	// 200 requests of each set-based statement, as a busy worker's committer sends them.
	const n = 200
	now := time.Now()
	key, name, client := "s#2", "s", [16]byte(uuid.New())
	var records, ends, suspensions, sleeps []any
	for i := range n {
		f := Fence{RunID: uuid.New(), Epoch: 1}
		records = append(records, &StepWrite{Fence: f, Key: "s#2", Name: "s", Status: "COMPLETED", StepStatus: "COMPLETED",
			Output: []byte(`1`), StartedAt: now, FinishedAt: now, Position: i})
		ends = append(ends, &FinishWrite{Fence: f, Client: client, Status: "COMPLETED", Output: []byte(`1`),
			Last: &StepWrite{Key: key, Name: name, Output: []byte(`1`), StartedAt: now, FinishedAt: now, Position: i}})
		suspensions = append(suspensions, &SleepWrite{Fence: f, Key: "nap#1", Name: "nap", WakeAt: &now, Duration: time.Second, Position: i})
		sleeps = append(sleeps, &SleepWrite{Fence: f, Key: "nap#1", Name: "nap", Duration: time.Second, Position: i})
	}
	type statement struct {
		name     string
		settings string
		sql      string
		args     []any
		table    string // the table read by key: runs unless said
	}
	var statements []statement
	for _, w := range []struct {
		stmt   *committer.Statement
		inputs []any
	}{{&recordSteps.stmt, records}, {&finishes.stmt, ends}, {&suspends.stmt, suspensions}, {&recordSleeps.stmt, sleeps}} {
		// Merged, as a busy committer sends them (after KeyedPlansSQL), and alone, as a
		// lone write goes out (without it).
		sql, args := w.stmt.Build(w.inputs)
		statements = append(statements, statement{name: "merged " + w.stmt.Name, settings: KeyedPlansSQL, sql: sql, args: args})
		sql, args = w.stmt.Build(w.inputs[:1])
		statements = append(statements, statement{name: "lone " + w.stmt.Name, settings: "SELECT 1", sql: sql, args: args})
	}
	fences := make([]Fence, n)
	for i, r := range ends {
		fences[i] = Fence{RunID: r.(*FinishWrite).RunID, Epoch: 1, Token: uuid.New()}
	}
	ids, epochs, tokens := fenceArrays(fences)
	statements = append(statements,
		statement{name: "heartbeat", settings: KeyedPlansSQL, sql: heartbeatSQL,
			args: []any{ids, epochs, "default", "w", n, int64(0), int64(0), int64(10000), tokens}},
		statement{name: "hand-back", settings: KeyedPlansSQL, sql: releaseRunsSQL, args: []any{ids, epochs, tokens}},
		statement{name: "claimed runs' steps", settings: KeyedPlansSQL, sql: claimedStepsSQL, args: []any{ids}, table: "steps"})
	// The claims' update (claimUpdateSQL) reaches the runs it claims by key: the runs
	// the claim picked (their RUNNING leases expired: claimable) may be any of them.
	claimArgs := []any{"default", []string{"wf"}, []string{""}, []string{""}, "w", int64(10000), n, []uuid.UUID{},
		[]*time.Time{nil}, []bool{false}, []*time.Time{nil}, []bool{false}}
	statements = append(statements,
		statement{name: "claim", settings: KeyedPlansSQL, sql: claimSQL, args: append(claimArgs[:len(claimArgs):len(claimArgs)], n)},
		statement{name: "claim of limited types", settings: KeyedPlansSQL, sql: claimLimitedSQL,
			args: append(claimArgs[:len(claimArgs):len(claimArgs)], []string{"wf"})})

	for _, analyzed := range []bool{false, true} {
		if analyzed {
			if _, err := pool.Exec(ctx, "ANALYZE kagzi.runs, kagzi.steps"); err != nil {
				t.Fatal(err)
			}
		}
		for _, st := range statements {
			for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
				plan := explainPlan(t, conn.Conn(), st.settings, mode, st.sql, st.args...)
				table := st.table
				if table == "" {
					table = "runs"
				}
				for _, bad := range []string{"Seq Scan on runs", "Bitmap Heap Scan on runs", "runs_one_active_per_workflow_id",
					"Seq Scan on steps", "Bitmap Heap Scan on steps"} {
					if strings.Contains(plan, bad) {
						t.Errorf("%s (analyzed: %v, %s) has %q:\n%s", st.name, analyzed, mode, bad, plan)
					}
				}
				if !strings.Contains(plan, table+"_pkey") {
					t.Errorf("%s (analyzed: %v, %s) does not read %s by key:\n%s", st.name, analyzed, mode, table, plan)
				}
			}
		}
	}
}

// A start is one statement whose plan Postgres must not make anew each time: planning
// it (1.8 ms) once cost more than the start itself, when a CTE whose value depended
// on the parameters made every custom plan look cheaper than the generic one.
func TestAStartUsesItsGenericPlanEagerOrNot(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	v := "v1"
	for _, eager := range []bool{false, true} {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for range 12 {
			n := NewRun{RunID: uuid.Must(uuid.NewV7()), Namespace: "default", WorkflowType: "wf", Input: []byte(`1`), Version: &v}
			n.WorkflowID = n.RunID.String()
			if eager {
				n.Eager = &Eager{WorkerID: "w", Lease: time.Minute, Version: v}
			}
			if _, _, err := InsertRun(ctx, conn, n); err != nil {
				t.Fatal(err)
			}
		}
		stmt := insertRun.sql
		if eager {
			stmt = insertRunEager.sql
		}
		var generic, custom int64
		if err := conn.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`,
			stmt).Scan(&generic, &custom); err != nil {
			t.Fatal(err)
		}
		conn.Release()
		if generic < 5 {
			t.Errorf("eager %v: the start was planned anew %d times in 12 (generic plans %d), want its generic plan after 5",
				eager, custom, generic)
		}
	}
}

// The look for dead workers runs every ReapInterval on every worker: when no worker
// died it must not read the namespace's running runs, whichever way Postgres plans it
// (a generic plan made on small statistics joined the runs first, reading every
// running run of the namespace at every look).
func TestTheLookForDeadWorkersReadsNoRunWhenNoWorkerDied(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input, available_at, lease_epoch, locked_by)
		SELECT gen_random_uuid(), 'default', 'w' || g, 'wf', 'RUNNING', '1', now() + interval '1 hour', 1, 'live'
		FROM generate_series(1, 1000) g`); err != nil {
		t.Fatal(err)
	}
	for _, analyzed := range []bool{false, true} {
		if analyzed {
			if _, err := pool.Exec(ctx, "ANALYZE kagzi.runs"); err != nil {
				t.Fatal(err)
			}
		}
		for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
			lines := explainAnalyzed(t, pool, mode, reapDeadWorkersSQL, "'default', 'me', 1")
			for _, l := range lines {
				if strings.Contains(l, " on runs r") && !strings.Contains(l, "Update on") && !strings.Contains(l, "never executed") {
					t.Errorf("analyzed %v, %s: the look read runs though no worker died:\n%s", analyzed, mode, strings.Join(lines, "\n"))
				}
			}
		}
	}
}

// explainAnalyzed runs sql (with the literal arguments args) under EXPLAIN ANALYZE with
// the plan cache mode mode, in a transaction it rolls back, and returns the plan's lines.
func explainAnalyzed(t *testing.T, pool *pgxpool.Pool, mode, sql, args string) []string {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = tx.Rollback(ctx)
		_, _ = conn.Exec(ctx, "DEALLOCATE analyzed") // PREPARE outlives its transaction
	}()
	if _, err := tx.Exec(ctx, "SELECT set_config('plan_cache_mode', $1, true)", mode); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "PREPARE analyzed AS "+sql); err != nil {
		t.Fatal(err)
	}
	rows, _ := tx.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF) EXECUTE analyzed("+args+")")
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return lines
}
