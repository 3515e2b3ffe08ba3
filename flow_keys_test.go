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
// of the free place walks further when its visit found no room, and so does the claim
// after notifications were lost.
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
	// A key freed while the listeners are gone: its notification is lost, and the
	// worker that reconnects looks as far as it would have on hearing it. The cancel
	// commits right after the worker's listening session is ended, before it can be
	// back.
	// (The ends of the runs above free their keys again, and the claims those ends
	// make walk the ring once more: they are done first.)
	time.Sleep(500 * time.Millisecond)
	const k = 250
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if err := e.client.CancelTx(ctx, tx, holders[k]); err != nil {
		t.Fatal(err)
	}
	var ended int
	// The worker's direct connection, its listener, is the session that holds its
	// liveness lock (docs/deployment.md); the pools' sessions are left alone.
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT DISTINCT pg_terminate_backend(l.pid) FROM pg_locks l
		JOIN pg_database d ON d.oid = l.database AND d.datname = current_database()
		WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()) t`).Scan(&ended); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if ended == 0 {
		t.Fatal("no listening session was ended: the test tested nothing")
	}
	wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := next[k].Wait(wctx); err != nil || out != k {
		t.Fatalf("key %d's next run after its holder was cancelled while the worker's listener was gone: %v, %v", k, out, err)
	}
	t.Logf("key %d's next run done %v after the cancel, its notification lost", k, time.Since(began))
}
