package kagzi_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

// A claim visits the room plus 16 keys of the ring from its cursor. When many keys are
// full (their holders sleep for long: an order each, waiting for days), a key freed
// among them must not wait for later claims to come round to it: the claim that heard
// of the free place walks further when its visit found no room.
func TestAKeyFreedAmongAThousandFullKeysStartsItsNextRunWithoutAPoll(t *testing.T) {
	e := newEnv(t)
	ctx, cancelAll := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancelAll()
	wf := kagzi.Define("orders", func(ctx *kagzi.Context, n int) (int, error) {
		if n < 0 {
			if err := ctx.Sleep("hold", time.Hour); err != nil {
				return 0, err
			}
		}
		return n, nil
	})
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "orders", KeyConcurrency: 1}); err != nil {
		t.Fatal(err)
	}
	cfg := fastWorker()
	// Only a notification claims: no poll, and answers stand (the lease is longer).
	cfg.PollInterval = time.Hour
	cfg.LeaseDuration = 2 * time.Hour
	cfg.HeartbeatInterval = time.Hour
	cfg.MaxConcurrent = 100
	runWorker(t, newClient(t, e.pool, ""), cfg, wf)
	const keys = 1000
	holders := make([]string, keys)
	for k := 0; k < keys; k++ {
		r, err := kagzi.Start(ctx, e.client, wf, -1, kagzi.WithConcurrencyKey(fmt.Sprintf("c%04d", k)))
		if err != nil {
			t.Fatal(err)
		}
		holders[k] = r.RunID
	}
	eventually(t, "every holder asleep", func() bool {
		var n int
		e.pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.runs WHERE status = 'SLEEPING'`).Scan(&n)
		return n == keys
	})
	next := make([]*kagzi.Run[int], keys)
	for k := 0; k < keys; k++ {
		r, err := kagzi.Start(ctx, e.client, wf, k, kagzi.WithConcurrencyKey(fmt.Sprintf("c%04d", k)))
		if err != nil {
			t.Fatal(err)
		}
		next[k] = r
	}
	// The worker visited the keys as their runs were started, found every one full,
	// and waits. Each cancel frees one key's place.
	time.Sleep(500 * time.Millisecond)
	began := time.Now()
	for _, k := range []int{500, 123, 877} {
		if err := e.client.Cancel(ctx, holders[k]); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := next[k].Wait(wctx)
		cancel()
		if err != nil || out != k {
			t.Fatalf("key %d's next run after its holder was cancelled: %v, %v", k, out, err)
		}
		t.Logf("key %d's next run done %v after the cancel", k, time.Since(began))
		began = time.Now()
	}
}
