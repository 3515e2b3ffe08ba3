package kagzi_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/kagzi/kagzi"
)

// aheadHooks records the worker's claims and how its executions ended.
type aheadHooks struct {
	kagzi.NopHooks
	mu         sync.Mutex
	beyond     int // claims that got more runs than the worker's slots
	handedBack map[string]bool
}

func (h *aheadHooks) Claim(_ context.Context, e *kagzi.ClaimEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !e.Eager && e.Claimed > 3 {
		h.beyond++
	}
}

func (h *aheadHooks) ExecutionEnd(_ context.Context, e *kagzi.ExecutionEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e.Outcome == kagzi.OutcomeHandedBack {
		h.handedBack[e.RunID] = true
	}
}

func (h *aheadHooks) wasHandedBack(id uuid.UUID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.handedBack[id.String()]
}

func TestAWorkerThatClaimsRunsAheadNeverExecutesMoreThanMaxConcurrentAtOnce(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var executing, most atomic.Int64
	wf := kagzi.Define("ahead-bounded", func(ctx *kagzi.Context, n int) (int, error) {
		now := executing.Add(1)
		defer executing.Add(-1)
		for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
		}
		time.Sleep(time.Millisecond) // long enough for runs started at once to overlap
		return kagzi.Step(ctx, "one", func(context.Context) (int, error) { return n, nil })
	})
	hooks := &aheadHooks{handedBack: map[string]bool{}}
	c, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	runs, err := kagzi.StartMany(ctx, e.client, wf, make([]int, 600))
	if err != nil {
		t.Fatal(err)
	}
	cfg := fastWorker()
	cfg.MaxConcurrent = 3
	runWorker(t, c, cfg, wf)
	for _, r := range runs {
		if _, err := r.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if m := most.Load(); m > 3 {
		t.Fatalf("%d runs executed at once; MaxConcurrent is 3", m)
	}
	hooks.mu.Lock()
	defer hooks.mu.Unlock()
	if hooks.beyond == 0 {
		t.Fatal("no claim took runs beyond the worker's 3 slots while 600 short runs burned down")
	}
	t.Logf("%d claims took runs ahead of the slots", hooks.beyond)
}

