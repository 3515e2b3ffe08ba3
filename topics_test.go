package kagzi_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

// claimCounter counts a client's workers' claim statements.
type claimCounter struct {
	kagzi.NopHooks
	n atomic.Int64
}

func (c *claimCounter) Claim(context.Context, *kagzi.ClaimEvent) { c.n.Add(1) }

// settled waits until the count has not moved for 300ms and returns it.
func (c *claimCounter) settled(t *testing.T) int64 {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	last := c.n.Load()
	for {
		time.Sleep(300 * time.Millisecond)
		now := c.n.Load()
		if now == last && now > 0 {
			return now
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker kept claiming (or never claimed): %d claims", now)
		}
		last = now
	}
}

func TestAStartWakesTheWorkerOfItsNamespaceAndTypeEvenWhenBothHoldABar(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	// Namespace "a|b" with type "c" and namespace "a" with type "b|c": their wake-ups
	// must reach their own worker, and only it.
	var hooksAB, hooksA claimCounter
	clientAB, err := kagzi.NewClient(e.pool, kagzi.Config{Namespace: "a|b", Logger: quietLogger(), Hooks: &hooksAB})
	if err != nil {
		t.Fatal(err)
	}
	clientA, err := kagzi.NewClient(e.pool, kagzi.Config{Namespace: "a", Logger: quietLogger(), Hooks: &hooksA})
	if err != nil {
		t.Fatal(err)
	}
	defer clientAB.Close()
	defer clientA.Close()
	echo := func(ctx *kagzi.Context, n int) (int, error) { return n, nil }
	wfC := kagzi.Define("c", echo)
	wfBC := kagzi.Define("b|c", echo)
	// Polls are a minute apart: a run done within the test's time was woken.
	cfg := kagzi.WorkerConfig{PollInterval: time.Minute}
	runWorker(t, clientAB, cfg, wfC)
	runWorker(t, clientA, cfg, wfBC)
	hooksAB.settled(t)
	hooksA.settled(t)

	wait := func(c *kagzi.Client, wf *kagzi.Workflow[int, int], n int) {
		t.Helper()
		run, err := kagzi.Start(ctx, c, wf, n)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if out, err := run.Wait(wctx); err != nil || out != n {
			t.Fatalf("run of %q in namespace %q: %v, %v; want %d within 20s (its worker was not woken)",
				wf.Name(), c.Namespace(), out, err, n)
		}
	}
	wait(clientA, wfBC, 1)
	claimsAB, claimsA := hooksAB.settled(t), hooksA.settled(t)
	wait(clientAB, wfC, 2)
	hooksAB.settled(t)
	if n := hooksA.settled(t); n != claimsA {
		t.Fatalf("a start of type \"c\" in namespace \"a|b\" woke the worker of type \"b|c\" in namespace \"a\" (%d claims, want %d)", n, claimsA)
	}
	claimsAB = hooksAB.settled(t)
	wait(clientA, wfBC, 3)
	hooksA.settled(t)
	if n := hooksAB.settled(t); n != claimsAB {
		t.Fatalf("a start of type \"b|c\" in namespace \"a\" woke the worker of type \"c\" in namespace \"a|b\" (%d claims, want %d)", n, claimsAB)
	}
}
