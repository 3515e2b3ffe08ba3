package store

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/kagzi/kagzi/internal/testdb"
)

func TestAClaimLoadsTheRecordedStepsOfTheRunsItClaimsAndOfNoOther(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	ids := []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())}
	inputs := [][]byte{[]byte(`1`), []byte(`2`), []byte(`3`)}
	if err := InsertRuns(ctx, pool, "default", "wf", nil, ids, inputs, make([][]byte, 3), time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	// The first two carry steps of an earlier execution (as a resumed run does).
	for i, id := range ids[:2] {
		_, err := pool.Exec(ctx, `INSERT INTO kagzi.steps (run_id, step_key, name, kind, status, output, attempts)
			VALUES ($1, 'a#1', 'a', 'STEP', 'COMPLETED', $2, 1)`, id, inputs[i])
		if err != nil {
			t.Fatal(err)
		}
	}
	seen := map[uuid.UUID]bool{}
	for claim := range 3 {
		claimed, err := ClaimRuns(ctx, pool, "default", []string{"wf"}, []string{"v1"}, "w", time.Minute, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(claimed) != 1 {
			t.Fatalf("claim %d: got %d runs, want 1", claim, len(claimed))
		}
		c := claimed[0]
		seen[c.RunID] = true
		switch c.RunID {
		case ids[0], ids[1]:
			want := string(inputs[0])
			if c.RunID == ids[1] {
				want = string(inputs[1])
			}
			if len(c.Steps) != 1 || string(c.Steps["a#1"].Output) != want {
				t.Fatalf("claim %d: run %s has steps %+v, want a#1 with output %s", claim, c.RunID, c.Steps, want)
			}
		default:
			if len(c.Steps) != 0 {
				t.Fatalf("claim %d: fresh run got steps %+v", claim, c.Steps)
			}
		}
	}
	if len(seen) != 3 {
		t.Fatalf("claimed %d distinct runs, want 3", len(seen))
	}
	claimed, err := ClaimRuns(ctx, pool, "default", []string{"wf"}, []string{"v1"}, "w", time.Minute, 10)
	if err != nil || len(claimed) != 0 {
		t.Fatalf("a claim with nothing left got %d runs, %v", len(claimed), err)
	}
}
