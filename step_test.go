package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/kagzitest"
)

// counter counts step body executions by name.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func newCounter() *counter { return &counter{n: map[string]int{}} }

func (c *counter) inc(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[name]++
}

func (c *counter) get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

func TestReplayAfterSleepDoesNotRerunCompletedSteps(t *testing.T) {
	t.Parallel()
	calls := newCounter()
	var executions atomic.Int32
	wf := kagzi.Define("replay", func(ctx *kagzi.Context, in int) (int, error) {
		executions.Add(1)
		a, err := kagzi.Step(ctx, "a", func(context.Context) (int, error) { calls.inc("a"); return in + 1, nil })
		if err != nil {
			return 0, err
		}
		if err := ctx.Sleep("nap", 30*24*time.Hour); err != nil { // a durable sleep: the run is released
			return 0, err
		}
		b, err := kagzi.Step(ctx, "b", func(context.Context) (int, error) { calls.inc("b"); return a * 10, nil })
		return b, err
	})
	env := kagzitest.New(t, wf) // its clock moves the month in milliseconds
	out, err := kagzitest.Run(env, wf, 1)
	if err != nil || out != 20 {
		t.Fatalf("got %d, %v; want 20", out, err)
	}
	if calls.get("a") != 1 || calls.get("b") != 1 {
		t.Fatalf("step bodies ran a=%d b=%d times, want once each", calls.get("a"), calls.get("b"))
	}
	if executions.Load() != 2 {
		t.Fatalf("the workflow function ran %d times, want 2 (before and after the sleep)", executions.Load())
	}
}

