package kagzitest_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/kagzitest"
)

// fatalRecorder stands in for the test as an Env's T, to assert on how the Env fails
// a test: it records the first Fatalf instead of ending the test, and passes the rest
// to the real test.
type fatalRecorder struct {
	testing.TB
	fatal string
}

func (r *fatalRecorder) Fatalf(format string, a ...any) {
	if r.fatal == "" {
		r.fatal = fmt.Sprintf(format, a...)
	}
}

// clockMoved returns how far the Env's clock is ahead of the real one: a timer set
// for d from now moves it by d less the real time that passed meanwhile.
func clockMoved(env *kagzitest.Env) time.Duration { return env.Now().Sub(time.Now()) }

var continued = kagzi.Define("continued", func(ctx *kagzi.Context, n int) (int, error) {
	if n == 0 {
		return 0, kagzi.ContinueAsNew(ctx, 1)
	}
	if err := ctx.Sleep("nap", 24*time.Hour); err != nil {
		return 0, err
	}
	return n, nil
})

func TestWaitSkipsTimeInTheRunThatARunContinuedAs(t *testing.T) {
	t.Parallel()
	env := kagzitest.NewWithOptions(t, kagzitest.Options{Timeout: 8 * time.Second}, continued)
	out, err := kagzitest.Run(env, continued, 0)
	if err != nil || out != 1 {
		t.Fatalf("got %d, %v", out, err)
	}
	if moved := clockMoved(env); moved < 24*time.Hour-time.Minute {
		t.Fatalf("the clock moved %v, want the continued run's 24h nap", moved)
	}
}

var continuedWaiter = kagzi.Define("continued-waiter", func(ctx *kagzi.Context, n int) (string, error) {
	if n == 0 {
		return "", kagzi.ContinueAsNew(ctx, 1)
	}
	return kagzi.WaitSignal[string](ctx, "go-ahead", 0)
})

func TestWaitFailsTheTestWhenTheRunThatARunContinuedAsDoesNotEnd(t *testing.T) {
	t.Parallel()
	env := kagzitest.NewWithOptions(t, kagzitest.Options{Timeout: 2 * time.Second}, continuedWaiter)
	rec := &fatalRecorder{TB: t}
	env.T = rec
	run := kagzitest.Start(env, continuedWaiter, 0)
	if _, err := kagzitest.Wait(env, run); err == nil {
		t.Fatal("Wait returned no error for a run that did not end")
	}
	for _, want := range []string{"run " + run.RunID, "continued as run", "is still SLEEPING after 2s",
		"it waits for a signal (step go-ahead#1) that nobody sent"} {
		if !strings.Contains(rec.fatal, want) {
			t.Errorf("the test failed with %q, want it to say %q", rec.fatal, want)
		}
	}
}

var waiter = kagzi.Define("waiter", func(ctx *kagzi.Context, _ int) (string, error) {
	return kagzi.WaitSignal[string](ctx, "go-ahead", 0)
})

func TestWaitTellsWhatARunThatDoesNotEndWaitsFor(t *testing.T) {
	t.Parallel()
	env := kagzitest.NewWithOptions(t, kagzitest.Options{Timeout: time.Second}, waiter)
	rec := &fatalRecorder{TB: t}
	env.T = rec
	if _, err := kagzitest.Run(env, waiter, 0); err == nil {
		t.Fatal("Run returned no error for a run that did not end")
	}
	want := "is still SLEEPING after 1s; it waits for a signal (step go-ahead#1) that nobody sent"
	if !strings.Contains(rec.fatal, want) {
		t.Fatalf("the test failed with %q, want it to say %q", rec.fatal, want)
	}
}

var parentOfWaiter = kagzi.Define("parent-of-waiter", func(ctx *kagzi.Context, _ int) (string, error) {
	child, err := kagzi.StartChild(ctx, "child", waiter, 0)
	if err != nil {
		return "", err
	}
	return child.Get()
})

func TestWaitTellsWhatTheChildARunWaitsForWaitsFor(t *testing.T) {
	t.Parallel()
	env := kagzitest.NewWithOptions(t, kagzitest.Options{Timeout: time.Second}, parentOfWaiter, waiter)
	rec := &fatalRecorder{TB: t}
	env.T = rec
	if _, err := kagzitest.Run(env, parentOfWaiter, 0); err == nil {
		t.Fatal("Run returned no error for a run that did not end")
	}
	for _, want := range []string{"it waits for its child run", "(waiter), SLEEPING",
		"it waits for a signal (step go-ahead#1) that nobody sent"} {
		if !strings.Contains(rec.fatal, want) {
			t.Errorf("the test failed with %q, want it to say %q", rec.fatal, want)
		}
	}
}

