package kagzi_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

// claimErrors counts the claims that failed.
type claimErrors struct {
	kagzi.NopHooks
	n atomic.Int32
}

func (h *claimErrors) Claim(_ context.Context, e *kagzi.ClaimEvent) {
	if e.Err != nil {
		h.n.Add(1)
	}
}

// A database (or role) whose default_transaction_isolation is REPEATABLE READ gives
// every transaction one snapshot, taken at its first statement: a claim counting a
// limit's holders after locking the limit would not see the claims that committed
// while it waited for the lock, and its SKIP LOCKED reads of runs updated meanwhile
// would fail with serialization errors. Kagzi's claims run at READ COMMITTED whatever
// the default.
func TestFlowLimitsHoldAndClaimsDoNotFailWhenTheDatabaseDefaultsToRepeatableRead(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	if _, err := e.pool.Exec(ctx, `DO $$ BEGIN
		EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = ''repeatable read''', current_database());
	END $$`); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, e.url) // its connections start after the change
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var iso string
	if err := pool.QueryRow(ctx, "SHOW transaction_isolation").Scan(&iso); err != nil || iso != "repeatable read" {
		t.Fatalf("the pool's transactions run at %q (%v), want repeatable read", iso, err)
	}

	const keys, typeLimit = 4, 3
	var ledger atOnce
	wf := kagzi.Define("isolated", func(ctx *kagzi.Context, key string) (string, error) {
		defer ledger.enter(key)()
		return kagzi.Step(ctx, "work", func(context.Context) (string, error) {
			time.Sleep(2 * time.Millisecond)
			return key, nil
		})
	})
	hooks := &claimErrors{}
	var clients []*kagzi.Client
	for range 3 {
		c, err := kagzi.NewClient(pool, kagzi.Config{Logger: quietLogger(), Hooks: hooks})
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	if _, err := clients[0].SetLimits(ctx, kagzi.Limits{WorkflowType: "isolated", Concurrency: typeLimit, KeyConcurrency: 1}); err != nil {
		t.Fatal(err)
	}
	var runs []*kagzi.Run[string]
	for i := range 120 {
		k := fmt.Sprintf("key-%d", i%keys)
		r, err := kagzi.Start(ctx, clients[0], wf, k, kagzi.WithConcurrencyKey(k))
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, r)
	}
	for _, c := range clients {
		runWorker(t, c, kagzi.WorkerConfig{MaxConcurrent: 10}, wf)
	}
	for _, r := range runs {
		if _, err := r.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ledger.check(t, typeLimit, 1)
	if n := hooks.n.Load(); n > 0 {
		t.Errorf("%d claims failed", n)
	}
}
