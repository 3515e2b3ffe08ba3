package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

// runtime.Goexit is what testing's FailNow and SkipNow call: a step body or workflow
// that calls it fails at once, as a panic does, instead of leaving the run to be taken
// over after its lease, again and again, until MaxTakeovers.
func TestABodyThatCallsGoexitFailsAtOnceAsAPanicDoesAndIsNotRunAgain(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var calls [5]atomic.Int32
	// A lease of a minute: a run unwound as though its lease were lost would not be
	// taken over within the test.
	cfg := fastWorker()
	cfg.LeaseDuration, cfg.HeartbeatInterval = time.Minute, 20*time.Second
	// No retries of the runs either: each body runs once.
	once := kagzi.WithWorkflowRetry(kagzi.NoRetry())
	withTimeout := kagzi.Define("goexit-step-timeout", func(ctx *kagzi.Context, _ int) (int, error) {
		return kagzi.Step(ctx, "fail-now", func(context.Context) (int, error) {
			calls[1].Add(1)
			runtime.Goexit()
			return 0, nil
		}, kagzi.WithRetry(kagzi.NoRetry()), kagzi.WithStepTimeout(time.Minute))
	}, once)
	wfs := []kagzi.Definition{
		kagzi.Define("goexit-step", func(ctx *kagzi.Context, _ int) (int, error) {
			return kagzi.Step(ctx, "fail-now", func(context.Context) (int, error) {
				calls[0].Add(1)
				runtime.Goexit()
				return 0, nil
			}, kagzi.WithRetry(kagzi.NoRetry()))
		}, once),
		withTimeout,
		kagzi.Define("goexit-workflow", func(ctx *kagzi.Context, _ int) (int, error) {
			calls[2].Add(1)
			runtime.Goexit()
			return 0, nil
		}, once),
		kagzi.Define("goexit-branch", func(ctx *kagzi.Context, _ int) (int, error) {
			f := kagzi.Go(ctx, "branch", func(ctx *kagzi.Context) (int, error) {
				calls[3].Add(1)
				runtime.Goexit()
				return 0, nil
			})
			if _, err := f.Get(); err != nil {
				return 0, kagzi.NonRetryable(err)
			}
			return 1, nil
		}, once),
		kagzi.Define("goexit-racer", func(ctx *kagzi.Context, _ int) (int, error) {
			return kagzi.Race(ctx, "race", []func(context.Context) (int, error){func(context.Context) (int, error) {
				calls[4].Add(1)
				runtime.Goexit()
				return 0, nil
			}}, kagzi.WithRetry(kagzi.NoRetry()))
		}, once),
	}
	runWorker(t, e.client, cfg, wfs...)
	for i, wf := range wfs {
		run, err := e.client.StartByName(ctx, wf.Name(), 0)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		_, err = kagzi.RunOf[int](e.client, run.RunID).Wait(wctx)
		cancel()
		var we *kagzi.WorkflowError
		if !errors.As(err, &we) || we.Detail.Code != kagzi.CodePanic || !strings.Contains(we.Detail.Message, "Goexit") {
			t.Fatalf("%s: %v, want a PANIC failure naming runtime.Goexit", wf.Name(), err)
		}
		if n := calls[i].Load(); n != 1 {
			t.Fatalf("%s: the body ran %d times, want once", wf.Name(), n)
		}
	}
	// The step's attempt is recorded as failed when the body ran on a goroutine of its
	// own (a step timeout), as a panic's is.
	run, err := kagzi.Start(ctx, e.client, withTimeout, 0, kagzi.WithID("again"))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = run.Wait(ctx)
	steps := stepsOf(t, e.client, run.RunID)
	if len(steps) != 1 || steps[0].Status != kagzi.StepFailed || steps[0].Attempts[0].Error.Code != kagzi.CodePanic {
		t.Fatalf("steps %+v, want one failed step whose attempt is a PANIC", steps)
	}
}

// A deferred call of the workflow that panics while runtime.Goexit unwinds the
// function (its own Goexit, or Sleep's) is recovered by the engine, and the Goexit
// goes on ending the goroutine: the execution still ends (its run fails as a panic
// does), and the worker's slot is freed for the next run.
func TestAWorkflowWhoseDeferredCallPanicsWhileGoexitUnwindsItStillEndsAndFreesItsSlot(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	cfg := fastWorker()
	cfg.MaxConcurrent = 1 // a slot not freed would stall the next run
	once := kagzi.WithWorkflowRetry(kagzi.NoRetry())
	wfs := []kagzi.Definition{
		kagzi.Define("goexit-defer-panics", func(ctx *kagzi.Context, _ int) (int, error) {
			defer func() { panic("a deferred call panicked") }()
			runtime.Goexit()
			return 0, nil
		}, once),
		kagzi.Define("sleep-defer-panics", func(ctx *kagzi.Context, _ int) (int, error) {
			defer func() { panic("a deferred call panicked") }()
			// Longer than MaxInProcessSleep: Sleep unwinds the function.
			if err := ctx.Sleep("nap", 300*time.Millisecond); err != nil {
				return 0, err
			}
			return 1, nil
		}, once),
	}
	runWorker(t, e.client, cfg, wfs...)
	for round := range 2 {
		for _, wf := range wfs {
			run, err := e.client.StartByName(ctx, wf.Name(), 0, kagzi.WithID(fmt.Sprintf("%s-%d", wf.Name(), round)))
			if err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, err = kagzi.RunOf[int](e.client, run.RunID).Wait(wctx)
			cancel()
			var we *kagzi.WorkflowError
			if !errors.As(err, &we) || we.Detail.Code != kagzi.CodePanic {
				t.Fatalf("%s, round %d: %v, want a PANIC failure", wf.Name(), round, err)
			}
		}
	}
}

func TestADurableCallWithAContextKeptAfterItsWorkflowReturnedIsRefused(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	kept := make(chan *kagzi.Context, 1)
	wf := kagzi.Define("keeps-context", func(ctx *kagzi.Context, _ int) (int, error) {
		kept <- ctx
		return 1, nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	saved := <-kept
	done := make(chan error, 1)
	go func() {
		_, err := kagzi.Step(saved, "late", func(context.Context) (int, error) { return 1, nil })
		done <- err
	}()
	select {
	case err := <-done:
		mustErrorIs(t, err, kagzi.ErrInvalidArgument)
	case <-time.After(10 * time.Second):
		t.Fatal("Step with a kept Context did not return (its goroutine was unwound)")
	}
	if n := len(stepsOf(t, e.client, run.RunID)); n != 0 {
		t.Fatalf("%d steps recorded, want none", n)
	}
}
