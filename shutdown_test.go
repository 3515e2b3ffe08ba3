package kagzi_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

// A worker stopped while starts keep arriving must leave no run RUNNING: a claim in
// flight when Run's context ends still commits in the database, so its runs must be
// handed back, not dropped. The lease is long, so a run left behind would show.
func TestStoppingAWorkerWhileRunsArriveLeavesNoRunHeldByIt(t *testing.T) {
	e := newEnv(t)
	wf := kagzi.Define("arrives-during-stop", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Step(ctx, "one", func(context.Context) (int, error) { return n, nil })
	})
	starting, stopStarting := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; starting.Err() == nil; i++ {
			if _, err := kagzi.Start(context.Background(), e.client, wf, i); err != nil {
				t.Errorf("start: %v", err)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	cfg := fastWorker()
	cfg.LeaseDuration, cfg.HeartbeatInterval = time.Minute, 20*time.Second
	for cycle := range 20 {
		cfg.ID = fmt.Sprint("cycle-", cycle)
		w, err := kagzi.NewWorker(e.client, cfg, wf)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		err = w.Run(ctx)
		cancel()
		if err != nil {
			t.Fatalf("cycle %d: Run returned %v", cycle, err)
		}
	}
	stopStarting()
	wg.Wait()
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs`); n < 50 {
		t.Fatalf("only %d runs were started: the test tested little", n)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE status = 'RUNNING'`); n != 0 {
		t.Fatalf("%d runs are RUNNING, leased to workers that stopped", n)
	}
	// What was handed back is claimable at once.
	runWorker(t, e.client, fastWorker(), wf)
	eventually(t, "every run to complete", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE status <> 'COMPLETED'`) == 0
	})
}
