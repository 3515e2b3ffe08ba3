package kagzi_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

// limitedEcho returns a client that counts its claims, whose worker of echo runs and
// has made its first claim, with the limits set.
func limitedEcho(t *testing.T, e *env, limits kagzi.Limits) (*kagzi.Client, *claimKinds) {
	t.Helper()
	kinds := &claimKinds{}
	c, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Hooks: kinds})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetLimits(waitCtx(t), limits); err != nil {
		t.Fatal(err)
	}
	runWorker(t, c, fastWorker(), echo)
	eventually(t, "the worker to claim nothing at its start", func() bool { return kinds.statements.Load() > 0 })
	return c, kinds
}

func TestAKeyedStartWhoseKeyHasRoomIsClaimedByTheStartItself(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	c, kinds := limitedEcho(t, e, kagzi.Limits{WorkflowType: "echo", KeyConcurrency: 1})
	for i := range 6 {
		run, err := kagzi.Start(ctx, c, echo, i, kagzi.WithConcurrencyKey(fmt.Sprintf("customer-%d", i%2)))
		if err != nil {
			t.Fatal(err)
		}
		if out, err := run.Wait(ctx); err != nil || out != i {
			t.Fatalf("run %d: %d, %v", i, out, err)
		}
	}
	if n, m := kinds.eager.Load(), kinds.byStatement.Load(); n != 6 || m != 0 {
		t.Fatalf("%d of 6 keyed runs claimed by their starts, %d by claim statements; want 6 and 0", n, m)
	}
}

func TestAKeyedStartBehindItsKeysHolderOrQueueWaitsForAClaimInStartOrder(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	kinds := &claimKinds{}
	c, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Hooks: kinds})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []string
	release := make(chan struct{})
	wf := kagzi.Define("eager-keyed", func(ctx *kagzi.Context, in string) (string, error) {
		return kagzi.Step(ctx, "work", func(c context.Context) (string, error) {
			mu.Lock()
			order = append(order, in)
			mu.Unlock()
			if in == "holder" {
				<-release
			}
			return in, nil
		})
	})
	if _, err := c.SetLimits(ctx, kagzi.Limits{WorkflowType: "eager-keyed", KeyConcurrency: 1}); err != nil {
		t.Fatal(err)
	}
	cfg := fastWorker()
	cfg.MaxConcurrent = 10
	runWorker(t, c, cfg, wf)
	eventually(t, "the worker to claim nothing at its start", func() bool { return kinds.statements.Load() > 0 })
	holder, err := kagzi.Start(ctx, c, wf, "holder", kagzi.WithConcurrencyKey("k"))
	if err != nil {
		t.Fatal(err)
	}
	if s := runStatus(t, c, holder.RunID); s != kagzi.StatusRunning {
		t.Fatalf("the key's first run is %s right after its start, want RUNNING (claimed by its start)", s)
	}
	// The key is full: the next two wait for a claim, in start order.
	var queued []*kagzi.Run[string]
	for _, in := range []string{"second", "third"} {
		r, err := kagzi.Start(ctx, c, wf, in, kagzi.WithConcurrencyKey("k"))
		if err != nil {
			t.Fatal(err)
		}
		if s := runStatus(t, c, r.RunID); s != kagzi.StatusPending {
			t.Fatalf("a run of a full key is %s after its start, want PENDING", s)
		}
		queued = append(queued, r)
	}
	// Another key has room.
	other, err := kagzi.Start(ctx, c, wf, "other", kagzi.WithConcurrencyKey("k2"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	close(release)
	for _, r := range append(queued, holder) {
		if _, err := r.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The holder, then the other key's run (claimed by its start while k was full),
	// then k's queue in start order.
	mu.Lock()
	got := fmt.Sprint(order)
	mu.Unlock()
	if got != "[holder other second third]" {
		t.Fatalf("runs began in the order %s, want [holder other second third]", got)
	}
	if n := kinds.eager.Load(); n != 2 {
		t.Fatalf("%d runs claimed by their starts, want 2 (the holder and the other key's)", n)
	}
}

func TestATypeLimitedStartIsClaimedByItsStartOnceItsClientFoundTheTypeLimited(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	c, kinds := limitedEcho(t, e, kagzi.Limits{WorkflowType: "echo", Concurrency: 2})
	for i := range 6 {
		run, err := kagzi.Start(ctx, c, echo, i)
		if err != nil {
			t.Fatal(err)
		}
		if out, err := run.Wait(ctx); err != nil || out != i {
			t.Fatalf("run %d: %d, %v", i, out, err)
		}
	}
	// The first start learns that the type is limited (its run waits for a claim);
	// the next ones count the type's slots and claim their runs.
	if n, m := kinds.eager.Load(), kinds.byStatement.Load(); n != 5 || m != 1 {
		t.Fatalf("%d of 6 runs claimed by their starts, %d by claim statements; want 5 and 1", n, m)
	}
	var held int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.runs WHERE workflow_type = 'echo' AND holds_type_slot`).
		Scan(&held); err != nil || held != 0 {
		t.Fatalf("%d finished runs still hold a slot (%v): an eager run's end must free the slot it took", held, err)
	}
}

// Eager starts from several clients (each with its own pool and worker) at once, of
// keyed runs and of runs of no key, while the workers claim: the type's and the keys'
// limits hold at every instant.
func TestEagerStartsFromManyClientsAtOnceNeverExceedTheTypeOrKeyLimits(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	const typeLimit = 2
	var ledger atOnce
	wf := kagzi.Define("eager-exact", func(ctx *kagzi.Context, key string) (string, error) {
		defer ledger.enter(key)()
		return kagzi.Step(ctx, "work", func(context.Context) (string, error) {
			time.Sleep(time.Millisecond)
			return key, nil
		})
	})
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "eager-exact", Concurrency: typeLimit, KeyConcurrency: 1}); err != nil {
		t.Fatal(err)
	}
	kinds := &claimKinds{}
	var clients []*kagzi.Client
	for range 3 {
		pool, err := pgxpool.New(ctx, e.url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		c, err := kagzi.NewClient(pool, kagzi.Config{Logger: quietLogger(), Hooks: kinds})
		if err != nil {
			t.Fatal(err)
		}
		cfg := fastWorker()
		cfg.MaxConcurrent = 8
		runWorker(t, c, cfg, wf)
		clients = append(clients, c)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 3*4)
	for _, c := range clients {
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 25 {
					var opts []kagzi.StartOption
					key := ""
					if (g+i)%4 != 0 {
						key = fmt.Sprintf("key-%d", (g+i)%3)
						opts = append(opts, kagzi.WithConcurrencyKey(key))
					}
					r, err := kagzi.Start(ctx, c, wf, key, opts...)
					if err == nil {
						_, err = r.Wait(ctx)
					}
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	ledger.check(t, typeLimit, 1)
	if kinds.eager.Load() == 0 {
		t.Fatal("no start claimed its run: the eager path was not exercised")
	}
	t.Logf("%d of 300 runs claimed by their starts, %d by claims", kinds.eager.Load(), kinds.byStatement.Load())
}