// gatedWorkflow blocks each run whose input is 1 until release is closed.
func gatedWorkflow(name string, release <-chan struct{}) *kagzi.Workflow[int, int] {
	return kagzi.Define(name, func(ctx *kagzi.Context, n int) (int, error) {
		if n == 1 {
			select {
			case <-release:
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
		return n, nil
	})
}

// aheadSetup runs a worker of one slot that a blocked run holds, and gives it three
// more runs as runs claimed ahead: they wait in it for a slot.
func aheadSetup(t *testing.T, e *env, name string, hold time.Duration) (release chan struct{}, wf *kagzi.Workflow[int, int],
	hooks *aheadHooks, w *kagzi.Worker, stop func(), ahead []uuid.UUID) {
	ctx := waitCtx(t)
	release = make(chan struct{})
	wf = gatedWorkflow(name, release)
	hooks = &aheadHooks{handedBack: map[string]bool{}}
	c, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	blocked, err := kagzi.Start(ctx, e.client, wf, 1)
	if err != nil {
		t.Fatal(err)
	}
	cfg := fastWorker()
	// The drain waits for the blocked run: only the runs ahead go back at once.
	cfg.MaxConcurrent, cfg.DrainTimeout = 1, time.Hour
	w, err = kagzi.NewWorker(c, cfg, wf)
	if err != nil {
		t.Fatal(err)
	}
	kagzi.SetAheadHold(w, hold)
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var runErr error
	go func() { runErr = w.Run(wctx); close(done) }()
	stop = func() {
		cancel()
		<-done
		if runErr != nil {
			t.Errorf("worker: %v", runErr)
		}
	}
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
	})
	t.Cleanup(func() { // first: the stop's drain waits for the blocked run
		select {
		case <-release:
		default:
			close(release)
		}
	})
	eventually(t, "the blocked run to take the worker's slot", func() bool {
		return runStatus(t, e.client, blocked.RunID) == kagzi.StatusRunning
	})
	if _, err := kagzi.StartMany(ctx, e.client, wf, []int{0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	ahead, err = kagzi.ClaimAhead(ctx, w, 3)
	if err != nil || len(ahead) != 3 {
		t.Fatalf("claiming ahead: %d runs, %v; want 3", len(ahead), err)
	}
	if n := kagzi.RunsAhead(w); n != 3 {
		t.Fatalf("%d runs wait ahead in the worker, want 3 (its one slot is taken)", n)
	}
	return release, wf, hooks, w, stop, ahead
}

func TestRunsClaimedAheadThatFindNoFreeSlotGoBackAndAnotherWorkerCompletesThem(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	_, wf, hooks, w, _, ahead := aheadSetup(t, e, "ahead-stuck", 300*time.Millisecond)
	// Leased to the worker, not executing: RUNNING.
	for _, id := range ahead {
		if s := runStatus(t, e.client, id.String()); s != kagzi.StatusRunning {
			t.Fatalf("a run claimed ahead is %s, want RUNNING", s)
		}
	}
	// Another worker with free slots completes them while the first one's slot
	// stays taken: they went back.
	runWorker(t, e.client, fastWorker(), wf)
	for _, id := range ahead {
		info := waitDone(t, ctx, e.client, id)
		if info.Status != kagzi.StatusCompleted {
			t.Fatalf("a run claimed ahead by a busy worker: %v; want it COMPLETED by the other", info.Status)
		}
		if !hooks.wasHandedBack(id) {
			t.Fatalf("run %v completed without the busy worker handing it back", id)
		}
	}
	if n := kagzi.RunsAhead(w); n != 0 {
		t.Fatalf("%d runs still wait ahead in the busy worker", n)
	}
}

func TestAStoppingWorkerHandsItsRunsClaimedAheadBackAtOnce(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	release, wf, hooks, _, stop, ahead := aheadSetup(t, e, "ahead-stop", time.Hour)
	// The worker stops: its drain waits for the blocked run, and hands the runs
	// waiting ahead back first.
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	eventually(t, "the runs claimed ahead to go back", func() bool {
		for _, id := range ahead {
			if runStatus(t, e.client, id.String()) != kagzi.StatusPending {
				return false
			}
		}
		return true
	})
	close(release)
	<-stopped
	for _, id := range ahead {
		info, err := e.client.GetRun(ctx, id.String())
		if err != nil || info.Status != kagzi.StatusPending || info.LockedBy != "" {
			t.Fatalf("a run claimed ahead after its worker stopped: %+v, %v; want PENDING and leased to nobody", info, err)
		}
		if !hooks.wasHandedBack(id) {
			t.Fatalf("run %v was not handed back by its execution", id)
		}
	}
	runWorker(t, e.client, fastWorker(), wf)
	for _, id := range ahead {
		if info := waitDone(t, ctx, e.client, id); info.Status != kagzi.StatusCompleted {
			t.Fatalf("a run handed back by a stopping worker: %v; want COMPLETED by the next", info.Status)
		}
	}
}

func TestRunsClaimedAheadStartInClaimOrderAsTheSlotFrees(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	release, _, hooks, w, _, ahead := aheadSetup(t, e, "ahead-order", time.Hour)
	close(release)
	var prev time.Time
	for _, id := range ahead {
		info := waitDone(t, ctx, e.client, id)
		if info.Status != kagzi.StatusCompleted {
			t.Fatalf("a run claimed ahead once the slot freed: %v; want COMPLETED", info.Status)
		}
		if hooks.wasHandedBack(id) {
			t.Fatalf("run %v was handed back; want it executed by the worker that claimed it", id)
		}
		if info.FinishedAt == nil || info.FinishedAt.Before(prev) {
			t.Fatalf("run %v finished at %v, before the run claimed before it (%v)", id, info.FinishedAt, prev)
		}
		prev = *info.FinishedAt
	}
	if n := kagzi.RunsAhead(w); n != 0 {
		t.Fatalf("%d runs still wait ahead", n)
	}
}

// waitDone waits for the run to end and returns what the database holds of it.
func waitDone(t *testing.T, ctx context.Context, c *kagzi.Client, id uuid.UUID) *kagzi.RunInfo {
	t.Helper()
	if _, err := kagzi.RunOf[int](c, id.String()).Wait(ctx); err != nil {
		t.Fatalf("waiting for run %v: %v", id, err)
	}
	info, err := c.GetRun(ctx, id.String())
	if err != nil {
		t.Fatal(err)
	}
	return info
}
