package kagzi_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

// TestManyWaitsLookAtTheirRunsTogether: a client's waits look at their runs, after
// their first look, in one statement a round; 400 waits (300 runs, and 100 more
// waits on one of them) that learn of ends only by looking (no direct connection)
// cost a few statements a second, not hundreds, and each still learns its run's end.
func TestManyWaitsLookAtTheirRunsTogether(t *testing.T) {
	e := newEnv(t)
	pool, rt := tracedPool(t, e.url)
	waiter, err := kagzi.NewClient(pool, kagzi.Config{DisableDirectConn: true, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	wf := kagzi.Define("never-claimed", func(ctx *kagzi.Context, in int) (int, error) { return in, nil })
	ctx := waitCtx(t)
	const runs, extra = 300, 100
	inputs := make([]int, runs)
	started, err := kagzi.StartMany(ctx, e.client, wf, inputs) // no worker: the runs stay PENDING
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, runs)
	for i, run := range started {
		ids[i] = run.RunID
	}
	var wg sync.WaitGroup
	errs := make(chan error, runs+extra)
	for i := range runs + extra {
		id := ids[i%runs]
		if i >= runs {
			id = ids[0]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := kagzi.RunOf[int](waiter, id).Wait(ctx)
			errs <- err
		}()
	}
	// Every wait made its first look (its own); from then on, count the looks.
	eventually(t, "every wait's first look", func() bool { return rt.countDone("kagzi.runs") >= runs+extra })
	time.Sleep(500 * time.Millisecond)
	from := rt.count("kagzi.runs")
	time.Sleep(4 * time.Second) // each wait looks at least twice in this window (at each second)
	looks := rt.count("kagzi.runs") - from
	t.Logf("statements reading kagzi.runs in 4 s of %d waits: %d", runs+extra, looks)
	if looks > 60 {
		t.Fatalf("%d statements read kagzi.runs in 4 s for %d waits: their looks are not batched", looks, runs+extra)
	}
	if looks == 0 {
		t.Fatal("the waits did not look at their runs at all")
	}
	// The ends reach every wait by the batched looks.
	if _, err := e.client.CancelRuns(ctx, kagzi.RunFilter{WorkflowType: "never-claimed"}); err != nil {
		t.Fatal(err)
	}
	cancelled := time.Now()
	wg.Wait()
	t.Logf("every wait returned %v after the cancel", time.Since(cancelled))
	close(errs)
	for err := range errs {
		if !errors.Is(err, kagzi.ErrCancelled) {
			t.Fatalf("a wait returned %v, want ErrCancelled", err)
		}
	}
}

// A client without a direct connection does not register as a waiter for run ends:
// nothing of it would hear their notifications, and a registration makes every end
// in the namespace notify (found from outside: 0 notifications before its first
// wait, one per end after).
func TestAClientWithoutADirectConnectionDoesNotRegisterAsAWaiter(t *testing.T) {
	e := newEnv(t)
	waiter, err := kagzi.NewClient(e.pool, kagzi.Config{DisableDirectConn: true, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	wf := kagzi.Define("waited-without-listening", func(ctx *kagzi.Context, in int) (int, error) { return in, nil })
	runWorker(t, e.client, fastWorker(), wf)
	ctx := waitCtx(t)
	run, err := kagzi.Start(ctx, e.client, wf, 7)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := kagzi.RunOf[int](waiter, run.RunID).Wait(ctx); err != nil || out != 7 {
		t.Fatalf("Wait: %v, %v", out, err)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.waiters`); n != 0 {
		t.Fatalf("%d waiter registrations, want none from a client that cannot listen", n)
	}
}
