package store

import (
	"context"
	"errors"
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
