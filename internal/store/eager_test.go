package store

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/kagzi/kagzi/internal/testdb"
)

// An eager start of a keyed run claims it only when its type's only limit is its
// keys' concurrency (or it has none), its key has room, and no run of its key is
// queued before it; otherwise it inserts the run PENDING, for a claim.
func TestAnEagerKeyedStartClaimsItsRunOnlyWhenItsKeyHasRoomAndNoQueue(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, key_concurrency) VALUES ('default', 'keyed', 2);
		INSERT INTO kagzi.flow_limits (namespace, workflow_type, concurrency) VALUES ('default', 'type-limited', 5)`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx) // one connection, for its prepared statements' plan counts
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	v := "v1"
	start := func(typ, key string, eager bool) string {
		t.Helper()
		n := NewRun{RunID: uuid.Must(uuid.NewV7()), Namespace: "default", WorkflowType: typ, Input: []byte(`1`), Version: &v,
			FlowKey: key}
		n.WorkflowID = n.RunID.String()
		if eager {
			n.Eager = &Eager{WorkerID: "w", Lease: time.Minute, Version: v}
		}
		run, inserted, err := InsertRun(ctx, conn, n)
		if err != nil || !inserted {
			t.Fatalf("start of %s/%s: inserted %v, %v", typ, key, inserted, err)
		}
		return string(run.Status)
	}
	for _, c := range []struct {
		what, typ, key string
		eager          bool
		want           string
	}{
		{"the key's first run", "keyed", "a", true, "RUNNING"},
		{"a second run, one holder of two places", "keyed", "a", true, "RUNNING"},
		{"a third run: the key is full", "keyed", "a", true, "PENDING"},
		{"another key", "keyed", "b", true, "RUNNING"},
		{"a run not started eagerly", "keyed", "b", false, "PENDING"},
		{"a run behind the key's queued run, with room", "keyed", "b", true, "PENDING"},
		{"a type with no limits", "free", "a", true, "RUNNING"},
		{"a type with a concurrency limit", "type-limited", "a", true, "PENDING"},
	} {
		if got := start(c.typ, c.key, c.eager); got != c.want {
			t.Errorf("%s: %s, want %s", c.what, got, c.want)
		}
	}
	for range 8 {
		start("free", "c", true)
	}
	var generic, custom int64
	if err := conn.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`,
		insertRuns[eagerKeyed][0].sql).Scan(&generic, &custom); err != nil {
		t.Fatal(err)
	}
	if custom > 0 {
		t.Errorf("the eager keyed start was planned anew %d times (generic plans %d), want its generic plan every time", custom, generic)
	}
}
