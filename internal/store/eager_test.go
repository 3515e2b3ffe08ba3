package store

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/kagzi/kagzi/internal/testdb"
)

// An eager start of a keyed run, or of a type known to be limited, claims its run
// only when the type has no rate limit, its concurrency limit and its key's have room
// (a run so claimed holds a slot of the type's), and no run of its key is queued
// before it; otherwise it inserts the run PENDING, for a claim.
func TestAnEagerStartThatCountsHoldersClaimsItsRunOnlyWithinTheLimits(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, key_concurrency) VALUES ('default', 'keyed', 2);
		INSERT INTO kagzi.flow_limits (namespace, workflow_type, concurrency) VALUES ('default', 'type-limited', 2);
		INSERT INTO kagzi.flow_limits (namespace, workflow_type, concurrency) VALUES ('default', 'queued-limited', 2);
		INSERT INTO kagzi.flow_limits (namespace, workflow_type, rate, rate_period_ms) VALUES ('default', 'rated', 100, 1000)`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx) // one connection, for its prepared statements' plan counts
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	v := "v1"
	// eager: 0 not eager, 1 eager (the type not known to be limited), 2 eager and
	// known to be limited.
	priority := 0
	start := func(typ, key string, eager int) string {
		t.Helper()
		n := NewRun{RunID: uuid.Must(uuid.NewV7()), Namespace: "default", WorkflowType: typ, Input: []byte(`1`), Version: &v,
			FlowKey: key, Priority: priority}
		n.WorkflowID = n.RunID.String()
		if eager > 0 {
			n.Eager = &Eager{WorkerID: "w", Lease: time.Minute, Version: v, Limited: eager == 2}
		}
		run, st, err := InsertRunChecked(ctx, conn, n)
		if err != nil || !st.Inserted {
			t.Fatalf("start of %s/%s: inserted %v, %v", typ, key, st.Inserted, err)
		}
		var holds bool
		if err := conn.QueryRow(ctx, `SELECT holds_type_slot FROM kagzi.runs WHERE run_id = $1`, run.RunID).Scan(&holds); err != nil {
			t.Fatal(err)
		}
		if holds != st.HoldsSlot {
			t.Fatalf("start of %s/%s: the run holds a type slot: %v, the start says %v", typ, key, holds, st.HoldsSlot)
		}
		status := string(run.Status)
		if holds {
			status += ", holding a slot"
		}
		return status
	}
	for _, c := range []struct {
		what, typ, key string
		eager          int
		want           string
		priority       int
	}{
		{"the key's first run", "keyed", "a", 1, "RUNNING", 0},
		{"a second run, one holder of two places", "keyed", "a", 1, "RUNNING", 0},
		{"a third run: the key is full", "keyed", "a", 1, "PENDING", 0},
		{"another key", "keyed", "b", 1, "RUNNING", 0},
		{"a run not started eagerly", "keyed", "b", 0, "PENDING", 0},
		{"a run behind the key's queued run, with room", "keyed", "b", 1, "PENDING", 0},
		{"a type with no limits", "free", "a", 1, "RUNNING", 0},
		{"a type with no limits, said to be limited", "free", "", 2, "RUNNING", 0},
		{"a limited type known to be, with room", "type-limited", "", 2, "RUNNING, holding a slot", 0},
		{"a keyed run of a limited type, with room", "type-limited", "a", 1, "RUNNING, holding a slot", 0},
		{"a limited type whose slots are full", "type-limited", "", 2, "PENDING", 0},
		{"a keyed run of a limited type whose slots are full", "type-limited", "b", 1, "PENDING", 0},
		{"a limited type not known to be", "type-limited", "", 1, "PENDING", 0},
		{"a type with a rate limit", "rated", "", 2, "PENDING", 0},
		// Runs queued for a claim come first: an eager start does not jump them.
		{"a run not started eagerly, queued", "queued", "", 0, "PENDING", 0},
		{"a type with no limits, behind a queued run", "queued", "", 1, "PENDING", 0},
		{"the same, of a priority above the queued runs'", "queued", "", 1, "RUNNING", 60},
		{"a run of a limited type, queued", "queued-limited", "", 0, "PENDING", 0},
		{"a limited type with room, behind a queued run", "queued-limited", "", 2, "PENDING", 0},
		{"the same, of a priority above the queued runs'", "queued-limited", "", 2, "RUNNING, holding a slot", 60},
	} {
		priority = c.priority
		if got := start(c.typ, c.key, c.eager); got != c.want {
			t.Errorf("%s: %s, want %s", c.what, got, c.want)
		}
	}
	priority = 0
	for range 8 {
		start("free", "c", 1)
	}
	var generic, custom int64
	if err := conn.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`,
		insertRuns[eagerLocked][0].sql).Scan(&generic, &custom); err != nil {
		t.Fatal(err)
	}
	if custom > 0 {
		t.Errorf("the eager keyed start was planned anew %d times (generic plans %d), want its generic plan every time", custom, generic)
	}
}

