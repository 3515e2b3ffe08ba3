package kagzi_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

func TestCancelPendingRunEndsItCancelled(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	run, err := kagzi.Start(ctx, e.client, greet, greetIn{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.client.Cancel(ctx, run.RunID); err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrCancelled)
	runWorker(t, e.client, fastWorker(), greet)
	time.Sleep(200 * time.Millisecond)
	if s := runStatus(t, e.client, run.RunID); s != kagzi.StatusCancelled {
		t.Fatalf("status %s, want CANCELLED and never claimed", s)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.steps`); n != 0 {
		t.Fatalf("a cancelled pending run recorded %d steps", n)
	}
}

func TestCancelSleepingRunEndsItCancelledAndItNeverWakes(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var woke atomic.Bool
	wf := kagzi.Define("sleep-then-act", func(ctx *kagzi.Context, _ int) (int, error) {
		if err := ctx.Sleep("nap", 700*time.Millisecond); err != nil {
			return 0, err
		}
		woke.Store(true)
		return 1, nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the run to sleep", func() bool { return runStatus(t, e.client, run.RunID) == kagzi.StatusSleeping })
	if err := e.client.Cancel(ctx, run.RunID); err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrCancelled)
	time.Sleep(time.Second) // past the wake time
	if woke.Load() {
		t.Fatal("a cancelled sleeping run woke up")
	}
}

func TestCancelRunningRunCancelsItsStepContextAndEndsCancelled(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	inStep := make(chan struct{})
	stepSaw := make(chan error, 1)
	wf := kagzi.Define("long-step", func(ctx *kagzi.Context, _ int) (int, error) {
		return kagzi.Step(ctx, "wait", func(c context.Context) (int, error) {
			close(inStep)
			<-c.Done()
			stepSaw <- context.Cause(c)
			return 0, c.Err()
		})
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	<-inStep
	if err := e.client.Cancel(ctx, run.RunID); err != nil {
		t.Fatal(err)
	}
	if cause := <-stepSaw; !errors.Is(cause, kagzi.ErrCancelled) {
		t.Fatalf("the step's context ended with %v, want ErrCancelled", cause)
	}
	_, err = run.Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrCancelled)
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.step_attempts`); n != 0 {
		t.Fatalf("the cancelled step recorded %d attempts, want 0", n)
	}
}

func TestCompletionRacingWithCancelEndsCancelled(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	release := make(chan struct{})
	running := make(chan struct{})
	wf := kagzi.Define("ignores-cancel", func(ctx *kagzi.Context, _ int) (string, error) {
		close(running)
		<-release // pure computation between steps: it does not look at its context
		return "done anyway", nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	<-running
	if err := e.client.Cancel(ctx, run.RunID); err != nil {
		t.Fatal(err)
	}
	close(release)
	_, err = run.Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrCancelled)
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil || info.Output != nil {
		t.Fatalf("run %+v, %v: want the output discarded", info, err)
	}
}

func TestCancelOfFinishedRunsFollowsTheirStatus(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	runWorker(t, e.client, fastWorker(), greet)
	done, err := kagzi.Start(ctx, e.client, greet, greetIn{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := done.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	mustErrorIs(t, e.client.Cancel(ctx, done.RunID), kagzi.ErrRunFinished)
	if s := runStatus(t, e.client, done.RunID); s != kagzi.StatusCompleted {
		t.Fatalf("cancel changed a COMPLETED run to %s", s)
	}
	pending, err := e.client.StartByName(ctx, "nobody-runs-this", 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second cancel of a CANCELLED run is a no-op
		if err := e.client.Cancel(ctx, pending.RunID); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTwoWorkersNeverRunTheSameRunAtOnce(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var (
		mu      sync.Mutex
		inside  = map[string]bool{}
		overlap atomic.Int32
		bodies  atomic.Int32
	)
	enter := func(run string) {
		mu.Lock()
		defer mu.Unlock()
		if inside[run] {
			overlap.Add(1)
		}
		inside[run] = true
	}
	leave := func(run string) {
		mu.Lock()
		defer mu.Unlock()
		delete(inside, run)
	}
	wf := kagzi.Define("contended", func(ctx *kagzi.Context, n int) (int, error) {
		sum := 0
		for i := range 3 {
			v, err := kagzi.Step(ctx, "work", func(context.Context) (int, error) {
				enter(ctx.RunID())
				defer leave(ctx.RunID())
				bodies.Add(1)
				time.Sleep(2 * time.Millisecond)
				return n + i, nil
			})
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	second := newClient(t, e.pool, "") // a second process: its own client and listener
	runWorker(t, second, fastWorker(), wf)
	const runs = 40
	var started []*kagzi.Run[int]
	for i := range runs {
		run, err := kagzi.Start(ctx, e.client, wf, i)
		if err != nil {
			t.Fatal(err)
		}
		started = append(started, run)
	}
	for i, run := range started {
		if out, err := run.Wait(ctx); err != nil || out != 3*i+3 {
			t.Fatalf("run %d: %d, %v", i, out, err)
		}
	}
	if overlap.Load() != 0 {
		t.Fatalf("%d times a step ran while another step of the same run was running", overlap.Load())
	}
	if bodies.Load() != 3*runs {
		t.Fatalf("%d step bodies ran, want %d: each exactly once", bodies.Load(), 3*runs)
	}
	if n := countRows(t, e.pool, `SELECT count(DISTINCT locked_by) FROM kagzi.runs`); n != 0 {
		t.Fatalf("finished runs still name %d lock holders", n)
	}
}

func TestWorkerWhoseLeaseWasStolenCannotRecordAStepOrCompleteTheRun(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	inStep := make(chan struct{})
	finishStep := make(chan struct{})
	stepCtxCause := make(chan error, 1)
	wf := kagzi.Define("stolen", func(ctx *kagzi.Context, _ int) (string, error) {
		out, err := kagzi.Step(ctx, "slow", func(c context.Context) (string, error) {
			close(inStep)
			<-finishStep // a stalled step: it ignores its context
			stepCtxCause <- context.Cause(c)
			return "zombie output", nil
		})
		return out, err
	})
	cfg := fastWorker()
	cfg.LeaseDuration = 10 * time.Second // no expiry in this test: the lease is taken over
	cfg.HeartbeatInterval = 100 * time.Millisecond
	runWorker(t, e.client, cfg, wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	<-inStep
	// Another worker claims the run (as a claim after lease expiry would): the epoch moves on.
	if _, err := e.pool.Exec(ctx, `UPDATE kagzi.runs SET lease_epoch = lease_epoch + 1, locked_by = 'thief'
		WHERE run_id = $1`, run.RunID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // a heartbeat notices the loss
	close(finishStep)
	if cause := <-stepCtxCause; cause == nil {
		t.Fatal("the zombie's step context was not cancelled after its lease was lost")
	}
	time.Sleep(300 * time.Millisecond)
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.steps`); n != 0 {
		t.Fatalf("the zombie recorded %d steps after losing its lease", n)
	}
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if info.Status != kagzi.StatusRunning || info.LockedBy != "thief" || info.Output != nil {
		t.Fatalf("run %+v: the zombie changed it", info)
	}
}

func TestStalledWorkerWritesAreRejectedEvenWhenTheyArriveFirst(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	inStep := make(chan struct{})
	finishStep := make(chan struct{})
	wf := kagzi.Define("stalls", func(ctx *kagzi.Context, _ int) (string, error) {
		return kagzi.Step(ctx, "slow", func(c context.Context) (string, error) {
			close(inStep)
			<-finishStep
			return "zombie output", nil
		})
	})
	// No heartbeat in time: the lease is taken over without the zombie noticing.
	cfg := fastWorker()
	cfg.LeaseDuration = 10 * time.Second
	cfg.HeartbeatInterval = 9 * time.Second
	runWorker(t, e.client, cfg, wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	<-inStep
	if _, err := e.pool.Exec(ctx, `UPDATE kagzi.runs SET lease_epoch = lease_epoch + 1, locked_by = 'new-owner'
		WHERE run_id = $1`, run.RunID); err != nil {
		t.Fatal(err)
	}
	close(finishStep) // the zombie finishes its step before the new owner records anything
	time.Sleep(300 * time.Millisecond)
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.steps`); n != 0 {
		t.Fatalf("a write fenced by an old epoch was recorded (%d steps)", n)
	}
	if s := runStatus(t, e.client, run.RunID); s != kagzi.StatusRunning {
		t.Fatalf("status %s: the zombie changed the run", s)
	}
}

func TestDrainLetsRunningWorkflowsFinishBeforeRunReturns(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	inStep := make(chan struct{})
	wf := kagzi.Define("finishes-during-drain", func(ctx *kagzi.Context, _ int) (string, error) {
		return kagzi.Step(ctx, "s", func(context.Context) (string, error) {
			close(inStep)
			time.Sleep(300 * time.Millisecond) // shorter than the drain timeout
			return "finished", nil
		})
	})
	stop := runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	<-inStep
	stop()
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil || info.Status != kagzi.StatusCompleted {
		t.Fatalf("after the drain the run is %+v, %v; want COMPLETED", info, err)
	}
}

func TestDrainTimeoutHandsTheRunBackWithoutCountingTheAttempt(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var attempts atomic.Int32
	wf := kagzi.Define("outlives-drain", func(ctx *kagzi.Context, _ int) (string, error) {
		return kagzi.Step(ctx, "s", func(c context.Context) (string, error) {
			if attempts.Add(1) == 1 {
				<-c.Done()
				return "", c.Err()
			}
			return "second time", nil
		})
	})
	cfg := fastWorker()
	cfg.DrainTimeout = 200 * time.Millisecond
	stop := runWorker(t, e.client, cfg, wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the step to start", func() bool { return attempts.Load() == 1 })
	stop()
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil || info.Status != kagzi.StatusPending || info.LockedBy != "" {
		t.Fatalf("after the drain timeout the run is %+v, %v; want PENDING and unlocked", info, err)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.step_attempts`); n != 0 {
		t.Fatalf("the interrupted attempt was recorded (%d attempts)", n)
	}
	runWorker(t, e.client, cfg, wf)
	if out, err := run.Wait(ctx); err != nil || out != "second time" {
		t.Fatalf("got %q, %v", out, err)
	}
}

func TestRunReturnsAfterItsContextEndsEvenWithAStepThatIgnoresIt(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	block := make(chan struct{})
	defer close(block)
	inStep := make(chan struct{})
	wf := kagzi.Define("stuck", func(ctx *kagzi.Context, _ int) (int, error) {
		return kagzi.Step(ctx, "s", func(context.Context) (int, error) {
			close(inStep)
			<-block
			return 1, nil
		})
	})
	cfg := fastWorker()
	cfg.DrainTimeout = 100 * time.Millisecond
	w, err := kagzi.NewWorker(e.client, cfg, wf)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	<-inStep
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if s := runStatus(t, e.client, run.RunID); s != kagzi.StatusPending {
		t.Fatalf("status %s, want the run handed back PENDING", s)
	}
}

func TestAWorkerExecutesAtMostMaxConcurrentWorkflowFunctionsAtOnce(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var running, most atomic.Int32
	wf := kagzi.Define("bounded", func(ctx *kagzi.Context, n int) (int, error) {
		now := running.Add(1)
		defer running.Add(-1)
		for {
			m := most.Load()
			if now <= m || most.CompareAndSwap(m, now) {
				break
			}
		}
		return kagzi.Step(ctx, "work", func(context.Context) (int, error) {
			time.Sleep(20 * time.Millisecond)
			return n, nil
		})
	})
	in := make([]int, 30)
	runs, err := kagzi.StartMany(ctx, e.client, wf, in)
	if err != nil {
		t.Fatal(err)
	}
	cfg := fastWorker()
	cfg.MaxConcurrent = 3
	runWorker(t, e.client, cfg, wf)
	for _, r := range runs {
		if _, err := r.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if m := most.Load(); m != 3 {
		t.Fatalf("at most %d workflow functions ran at once, want exactly MaxConcurrent (3): slots are freed when a function returns, before its end is written", m)
	}
}

func TestAWorkerFedByNotificationsClaimsOncePerRunAndDoesNotAskForItsNextWake(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	workerPool, rt := tracedPool(t, e.url)
	wf := kagzi.Define("notified", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
	runWorker(t, newClient(t, workerPool, ""), kagzi.WorkerConfig{}, wf)
	// Each start is announced and claimed on its own, and leaves slots free. Before,
	// each such claim was followed by a query for the next wake time, and each run's
	// end freed a slot that claimed again (twice) though nothing had been announced.
	for i := range 40 {
		run, err := kagzi.Start(ctx, e.client, wf, i)
		if err != nil {
			t.Fatal(err)
		}
		if out, err := run.Wait(ctx); err != nil || out != i {
			t.Fatalf("run %d: got %d, %v", i, out, err)
		}
	}
	// The worker asks once when it starts, and again whenever it cannot trust its last
	// answer (a failed claim, dropped notifications): a few times at most on a loaded
	// machine, where the behaviour this guards against asked after every run (40).
	claims, asked := rt.count("FROM kagzi.claim("), rt.count("$5::timestamptz[]) AS t(workflow_type, version, floor)")
	if claims < 20 || claims > 60 || asked > 5 {
		t.Fatalf("%d claims and %d next-wake queries for 40 runs started one by one; want 20 to 60 claims, at most 5 queries", claims, asked)
	}
}

// blockingClaims is a Hooks whose Claim counts the worker's claim statements and,
// once armed, holds the claim loop in the next one until released.
type blockingClaims struct {
	kagzi.NopHooks
	claims   atomic.Int64
	armed    atomic.Bool
	blocked  chan struct{}
	released chan struct{}
}

func (b *blockingClaims) Claim(_ context.Context, e *kagzi.ClaimEvent) {
	if e.Eager {
		return
	}
	b.claims.Add(1)
	if b.armed.CompareAndSwap(true, false) {
		close(b.blocked)
		<-b.released
	}
}

func TestNotificationsThatArriveDuringAClaimCallForOneClaimAfterIt(t *testing.T) {
	e := newEnv(t)
	hooks := &blockingClaims{blocked: make(chan struct{}), released: make(chan struct{})}
	c, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	wf := kagzi.Define("announced", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
	cfg := fastWorker()
	cfg.PollInterval = time.Hour // no claim but the ones announced
	runWorker(t, c, cfg, wf)
	eventually(t, "the worker's first claim", func() bool { return hooks.claims.Load() > 0 })
	// The worker is idle; the next claim (for one announcement) holds the loop while ten
	// more runs are announced.
	before := hooks.claims.Load()
	hooks.armed.Store(true)
	kagzi.AnnounceRunsInProcess(c, "announced", 1)
	<-hooks.blocked
	kagzi.AnnounceRunsInProcess(c, "announced", 10)
	close(hooks.released)
	// Then one claim serves the ten (each alone would call for a claim: ten, all but
	// the first finding nothing). Wait until the worker stops claiming.
	last, still := hooks.claims.Load(), time.Now()
	for time.Since(still) < 500*time.Millisecond {
		time.Sleep(20 * time.Millisecond)
		if n := hooks.claims.Load(); n != last {
			last, still = n, time.Now()
		}
	}
	if n := last - before; n != 2 {
		t.Fatalf("%d claims for an announcement and ten announced while it was claiming; want 2", n)
	}
}
