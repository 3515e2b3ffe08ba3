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
	began      []string // the runs whose functions began, in that order (gatedWorkflow)
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
func gatedWorkflow(name string, release <-chan struct{}, hooks *aheadHooks) *kagzi.Workflow[int, int] {
	return kagzi.Define(name, func(ctx *kagzi.Context, n int) (int, error) {
		hooks.mu.Lock()
		hooks.began = append(hooks.began, ctx.RunID())
		hooks.mu.Unlock()
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
	hooks = &aheadHooks{handedBack: map[string]bool{}}
	wf = gatedWorkflow(name, release, hooks)
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
	for _, id := range ahead {
		info := waitDone(t, ctx, e.client, id)
		if info.Status != kagzi.StatusCompleted {
			t.Fatalf("a run claimed ahead once the slot freed: %v; want COMPLETED", info.Status)
		}
		if hooks.wasHandedBack(id) {
			t.Fatalf("run %v was handed back; want it executed by the worker that claimed it", id)
		}
	}
	// The blocked run began first, then the runs ahead in the order they were claimed.
	hooks.mu.Lock()
	began := append([]string(nil), hooks.began...)
	hooks.mu.Unlock()
	if len(began) != 1+len(ahead) {
		t.Fatalf("%d functions began, want %d", len(began), 1+len(ahead))
	}
	for i, id := range ahead {
		if began[1+i] != id.String() {
			t.Fatalf("the functions began in the order %v; want the blocked run's, then %v", began, ahead)
		}
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

type countHooks struct {
	aheadHooks
	claims, asked, got atomic.Int64
}

func (h *countHooks) Claim(ctx context.Context, e *kagzi.ClaimEvent) {
	if !e.Eager {
		h.claims.Add(1)
		h.asked.Add(int64(e.Requested))
		h.got.Add(int64(e.Claimed))
	}
}

// Long runs (0.9-1.5 s, ending apart), a backlog, one worker of 2 slots: a claim takes runs ahead
// only for the slots freed while the claim before ran (none here), so no run waits in
// the worker and goes back (they did when the slots freed since the last claim counted).
func TestAWorkerOfLongRunsClaimsNoRunsAhead(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("ahead-long", func(ctx *kagzi.Context, n int) (int, error) {
		time.Sleep(time.Duration(900+n*137%600) * time.Millisecond)
		return n, nil
	})
	hooks := &countHooks{aheadHooks: aheadHooks{handedBack: map[string]bool{}}}
	c, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	runs, err := kagzi.StartMany(ctx, e.client, wf, []int{0, 1, 2, 3, 4, 5, 6, 7})
	if err != nil {
		t.Fatal(err)
	}
	cfg := fastWorker()
	cfg.MaxConcurrent = 2
	runWorker(t, c, cfg, wf)
	for _, r := range runs {
		if _, err := r.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	hooks.mu.Lock()
	n := len(hooks.handedBack)
	hooks.mu.Unlock()
	t.Logf("claims %d asked %d got %d; runs handed back after waiting ahead: %d (of 8 runs)", hooks.claims.Load(), hooks.asked.Load(), hooks.got.Load(), n)
	if n > 0 {
		t.Errorf("%d long runs were claimed ahead and handed back", n)
	}
}

// A worker whose slots freed while it was idle takes no runs ahead from a burst of
// long runs, which another worker with free slots starts at once (it did when the
// slots freed since its last claim counted: they waited 250 ms and went back).
func TestAWorkerBackFromIdleClaimsNoRunsAheadThatAnotherWorkerCouldStart(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var mu sync.Mutex
	began := map[int]time.Time{}
	wf := kagzi.Define("ahead-burst", func(ctx *kagzi.Context, n int) (int, error) {
		mu.Lock()
		if _, ok := began[n]; !ok {
			began[n] = time.Now()
		}
		mu.Unlock()
		if n >= 100 {
			time.Sleep(1500 * time.Millisecond)
		}
		return n, nil
	})
	hooks := &aheadHooks{handedBack: map[string]bool{}}
	c, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	warmWf := kagzi.Define("ahead-burst-warm", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
	cfgA := fastWorker()
	cfgA.MaxConcurrent = 4
	runWorker(t, c, cfgA, wf, warmWf)
	cfgB := fastWorker()
	cfgB.MaxConcurrent = 20
	runWorker(t, e.client, cfgB, wf)
	time.Sleep(300 * time.Millisecond)
	// Warm A up: 4 quick runs free its slots.
	warm, err := kagzi.StartMany(ctx, e.client, warmWf, []int{1, 2, 3, 4})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range warm {
		if _, err := r.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	sent := time.Now()
	burst, err := kagzi.StartMany(ctx, e.client, wf, []int{100, 101, 102, 103, 104, 105, 106, 107})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range burst {
		if _, err := r.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	hooks.mu.Lock()
	n := len(hooks.handedBack)
	hooks.mu.Unlock()
	mu.Lock()
	var late []time.Duration
	for k := 100; k < 108; k++ {
		late = append(late, began[k].Sub(sent).Round(time.Millisecond))
	}
	mu.Unlock()
	t.Logf("runs A claimed ahead and handed back: %d; start delays: %v", n, late)
	if n > 0 {
		t.Errorf("%d runs waited in busy worker A while B had 20 free slots", n)
	}
}

// One slot, ClaimAhead 3: a claim returns a suspect (held) and a run that waits ahead.
// The slot's run ends; the held suspect counts as the slot taken, so the run ahead does
// not start and goes back after aheadHold; then the suspect starts alone (it waited
// for its drain, soloWindow, before the hand-back woke it).
func TestAHeldSuspectStartsOnceTheRunClaimedAheadBesideItGoesBack(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	release := make(chan struct{})
	var mu sync.Mutex
	var suspectBegan time.Time
	wf := kagzi.Define("ahead-held", func(ctx *kagzi.Context, n int) (int, error) {
		switch n {
		case 1:
			select {
			case <-release:
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		case 2:
			mu.Lock()
			if suspectBegan.IsZero() {
				suspectBegan = time.Now()
			}
			mu.Unlock()
		}
		return n, nil
	})
	cfg := fastWorker()
	cfg.MaxConcurrent, cfg.ClaimAhead, cfg.MaxTakeovers = 1, 3, 1
	w, err := kagzi.NewWorker(e.client, cfg, wf)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Run(wctx); close(done) }()
	defer func() { cancel(); <-done }()
	blocked, err := kagzi.Start(ctx, e.client, wf, 1)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "blocked to run", func() bool { return runStatus(t, e.client, blocked.RunID) == kagzi.StatusRunning })
	s := startSuspect(t, e, wf, 2, 1)
	if _, err := kagzi.Start(ctx, e.client, wf, 0); err != nil {
		t.Fatal(err)
	}
	ids, err := kagzi.ClaimAhead(ctx, w, 2)
	if err != nil || len(ids) != 2 {
		t.Fatalf("claim: %v %v", ids, err)
	}
	claimed := time.Now()
	t.Logf("runs ahead: %d", kagzi.RunsAhead(w))
	time.Sleep(50 * time.Millisecond)
	close(release)
	if _, err := s.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	d := suspectBegan.Sub(claimed)
	mu.Unlock()
	t.Logf("the held suspect began %v after the claim (the slot freed after 50ms; the run ahead went back after 250ms)", d)
	if d > 2*time.Second {
		t.Errorf("the held suspect waited %v", d)
	}
}

// A run that killed its process alone is exhausted when next claimed (it fails
// RECOVERY_EXHAUSTED without running), also when that claim found no free slot for
// it: it ends at once rather than waiting ahead (handed back, it lost the verdict:
// the claim after was not the one right after its execution alone, and it ran again).
func TestARunThatKilledItsProcessAloneFailsAlsoWhenItsClaimFoundNoFreeSlot(t *testing.T) {
	for _, ahead := range []bool{false, true} {
		t.Run(map[bool]string{false: "direct", true: "ahead"}[ahead], func(t *testing.T) {
			e := newEnv(t)
			ctx := waitCtx(t)
			release := make(chan struct{})
			var ranAgain atomic.Bool
			name := "ahead-exhausted-" + map[bool]string{false: "d", true: "a"}[ahead]
			phase2 := make(chan struct{})
			wf := kagzi.Define(name, func(ctx *kagzi.Context, n int) (int, error) {
				if n == 1 {
					select {
					case <-release:
					case <-ctx.Done():
						return 0, ctx.Err()
					}
					return 1, nil
				}
				select {
				case <-phase2:
					ranAgain.Store(true)
				default:
				}
				if err := ctx.Sleep("nap", 2*time.Second); err != nil {
					return 0, err
				}
				return 7, nil
			})
			s, cfg := sleepAfterRunningAlone(t, e, wf)
			close(phase2)
			if ahead {
				cfg1 := cfg
				cfg1.MaxConcurrent, cfg1.DrainTimeout = 1, time.Hour
				w, err := kagzi.NewWorker(e.client, cfg1, wf)
				if err != nil {
					t.Fatal(err)
				}
				kagzi.SetAheadHold(w, 300*time.Millisecond)
				wctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { _ = w.Run(wctx); close(done) }()
				defer func() { cancel(); <-done }()
				defer func() {
					select {
					case <-release:
					default:
						close(release)
					}
				}()
				blocked, err := kagzi.Start(ctx, e.client, wf, 1)
				if err != nil {
					t.Fatal(err)
				}
				eventually(t, "blocked to run", func() bool { return runStatus(t, e.client, blocked.RunID) == kagzi.StatusRunning })
				// Its process died while it ran alone: RUNNING at the same epoch, lease passed.
				if _, err := e.pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'RUNNING', locked_by = 'ghost', available_at = now() WHERE run_id = $1`, s.RunID); err != nil {
					t.Fatal(err)
				}
				ids, err := kagzi.ClaimAhead(ctx, w, 1)
				if err != nil || len(ids) != 1 || ids[0].String() != s.RunID {
					t.Fatalf("claim ahead: %v %v", ids, err)
				}
				eventually(t, "handed back or failed", func() bool {
					st := runStatus(t, e.client, s.RunID)
					return st == kagzi.StatusPending || st == kagzi.StatusFailed
				})
			} else {
				if _, err := e.pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'RUNNING', locked_by = 'ghost', available_at = now() WHERE run_id = $1`, s.RunID); err != nil {
					t.Fatal(err)
				}
			}
			runWorker(t, e.client, cfg, wf)
			out, err := s.Wait(ctx)
			info, _ := e.client.GetRun(ctx, s.RunID)
			t.Logf("result %d, err %v, status %v, takeovers %d, function ran again: %v", out, err, info.Status, info.Takeovers, ranAgain.Load())
			if err == nil {
				t.Errorf("a run that died alone completed (ran again: %v); want RECOVERY_EXHAUSTED", ranAgain.Load())
			}
		})
	}
}