// An eager start whose key another start (or a claim) holds waits for its commit,
// then counts the holders it left: counted in a snapshot taken before the lock, the
// other's run would not be seen, and the start would claim past the key's limit.
func TestAnEagerStartWaitsForAnotherOfItsKeyAndCountsWhatItCommitted(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, key_concurrency)
		VALUES ('default', 'keyed', 1)`); err != nil {
		t.Fatal(err)
	}
	v := "v1"
	newRun := func(eager bool) NewRun {
		n := NewRun{RunID: uuid.Must(uuid.NewV7()), Namespace: "default", WorkflowType: "keyed", Input: []byte(`1`),
			Version: &v, FlowKey: "k"}
		n.WorkflowID = n.RunID.String()
		if eager {
			n.Eager = &Eager{WorkerID: "w", Lease: time.Minute, Version: v}
		}
		return n
	}
	// Another eager start of the key under way (or a claim): its transaction holds
	// the key's lock and has made a run the key's holder, not yet committed.
	other, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	if run, _, err := InsertRunChecked(ctx, other, newRun(true)); err != nil || run.Status != "RUNNING" {
		t.Fatalf("the other start: %s, %v; want RUNNING", run.Status, err)
	}
	type result struct {
		status string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		run, _, err := InsertRunChecked(ctx, pool, newRun(true))
		done <- result{string(run.Status), err}
	}()
	// The start waits for the key's lock (the claim's transaction holds it).
	eventuallyStore(t, "the start to wait for the key's lock", func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)`).Scan(&waiting)
		return err == nil && waiting
	})
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.status != "PENDING" {
		t.Fatalf("the start after the other committed: %s, %v; want PENDING (the other's run holds the key's one place)", r.status, r.err)
	}
}

// eventuallyStore waits up to 30 s for cond.
func eventuallyStore(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// The eager start's look for runs queued before it is one ordered probe of
// runs_claimable, made once a start, in its generic and custom plans: an EXISTS with a range
// condition was planned as a sequential scan of runs (six of them, one a reference of
// its CTE) that read the whole table when nothing was due: 140-260 ms a start at
// 100,000 active runs.
func TestAnEagerStartLooksForRunsQueuedBeforeItWithOneIndexProbe(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	// 30,000 runs of the type RUNNING under leases that end in a minute (none due),
	// and a backlog of another type: the statistics do not tie type and time.
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input,
			available_at, locked_by, lease_epoch, started_at)
		SELECT gen_random_uuid(), 'default', 'r-' || i, 'wf', 'RUNNING', '{}', now() + interval '1 minute', 'w', 1, now()
		FROM generate_series(1, 30000) i;
		INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input, available_at)
		SELECT gen_random_uuid(), 'default', 'o-' || i, 'other', 'PENDING', '{}', now() - interval '1 hour'
		FROM generate_series(1, 30000) i;
		ANALYZE kagzi.runs`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	v := "v1"
	for _, mode := range []eagerMode{eagerPlain, eagerLocked} {
		n := NewRun{RunID: uuid.Must(uuid.NewV7()), Namespace: "default", WorkflowID: "new", WorkflowType: "wf",
			Input: []byte(`1`), Version: &v, Eager: &Eager{WorkerID: "w", Lease: time.Minute, Version: v}}
		stmt := insertRuns[mode][0]
		for _, planMode := range []string{"force_generic_plan", "force_custom_plan"} {
			p := explainPlan(t, conn.Conn(), "SELECT 1", planMode, stmt.sql, stmt.args(&n)...)
			if strings.Contains(p, "Seq Scan on runs") || strings.Count(p, "runs_claimable") != 1 {
				t.Errorf("mode %d, %s: want one probe of runs_claimable and no sequential scan of runs:\n%s",
					mode, planMode, p)
			}
		}
	}
}

// Runs of another version, which the worker would not claim, do not hold an eager start
// back (a run stranded on a retired version turned eager starts off for its type).
func TestRunsOfAnotherVersionDoNotHoldAnEagerStartBack(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	old, v := "v0", "v1"
	for i := range 5 {
		n := NewRun{RunID: uuid.Must(uuid.NewV7()), Namespace: "default", WorkflowID: fmt.Sprint("old-", i),
			WorkflowType: "wf", Input: []byte(`1`), Version: &old}
		if _, _, err := InsertRun(ctx, pool, n); err != nil {
			t.Fatal(err)
		}
	}
	for _, mode := range []bool{false, true} { // plain, then locked (a type noted as limited)
		n := NewRun{RunID: uuid.Must(uuid.NewV7()), Namespace: "default", WorkflowID: fmt.Sprint("new-", mode),
			WorkflowType: "wf", Input: []byte(`1`), Version: &v,
			Eager: &Eager{WorkerID: "w", Lease: time.Minute, Version: v, Limited: mode}}
		run, st, err := InsertRunChecked(ctx, pool, n)
		if err != nil || run.Status != "RUNNING" || st.BehindQueue {
			t.Fatalf("eager start (locked %v) beside queued runs of another version: %s, behind %v, %v; want RUNNING",
				mode, run.Status, st.BehindQueue, err)
		}
	}
}
