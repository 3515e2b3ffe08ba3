package committer_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi/internal/committer"
	"github.com/kagzi/kagzi/internal/testdb"
)

// gathering returns a running committer with one sender that gathers while busy.
func gathering(t *testing.T, d time.Duration, min int, loaded func() bool) *committer.Committer {
	t.Helper()
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), testdb.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c := committer.New(pool, 64)
	c.GatherWhenBusy(d, min, loaded)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx, 1) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// txid runs a statement through the committer and returns its transaction's id:
// statements of one batch share a transaction.
func txid(t *testing.T, c *committer.Committer) int64 {
	t.Helper()
	var id int64
	if err := c.QueryRow(context.Background(), `SELECT txid_current()`).Scan(&id); err != nil {
		t.Error(err)
	}
	return id
}

// busyFor keeps a statement in flight for d; wait returns when it is done.
func busyFor(t *testing.T, c *committer.Committer, d time.Duration) (wait func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		var one int
		if err := c.QueryRow(context.Background(), `SELECT 1 FROM pg_sleep($1)`, d.Seconds()).Scan(&one); err != nil {
			t.Error(err)
		}
	}()
	time.Sleep(d / 5) // the sleeper is in flight: what comes next queues for the sender
	return func() { <-done }
}

func TestWhileBusyTheNextBatchWaitsForCompanyAndNothingGoesOutAlone(t *testing.T) {
	c := gathering(t, 2*time.Second, 1, nil)
	wait := busyFor(t, c, time.Second)
	first := txid(t, c) // a batch of one through the sender: from now on the committer holds back
	wait()              // nothing in flight any more: only the hold keeps the next ones together

	ids := make(chan int64, 2)
	go func() { ids <- txid(t, c) }()
	time.Sleep(300 * time.Millisecond)
	go func() { ids <- txid(t, c) }()
	a, b := <-ids, <-ids
	if a != b {
		t.Fatalf("statements 300 ms apart within the gather time committed apart (transactions %d and %d)", a, b)
	}
	if a == first {
		t.Fatalf("the held-back batch shares transaction %d with the batch before it", a)
	}
}

func TestAfterASmallBatchTheNextGoesAtOnce(t *testing.T) {
	notHeldBack(t, gathering(t, time.Hour, 2, nil)) // a batch of one: below the minimum
}

func TestWhenNotLoadedTheNextBatchGoesAtOnce(t *testing.T) {
	notHeldBack(t, gathering(t, time.Hour, 1, func() bool { return false }))
}

// notHeldBack sends a batch of one through the sender, then checks that the next
// statement is not held back.
func notHeldBack(t *testing.T, c *committer.Committer) {
	t.Helper()
	wait := busyFor(t, c, time.Second)
	txid(t, c)

	done := make(chan struct{})
	go func() { defer close(done); txid(t, c) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the statement after that batch was held back")
	}
	wait()
}

func TestAMergedBatchRunsTheSetupFirstInItsOwnTransaction(t *testing.T) {
	const merged = `SELECT ord, coalesce(current_setting('kagzi.setup', true), '') || v
		FROM unnest($1::text[]) WITH ORDINALITY AS i(v, ord)`
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), testdb.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	values := &committer.Statement{Name: "values", Build: func(inputs []any) (string, []any) {
		vs := make([]string, len(inputs))
		for i, in := range inputs {
			vs[i] = in.(string)
		}
		return merged, []any{vs}
	}}
	c := committer.New(pool, 64)
	c.SetupMergedBatches(`SELECT set_config('kagzi.setup', 'set:', true)`)
	c.GatherWhenBusy(2*time.Second, 1, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx, 1) }()
	t.Cleanup(func() { cancel(); <-done })

	wait := busyFor(t, c, time.Second)
	txid(t, c) // through the sender: the next batch is held back and gathers both below
	wait()
	got := make(chan string, 2)
	for _, v := range []string{"a", "b"} {
		go func() {
			var s string
			if err := c.Write(context.Background(), values, v, &s); err != nil {
				t.Error(err)
			}
			got <- s
		}()
	}
	for range 2 {
		if s := <-got; s != "set:a" && s != "set:b" {
			t.Fatalf("a merged request read %q, want the setup's setting before its value", s)
		}
	}
}
