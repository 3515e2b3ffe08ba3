package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/kagzi/kagzi/internal/testdb"
	"github.com/kagzi/kagzi/internal/vocab"
)

func TestContinueRunIsFencedAndACancelRequestedFirstEndsTheRunWithoutANext(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	ids := []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())}
	if err := InsertRuns(ctx, pool, "default", "wf", nil, ids, [][]byte{[]byte(`1`), []byte(`2`)}, make([][]byte, 2), time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	claimed, _, err := ClaimRuns(ctx, pool, testClaimer("wf"), 2)
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claimed %d, %v", len(claimed), err)
	}
	fences := map[uuid.UUID]Fence{}
	for _, c := range claimed {
		fences[c.RunID] = c.Fence
	}
	// A stale epoch continues nothing.
	stale := fences[ids[0]]
	stale.Epoch--
	next := uuid.Must(uuid.NewV7())
	if _, err := ContinueRun(ctx, pool, time.Minute, ContinueWrite{Fence: stale, Next: next, Input: []byte(`3`)}); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("ContinueRun with a stale epoch: %v, want ErrLeaseLost", err)
	}
	// A cancel requested before the continue wins.
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET cancel_requested = true WHERE run_id = $1`, ids[1]); err != nil {
		t.Fatal(err)
	}
	status, err := ContinueRun(ctx, pool, time.Minute, ContinueWrite{Fence: fences[ids[1]], Next: next, Input: []byte(`3`)})
	if err != nil || status != vocab.StatusCancelled {
		t.Fatalf("ContinueRun of a run with a cancel requested = %s, %v; want CANCELLED", status, err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.runs WHERE run_id = $1`, next).Scan(&n); err != nil || n != 0 {
		t.Fatalf("a next run exists (%d, %v) after a stale or cancelled continue", n, err)
	}
	// The holder continues: one transaction ends the run and starts the next.
	status, err = ContinueRun(ctx, pool, time.Minute, ContinueWrite{Fence: fences[ids[0]], Next: next, Input: []byte(`3`)})
	if err != nil || status != vocab.StatusCompleted {
		t.Fatalf("ContinueRun = %s, %v", status, err)
	}
	r, err := GetRun(ctx, pool, "default", next)
	if err != nil || r.Status != vocab.StatusPending || r.WorkflowID != ids[0].String() || string(r.Input) != "3" ||
		r.ContinuedFromRunID == nil || *r.ContinuedFromRunID != ids[0] {
		t.Fatalf("next run %+v, %v", r, err)
	}
}

// A signal sent while its run continues as new (the continue's transaction has ended
// the run and not yet moved the untaken signals to the next run) waits for the
// continue, then stores nothing on the finished run and names the run it continued
// as; before, it was stored on the finished run after the move, where no wait would
// ever take it, and the sender was told the run was RUNNING (found from outside: 2-36
// signals lost in each of 9 tries). The same holds for an end: a signal stored on a
// run whose end is committing would be lost the same way.
func TestASignalSentWhileItsRunContinuesAsNewIsNotStrandedOnTheFinishedRun(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	run := runningRun(t, pool, 1, false)
	next := uuid.Must(uuid.NewV7())
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	w := ContinueWrite{Fence: Fence{RunID: run, Epoch: 1}, Client: uuid.New(), Next: next, Input: []byte(`2`)}
	if tag, err := tx.Exec(ctx, continueEnd.sql, continueEnd.args(&w)...); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("the continue's end: %v, %v", tag, err)
	}
	type result struct {
		sent SignalSent
		err  error
	}
	done := make(chan result, 1)
	go func() {
		sent, err := SendSignal(ctx, pool, SignalSend{Namespace: "default", RunID: run, Name: "go", Payload: []byte(`1`)})
		done <- result{sent, err}
	}()
	time.Sleep(300 * time.Millisecond) // the signal is most likely under way by now
	c := continued{Next: next, From: run, Namespace: "default", WorkflowID: run.String(), WorkflowType: "wf", Input: []byte(`2`)}
	if _, err := tx.Exec(ctx, continueStart.sql, continueStart.args(&c)...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.sent.Status != vocab.StatusCompleted || r.sent.ContinuedAs == nil || *r.sent.ContinuedAs != next {
		t.Errorf("a signal sent during the continue: %+v, %v; want the run COMPLETED, continued as %s", r.sent, r.err, next)
	}
	var stranded int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.signals WHERE run_id = $1`, run).Scan(&stranded); err != nil || stranded != 0 {
		t.Fatalf("%d signals stored on the run that continued as new (%v), want none", stranded, err)
	}
	if sent, err := SendSignal(ctx, pool, SignalSend{Namespace: "default", RunID: next, Name: "go", Payload: []byte(`1`)}); err != nil ||
		sent.Status != vocab.StatusPending {
		t.Fatalf("the signal sent on to the next run: %+v, %v", sent, err)
	}
}

// A parent's read of its child's outcome walks the child's continue-as-new chain with a
// recursive statement over the live runs and the history; over a history partition
// never analyzed, PostgreSQL estimated it costly enough to compile it (JIT): 7 s of
// compiling for a 0.2 ms read, by every parent at once, in an outside soak. The read
// turns JIT off for itself (outcomeSetupSQL, same round trip).
func TestAChildsOutcomeIsReadWithoutCompilingItOverAnUnanalyzedHistory(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		CREATE TABLE kagzi.runs_history_p20260101 (LIKE kagzi.runs_history INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
		ALTER TABLE kagzi.runs_history ATTACH PARTITION kagzi.runs_history_p20260101
			FOR VALUES FROM ('2026-01-01T00:00:00Z') TO ('2026-01-02T00:00:00Z');
		INSERT INTO kagzi.runs_history (run_id, namespace, workflow_id, workflow_type, status, input, output,
			available_at, created_at, finished_at)
		SELECT gen_random_uuid(), 'default', 'w' || g, 'wf', 'COMPLETED', '1', to_jsonb(g), now(), now(),
			'2026-01-01T01:00:00Z'::timestamptz + g * interval '1 millisecond'
		FROM generate_series(1, 140000) g`); err != nil {
		t.Fatal(err)
	}
	var id uuid.UUID
	if err := pool.QueryRow(ctx, `SELECT run_id FROM kagzi.runs_history WHERE workflow_id = 'w5000'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// The case: without the setup, the plan is compiled (where the server has JIT).
	if plan := explainPlan(t, conn.Conn(), "SELECT set_config('jit', 'on', true)", "force_custom_plan", runOutcomeSQL, id); !strings.Contains(plan, "JIT") {
		t.Logf("this server would not compile the read anyway (no JIT support?):\n%s", plan)
	}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		if plan := explainPlan(t, conn.Conn(), outcomeSetupSQL, mode, runOutcomeSQL, id); strings.Contains(plan, "JIT") {
			t.Errorf("the outcome's read after its setup (%s) is compiled:\n%s", mode, plan)
		}
	}
	o, err := GetRunOutcome(ctx, pool, id)
	if err != nil || o.Status != vocab.StatusCompleted || string(o.Output) != "5000" {
		t.Fatalf("GetRunOutcome = %+v, %v; want COMPLETED with 5000", o, err)
	}
}