func TestWaitTellsWhatHoldsBackARunThatDoesNotStart(t *testing.T) {
	t.Parallel()
	env := kagzitest.NewWithOptions(t, kagzitest.Options{Timeout: time.Second}, waiter)
	if _, err := env.Client.SetLimits(context.Background(), kagzi.Limits{WorkflowType: "waiter", KeyConcurrency: 1}); err != nil {
		t.Fatal(err)
	}
	kagzitest.Start(env, waiter, 1, kagzi.WithConcurrencyKey("k")) // holds the key, waiting for ever
	held := kagzitest.Start(env, waiter, 2, kagzi.WithConcurrencyKey("k"))
	rec := &fatalRecorder{TB: t}
	env.T = rec
	if _, err := kagzitest.Wait(env, held); err == nil {
		t.Fatal("Wait returned no error for a run that did not end")
	}
	want := "is still PENDING after 1s; it is held by the key-concurrency limit until a run that holds a place stops"
	if !strings.Contains(rec.fatal, want) {
		t.Fatalf("the test failed with %q, want it to say %q", rec.fatal, want)
	}
}

var napper = kagzi.Define("napper", func(ctx *kagzi.Context, n int) (int, error) {
	return n, ctx.Sleep("nap", 2*time.Hour)
})

func TestARunHeldByItsKeysConcurrencyLimitRunsWhenTheHolderEnds(t *testing.T) {
	t.Parallel()
	env := kagzitest.NewWithOptions(t, kagzitest.Options{Timeout: 8 * time.Second}, napper)
	if _, err := env.Client.SetLimits(context.Background(), kagzi.Limits{WorkflowType: "napper", KeyConcurrency: 1}); err != nil {
		t.Fatal(err)
	}
	first := kagzitest.Start(env, napper, 1, kagzi.WithConcurrencyKey("customer-1"))
	second := kagzitest.Start(env, napper, 2, kagzi.WithConcurrencyKey("customer-1"))
	if out, err := kagzitest.Wait(env, second); err != nil || out != 2 {
		t.Fatalf("second: got %d, %v", out, err)
	}
	if out, err := kagzitest.Wait(env, first); err != nil || out != 1 {
		t.Fatalf("first: got %d, %v", out, err)
	}
	// One run of the key at a time: the two naps passed one after the other.
	if moved := clockMoved(env); moved < 4*time.Hour-time.Minute {
		t.Fatalf("the clock moved %v, want the two 2h naps in turn", moved)
	}
}

var ping = kagzi.Define("ping", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })

func TestARunHeldByARateLimitRunsWhenTheWindowPassesOnTheEnvsClock(t *testing.T) {
	t.Parallel()
	for name, limits := range map[string]kagzi.Limits{
		"rate":     {WorkflowType: "ping", Rate: 1, RatePeriod: time.Hour},
		"key-rate": {WorkflowType: "ping", KeyRate: 1, KeyRatePeriod: time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := kagzitest.NewWithOptions(t, kagzitest.Options{Timeout: 8 * time.Second}, ping)
			if _, err := env.Client.SetLimits(context.Background(), limits); err != nil {
				t.Fatal(err)
			}
			first := kagzitest.Start(env, ping, 1, kagzi.WithConcurrencyKey("k"))
			second := kagzitest.Start(env, ping, 2, kagzi.WithConcurrencyKey("k"))
			for i, run := range []*kagzi.Run[int]{first, second} {
				if out, err := kagzitest.Wait(env, run); err != nil || out != i+1 {
					t.Fatalf("run %d: got %d, %v", i+1, out, err)
				}
			}
			// One start an hour: the second waited for the window on the Env's clock.
			if moved := clockMoved(env); moved < time.Hour-time.Minute {
				t.Fatalf("the clock moved %v, want the hour of the rate window", moved)
			}
		})
	}
}

var totals = kagzi.Define("totals", func(ctx *kagzi.Context, _ int) (int, error) {
	for _, name := range []string{"total=sum", "a*b", "count"} {
		if _, err := kagzi.Step(ctx, name, func(context.Context) (int, error) { return 1, nil }); err != nil {
			return 0, err
		}
	}
	return 3, nil
})

func TestAssertStepsReadsStepNamesWithEqualsSignsAndStars(t *testing.T) {
	t.Parallel()
	env := kagzitest.New(t, totals)
	run := kagzitest.Start(env, totals, 0)
	if _, err := kagzitest.Wait(env, run); err != nil {
		t.Fatal(err)
	}
	env.AssertSteps(run.RunID, env.StepKeys(run.RunID)...)
	env.AssertSteps(run.RunID, "total=sum#1", "a*b#1", "count#1")
	env.AssertSteps(run.RunID, "total=sum#1=COMPLETED", "a*b#1*1", "count#1=COMPLETED*1")

	rec := &fatalRecorder{TB: t}
	env.T = rec
	env.AssertSteps(run.RunID, "total=sum#1=FAILED*1", "a*b#1", "count#1")
	if !strings.Contains(rec.fatal, `"total=sum#1=COMPLETED*1" "a*b#1" "count#1"`) {
		t.Fatalf("AssertSteps of a wrong status failed the test with %q", rec.fatal)
	}
}

