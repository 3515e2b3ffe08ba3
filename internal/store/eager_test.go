package store

import (
	"context"
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
	start := func(typ, key string, eager int) string {
		t.Helper()
		n := NewRun{RunID: uuid.Must(uuid.NewV7()), Namespace: "default", WorkflowType: typ, Input: []byte(`1`), Version: &v,
			FlowKey: key}
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
	}{
		{"the key's first run", "keyed", "a", 1, "RUNNING"},
		{"a second run, one holder of two places", "keyed", "a", 1, "RUNNING"},
		{"a third run: the key is full", "keyed", "a", 1, "PENDING"},
		{"another key", "keyed", "b", 1, "RUNNING"},
		{"a run not started eagerly", "keyed", "b", 0, "PENDING"},
		{"a run behind the key's queued run, with room", "keyed", "b", 1, "PENDING"},
		{"a type with no limits", "free", "a", 1, "RUNNING"},
		{"a type with no limits, said to be limited", "free", "", 2, "RUNNING"},
		{"a limited type not known to be", "type-limited", "", 1, "PENDING"},
		{"a limited type known to be, with room", "type-limited", "", 2, "RUNNING, holding a slot"},
		{"a keyed run of a limited type, with room", "type-limited", "a", 1, "RUNNING, holding a slot"},
		{"a limited type whose slots are full", "type-limited", "", 2, "PENDING"},
		{"a keyed run of a limited type whose slots are full", "type-limited", "b", 1, "PENDING"},
		{"a type with a rate limit", "rated", "", 2, "PENDING"},
	} {
		if got := start(c.typ, c.key, c.eager); got != c.want {
			t.Errorf("%s: %s, want %s", c.what, got, c.want)
		}
	}
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

// An eager start that cannot take the type's or the key's lock (a claim, or another
// start, holds it) does not wait for it: it queues its run for a claim.
func TestAnEagerStartWhoseTypeOrKeyIsLockedQueuesItsRunWithoutWaiting(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, concurrency, key_concurrency)
		VALUES ('default', 'limited', 5, 2)`); err != nil {
		t.Fatal(err)
	}
	v := "v1"
	start := func(key string) string {
		t.Helper()
		n := NewRun{RunID: uuid.Must(uuid.NewV7()), Namespace: "default", WorkflowType: "limited", Input: []byte(`1`),
			Version: &v, FlowKey: key, Eager: &Eager{WorkerID: "w", Lease: time.Minute, Version: v, Limited: true}}
		n.WorkflowID = n.RunID.String()
		// While the lock is held, a start that waited for it would never return.
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		run, _, err := InsertRunChecked(sctx, pool, n)
		if err != nil {
			t.Fatalf("start of key %q: %v", key, err)
		}
		return string(run.Status)
	}
	for _, lock := range []string{"kagzi.flow.key|default|limited|k", "kagzi.flow.type|default|limited"} {
		holder, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := holder.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, lock); err != nil {
			t.Fatal(err)
		}
		if got := start("k"); got != "PENDING" {
			t.Errorf("a start while another transaction holds %s: %s, want PENDING", lock, got)
		}
		if err := holder.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := start("other"); got != "RUNNING" {
		t.Errorf("a start of another key with every lock free: %s, want RUNNING", got)
	}
}
