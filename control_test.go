package kagzi_test

import (
	"errors"
	"testing"

	"github.com/kagzi/kagzi"
)

func TestCancelTxCancelsOnlyWhenTheTransactionCommits(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	run, err := e.client.StartByName(ctx, "held", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, commit := range []bool{false, true} {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.client.CancelTx(ctx, tx, run.RunID); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		want := kagzi.StatusPending
		if commit {
			want = kagzi.StatusCancelled
		}
		if got := runStatus(t, e.client, run.RunID); got != want {
			t.Fatalf("after CancelTx and commit=%v the run is %s, want %s", commit, got, want)
		}
	}
	if _, err := run.Wait(ctx); !errors.Is(err, kagzi.ErrCancelled) {
		t.Fatalf("Wait after CancelTx: %v, want ErrCancelled", err)
	}
	mustErrorIs(t, e.client.CancelTx(ctx, nil, run.RunID), kagzi.ErrInvalidArgument)
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	mustErrorIs(t, e.client.CancelTx(ctx, tx, "not-a-uuid"), kagzi.ErrInvalidArgument)
}

// collects waits for three signals "item" and returns their payloads.
// namedChild starts a child of the id it is given and returns the child's output,
// or the error's kind.