func TestACrashAtAStepWithAShortTimeoutRecordsNoAttempt(t *testing.T) {
	t.Parallel()
	for _, timeout := range []time.Duration{time.Millisecond, 20 * time.Millisecond} {
		t.Run(timeout.String(), func(t *testing.T) {
			t.Parallel()
			quick := kagzi.Define("quick", func(ctx *kagzi.Context, _ int) (string, error) {
				return kagzi.Step(ctx, "call", func(context.Context) (string, error) { return "answered", nil },
					kagzi.WithStepTimeout(timeout))
			})
			env := kagzitest.New(t, quick)
			env.CrashAt("call")
			run := kagzitest.Start(env, quick, 0)
			if out, err := kagzitest.Wait(env, run); err != nil || out != "answered" {
				t.Fatalf("got %q, %v", out, err)
			}
			if env.Restarts() != 1 || env.Calls("call") != 2 {
				t.Fatalf("%d restarts, %d calls; want 1 and 2", env.Restarts(), env.Calls("call"))
			}
			// The interrupted attempt is not recorded, and no backoff passed.
			env.AssertSteps(run.RunID, "call#1=COMPLETED*1")
		})
	}
}

var pipe = kagzi.Define("pipe", func(ctx *kagzi.Context, _ int) (string, error) {
	a, err := kagzi.Step(ctx, "a", func(context.Context) (string, error) { return "A", nil })
	if err != nil {
		return "", err
	}
	b, err := kagzi.Step(ctx, "b", func(context.Context) (string, error) { return "B", nil })
	return a + b, err
})

func TestACrashAtAStepIsImmediateWhateverTheWorkersDrainTimeout(t *testing.T) {
	t.Parallel()
	// A DrainTimeout copied from production: the crash must not wait it out.
	env := kagzitest.NewWithOptions(t, kagzitest.Options{Timeout: 10 * time.Second,
		Worker: kagzi.WorkerConfig{DrainTimeout: 20 * time.Second}}, pipe)
	env.CrashAt("a")
	run := kagzitest.Start(env, pipe, 0)
	if out, err := kagzitest.Wait(env, run); err != nil || out != "AB" {
		t.Fatalf("got %q, %v", out, err)
	}
	if env.Restarts() != 1 || env.Calls("a") != 2 {
		t.Fatalf("%d restarts, %d calls of a; want 1 and 2", env.Restarts(), env.Calls("a"))
	}
	env.AssertSteps(run.RunID, "a#1=COMPLETED*1", "b#1=COMPLETED*1")
}

func TestRestartStopsTheWorkersRunsAtOnceWhateverItsDrainTimeout(t *testing.T) {
	t.Parallel()
	env := kagzitest.NewWithOptions(t, kagzitest.Options{Timeout: 10 * time.Second,
		Worker: kagzi.WorkerConfig{DrainTimeout: 20 * time.Second}}, pipe)
	began := make(chan struct{})
	var calls atomic.Int32
	env.StubStep("a", func(ctx context.Context, _ int) (any, error) {
		if calls.Add(1) == 1 { // a long step that heeds its context, on the first worker
			close(began)
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return "resumed", nil
	})
	run := kagzitest.Start(env, pipe, 0)
	select {
	case <-began:
	case <-time.After(10 * time.Second):
		t.Fatal("step a did not begin")
	}
	restarted := time.Now()
	env.Restart()
	// A crash: the step is interrupted at once, not after the 20s drain.
	if took := time.Since(restarted); took > 5*time.Second {
		t.Fatalf("Restart took %v: the worker drained instead of crashing", took)
	}
	if out, err := kagzitest.Wait(env, run); err != nil || out != "resumedB" {
		t.Fatalf("got %q, %v", out, err)
	}
	if env.Restarts() != 1 || calls.Load() != 2 {
		t.Fatalf("%d restarts, %d calls of a; want 1 and 2", env.Restarts(), calls.Load())
	}
	// The interrupted attempt is not recorded.
	env.AssertSteps(run.RunID, "a#1=COMPLETED*1", "b#1=COMPLETED*1")
}

var debounced = kagzi.Define("debounced", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })

func TestAdvanceMovesADebouncesMaximumWait(t *testing.T) {
	t.Parallel()
	env := kagzitest.NewWithOptions(t, kagzitest.Options{Timeout: 8 * time.Second}, debounced)
	// A window of 1h, at most 90m after the first start.
	first := kagzitest.Start(env, debounced, 1, kagzi.WithDebounce("k", time.Hour, 90*time.Minute))
	env.Advance(50 * time.Minute)
	// Within the window: the same run, pushed to 1h from now, but no later than 90m
	// after the first start, which is 40m from now on the Env's clock.
	second := kagzitest.Start(env, debounced, 2, kagzi.WithDebounce("k", time.Hour, 90*time.Minute))
	if second.RunID != first.RunID {
		t.Fatalf("the second start made run %s, want the first's, %s", second.RunID, first.RunID)
	}
	if out, err := kagzitest.Wait(env, second); err != nil || out != 2 {
		t.Fatalf("got %d, %v", out, err)
	}
	if moved := clockMoved(env); moved < 90*time.Minute-time.Minute || moved > 90*time.Minute+time.Minute {
		t.Fatalf("the run started %v after the first start, want the 90m maximum wait", moved)
	}
}
