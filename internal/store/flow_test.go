package store

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/kagzi/kagzi/internal/testdb"
)

// A claim of a type with a concurrency limit takes at most the limit's room: the limit
// less the runs holding its slots, but the claiming worker's finishing runs; the runs
// it claims hold slots.
func TestAClaimOfATypeLimitedTypeTakesNoMoreThanTheLimitsRoom(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, concurrency) VALUES ('default', 'wf', 3)`); err != nil {
		t.Fatal(err)
	}
	ids := make([]uuid.UUID, 10)
	inputs := make([][]byte, 10)
	for i := range ids {
		ids[i], inputs[i] = uuid.Must(uuid.NewV7()), []byte(`1`)
	}
	if err := InsertRuns(ctx, pool, "default", "wf", nil, ids, inputs, make([][]byte, 10), time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	c := testClaimer("wf")
	c.Floors, c.KeyFloors = NewFloors(), NewFloors()
	first, _, err := ClaimRuns(ctx, pool, c, 10)
	if err != nil || len(first) != 3 {
		t.Fatalf("the first claim got %d runs (%v), want the limit's 3", len(first), err)
	}
	for _, r := range first {
		if !r.HoldsSlot {
			t.Fatalf("a run claimed under the limit holds no slot")
		}
	}
	if again, _, err := ClaimRuns(ctx, pool, c, 10); err != nil || len(again) != 0 {
		t.Fatalf("a claim while the limit is full got %d runs (%v), want none", len(again), err)
	}
	// One of the holders is finishing (its function returned): its slot is the
	// worker's to give to its next run.
	c.Finishing = [][16]byte{first[0].RunID}
	if next, _, err := ClaimRuns(ctx, pool, c, 10); err != nil || len(next) != 1 {
		t.Fatalf("a claim with one holder finishing got %d runs (%v), want 1", len(next), err)
	}
}
