package kagzi_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

// A client that nothing uses any more holds no goroutine (found from outside: the
// console and the admin facade make a client per namespace asked for, and each kept
// two goroutines for the process's life).
func TestAClientNoLongerUsedHoldsNoGoroutineAndStartsAgainWhenUsed(t *testing.T) {
	e := newEnv(t)
	c := newClient(t, e.pool, "lifecycle")
	kagzi.SetStartsIdle(c, 200*time.Millisecond)
	wf := kagzi.Define("life", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
	ctx := waitCtx(t)
	startAll := func(n int) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := kagzi.Start(ctx, c, wf, i)
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	idle := func() {
		t.Helper()
		for kagzi.StartSenders(c) != 0 {
			if ctx.Err() != nil {
				t.Fatalf("%d goroutines still share the client's starts after it stopped starting", kagzi.StartSenders(c))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// Waves of concurrent starts with pauses longer than the senders' idle time
	// between them: each wave starts its senders again, and no start is left waiting
	// on a sender that ended.
	sharing := 0
	for range 5 {
		startAll(40)
		if kagzi.StartSenders(c) > 0 {
			sharing++ // concurrent starts shared commits through the senders
		}
		idle()
	}
	if sharing == 0 {
		t.Fatal("no wave of 40 concurrent starts started the goroutines that share their commits")
	}
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM kagzi.runs WHERE namespace = 'lifecycle'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 200 {
		t.Fatalf("%d runs started, want 200", n)
	}
}