func TestRepeatedStepNamesInALoopGetOccurrenceNumberedKeys(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	calls := newCounter()
	wf := kagzi.Define("loop", func(ctx *kagzi.Context, n int) ([]int, error) {
		var outs []int
		for i := range n {
			v, err := kagzi.Step(ctx, "send", func(context.Context) (int, error) { calls.inc("send"); return i * i, nil })
			if err != nil {
				return nil, err
			}
			outs = append(outs, v)
			if i == 1 {
				if err := ctx.Sleep("between", 300*time.Millisecond); err != nil {
					return nil, err
				}
			}
		}
		return outs, nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 3)
	if err != nil {
		t.Fatal(err)
	}
	out, err := run.Wait(ctx)
	if err != nil || fmt.Sprint(out) != "[0 1 4]" {
		t.Fatalf("got %v, %v", out, err)
	}
	if calls.get("send") != 3 {
		t.Fatalf("send ran %d times across a replay, want 3", calls.get("send"))
	}
	steps, err := e.client.ListSteps(ctx, run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, s := range steps {
		keys = append(keys, s.Key)
	}
	if fmt.Sprint(keys) != "[send#1 send#2 between#1 send#3]" {
		t.Fatalf("step keys %v, want [send#1 send#2 between#1 send#3]", keys)
	}
	// A first attempt that completes has no history row of its own; ListSteps still
	// reports it, with its times.
	if steps[1].Kind != kagzi.KindStep || string(steps[1].Output) != "1" || len(steps[1].Attempts) != 1 ||
		steps[1].Attempts[0].Status != kagzi.StepCompleted || steps[1].Attempts[0].Number != 1 ||
		steps[1].Attempts[0].StartedAt.IsZero() || steps[1].Attempts[0].FinishedAt.Before(steps[1].Attempts[0].StartedAt) {
		t.Fatalf("send#2 recorded as %+v", steps[1])
	}
	if steps[2].Kind != kagzi.KindSleep || steps[2].WakeAt == nil {
		t.Fatalf("between#1 recorded as %+v", steps[2])
	}
}

func TestFailedStepIsRecordedAndReturnsAStepErrorWithItsDetail(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("declined", func(ctx *kagzi.Context, _ int) (string, error) {
		_, err := kagzi.Step(ctx, "charge", func(context.Context) (string, error) {
			return "", &kagzi.Error{Code: "card_declined", Message: "card declined"}
		}, kagzi.WithRetry(kagzi.NoRetry()))
		var se *kagzi.StepError
		if !errors.As(err, &se) || kagzi.ErrorCode(err) != "card_declined" || se.Attempts != 1 {
			return "", fmt.Errorf("step returned %v, want a *StepError with code card_declined", err)
		}
		return "handled: " + se.Detail.Message, nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != "handled: card declined" {
		t.Fatalf("got %q, %v", out, err)
	}
	steps, err := e.client.ListSteps(ctx, run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 1 || steps[0].Status != kagzi.StepFailed || len(steps[0].Attempts) != 1 {
		t.Fatalf("steps %+v, want one FAILED step with one attempt", steps)
	}
	a := steps[0].Attempts[0]
	if a.Status != kagzi.StepFailed || a.Error == nil || a.Error.Message != "card declined" ||
		a.Error.Code != "card_declined" || a.Error.Subject != "charge#1" || a.FinishedAt.Before(a.StartedAt) {
		t.Fatalf("attempt %+v (error %+v)", a, a.Error)
	}
}

func TestPanickingWorkflowFailsWithItsStackAndTheWorkerSurvives(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("panics", func(ctx *kagzi.Context, n int) (int, error) {
		if n == 0 {
			panic("nil order")
		}
		return n, nil
	}, kagzi.WithWorkflowRetry(kagzi.NoRetry()))
	runWorker(t, e.client, fastWorker(), wf)
	bad, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = bad.Wait(ctx)
	var we *kagzi.WorkflowError
	if !errors.As(err, &we) || we.Detail.Code != kagzi.CodePanic || we.Detail.Metadata["stack"] == "" {
		t.Fatalf("got %v, want a PANIC failure with a stack", err)
	}
	good, err := kagzi.Start(ctx, e.client, wf, 5)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := good.Wait(ctx); err != nil || out != 5 {
		t.Fatalf("after a panic the worker ran the next run with %d, %v", out, err)
	}
}

func TestContextCarriesTheRunsIdentity(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("who", func(ctx *kagzi.Context, _ int) ([]string, error) {
		ctx.Logger().Info("inside")
		return []string{ctx.RunID(), ctx.WorkflowID(), ctx.WorkflowType(), fmt.Sprint(ctx.Attempt())}, nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0, kagzi.WithID("me"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := run.Wait(ctx)
	if err != nil || fmt.Sprint(out) != fmt.Sprint([]string{run.RunID, "me", "who", "1"}) {
		t.Fatalf("got %v, %v", out, err)
	}
}

func TestShortSleepWaitsInProcessAndKeepsTheRunRunning(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	sleeping := make(chan struct{})
	wf := kagzi.Define("short-nap", func(ctx *kagzi.Context, _ int) (int, error) {
		close(sleeping)
		if err := ctx.Sleep("blink", 400*time.Millisecond); err != nil {
			return 0, err
		}
		return 1, nil
	})
	cfg := fastWorker()
	cfg.MaxInProcessSleep = time.Second
	runWorker(t, e.client, cfg, wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	<-sleeping
	time.Sleep(150 * time.Millisecond)
	if s := runStatus(t, e.client, run.RunID); s != kagzi.StatusRunning {
		t.Fatalf("status %s during an in-process sleep, want RUNNING", s)
	}
	if _, err := run.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestLongSleepReleasesTheSlotForOtherRuns(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	sleeper := kagzi.Define("sleeper", func(ctx *kagzi.Context, _ int) (string, error) {
		if err := ctx.Sleep("long", 3*time.Second); err != nil {
			return "", err
		}
		return "woke", nil
	})
	cfg := fastWorker()
	cfg.MaxConcurrent = 1
	runWorker(t, e.client, cfg, sleeper, greet)
	sleeping, err := kagzi.Start(ctx, e.client, sleeper, 0)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the sleeper to release its run", func() bool {
		return runStatus(t, e.client, sleeping.RunID) == kagzi.StatusSleeping
	})
	other, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: "meanwhile"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if s := runStatus(t, e.client, sleeping.RunID); s != kagzi.StatusSleeping {
		t.Fatalf("the other run finished on the only slot while the sleeper is %s, want SLEEPING", s)
	}
	if out, err := sleeping.Wait(ctx); err != nil || out != "woke" {
		t.Fatalf("sleeper: %q, %v", out, err)
	}
}

func TestDurableSleepSurvivesAWorkerRestartWithoutRestartingItsClock(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var afterSleep atomic.Int32
	wf := kagzi.Define("durable-nap", func(ctx *kagzi.Context, _ int) (time.Time, error) {
		if err := ctx.Sleep("nap", 1500*time.Millisecond); err != nil {
			return time.Time{}, err
		}
		afterSleep.Add(1)
		return kagzi.Step(ctx, "woke-at", func(context.Context) (time.Time, error) { return time.Now(), nil })
	})
	stopFirst := runWorker(t, e.client, fastWorker(), wf)
	started := time.Now()
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the run to sleep", func() bool { return runStatus(t, e.client, run.RunID) == kagzi.StatusSleeping })
	steps, err := e.client.ListSteps(ctx, run.RunID)
	if err != nil || len(steps) != 1 || steps[0].WakeAt == nil {
		t.Fatalf("steps %+v, %v: want the recorded sleep", steps, err)
	}
	wakeAt := *steps[0].WakeAt
	stopFirst()
	time.Sleep(300 * time.Millisecond)
	runWorker(t, e.client, fastWorker(), wf)
	woke, err := run.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if woke.Before(wakeAt) || woke.Before(started.Add(1500*time.Millisecond)) {
		t.Fatalf("woke at %v, before the recorded wake time %v", woke, wakeAt)
	}
	steps, err = e.client.ListSteps(ctx, run.RunID)
	if err != nil || !steps[0].WakeAt.Equal(wakeAt) {
		t.Fatalf("the wake time moved to %v from %v", steps[0].WakeAt, wakeAt)
	}
	if afterSleep.Load() != 1 {
		t.Fatalf("code after the sleep ran %d times, want 1", afterSleep.Load())
	}
}

func TestReplayAfterTheWakeTimeDoesNotSleepAgain(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var executions atomic.Int32
	wf := kagzi.Define("no-double-nap", func(ctx *kagzi.Context, _ int) (int, error) {
		executions.Add(1)
		if err := ctx.Sleep("nap", 2*time.Second); err != nil {
			return 0, err
		}
		return int(executions.Load()), nil
	})
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	stop := runWorker(t, e.client, fastWorker(), wf)
	eventually(t, "the run to sleep", func() bool { return runStatus(t, e.client, run.RunID) == kagzi.StatusSleeping })
	stop()
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(info.AvailableAt) + 200*time.Millisecond) // past the wake time, no worker
	began := time.Now()
	runWorker(t, e.client, fastWorker(), wf)
	if out, err := run.Wait(ctx); err != nil || out != 2 {
		t.Fatalf("got %d, %v; want 2 executions", out, err)
	}
	// Sleeping again would take another 2s.
	if d := time.Since(began); d >= 2*time.Second {
		t.Fatalf("resuming past the wake time took %v: the sleep ran again", d)
	}
}

func TestALastStepIsRecordedByTheSameWriteThatEndsTheRun(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	workerPool, rt := tracedPool(t, e.url)
	wf := kagzi.Define("one-step", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Step(ctx, "double", func(context.Context) (int, error) { return n * 2, nil })
	})
	runWorker(t, newClient(t, workerPool, ""), fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 21)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != 42 {
		t.Fatalf("got %d, %v", out, err)
	}
	if n := rt.count("INSERT INTO kagzi.steps"); n != 1 {
		t.Fatalf("%d statements wrote steps, want 1", n)
	}
	if n := rt.count("ELSE i.status END"); n != 1 {
		t.Fatalf("%d run-ending statements, want 1", n)
	}
	steps, err := e.client.ListSteps(ctx, run.RunID)
	if err != nil || len(steps) != 1 || string(steps[0].Output) != "42" || len(steps[0].Attempts) != 1 {
		t.Fatalf("steps %+v, %v; want double#1 recorded with its output and one attempt", steps, err)
	}
}

func TestAStepsOutputIsDurableBeforeTheNextStepRuns(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var recordedBeforeSecond atomic.Int32
	wf := kagzi.Define("two-steps", func(ctx *kagzi.Context, _ int) (int, error) {
		a, err := kagzi.Step(ctx, "first", func(context.Context) (int, error) { return 1, nil })
		if err != nil {
			return 0, err
		}
		return kagzi.Step(ctx, "second", func(c context.Context) (int, error) {
			var n int
			err := e.pool.QueryRow(c, `SELECT count(*) FROM kagzi.steps WHERE step_key = 'first#1' AND output = '1'`).Scan(&n)
			recordedBeforeSecond.Store(int32(n))
			return a + 1, err
		})
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != 2 {
		t.Fatalf("got %d, %v", out, err)
	}
	if recordedBeforeSecond.Load() != 1 {
		t.Fatal("the second step's body ran before the first step's output was recorded")
	}
}

func TestAShutdownRecordsTheLastCompletedStepBeforeHandingTheRunBack(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var calls atomic.Int32
	var waited atomic.Bool
	reached := make(chan struct{}, 1)
	wf := kagzi.Define("step-then-wait", func(ctx *kagzi.Context, _ int) (int, error) {
		v, err := kagzi.Step(ctx, "once", func(context.Context) (int, error) { return int(calls.Add(1)), nil })
		if err != nil {
			return 0, err
		}
		if waited.CompareAndSwap(false, true) { // the first execution waits, outside any step, for the shutdown
			reached <- struct{}{}
			<-ctx.Done()
			return 0, ctx.Err()
		}
		return v, nil
	})
	stop := runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	<-reached
	stop()
	if s := runStatus(t, e.client, run.RunID); s != kagzi.StatusPending {
		t.Fatalf("status %s, want the run handed back PENDING", s)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.steps WHERE step_key = 'once#1' AND status = 'COMPLETED'`); n != 1 {
		t.Fatal("the completed step was not recorded before the run was handed back")
	}
	runWorker(t, e.client, fastWorker(), wf)
	if out, err := run.Wait(ctx); err != nil || out != 1 {
		t.Fatalf("got %d, %v", out, err)
	}
	if calls.Load() != 1 {
		t.Fatalf("the step ran %d times, want once: its output was recorded before the hand-back", calls.Load())
	}
}

func TestAHeldBackStepIsWrittenSoonWhenTheWorkflowGoesOnWithoutWriting(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	release := make(chan struct{})
	wf := kagzi.Define("step-then-compute", func(ctx *kagzi.Context, _ int) (int, error) {
		v, err := kagzi.Step(ctx, "first", func(context.Context) (int, error) { return 1, nil })
		if err != nil {
			return 0, err
		}
		<-release // long work in the workflow itself, no write
		return v, nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the step held back to be written while the workflow still runs", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.steps WHERE step_key = 'first#1' AND status = 'COMPLETED'`) == 1
	})
	if s := runStatus(t, e.client, run.RunID); s != kagzi.StatusRunning {
		t.Fatalf("run %s, want it still RUNNING while its step is already recorded", s)
	}
	close(release)
	if out, err := run.Wait(ctx); err != nil || out != 1 {
		t.Fatalf("got %d, %v", out, err)
	}
}
