package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/kagzitest"
)

func TestExponentialBackoffDelaysGrowAndCap(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	fn, calls := failingStep(4, errors.New("flaky"))
	policy := kagzi.Exponential(5).Initial(100 * time.Millisecond).Backoff(2).Max(250 * time.Millisecond).Jitter(0)
	wf := kagzi.Define("backoff", func(ctx *kagzi.Context, _ int) (string, error) {
		return kagzi.Step(ctx, "flaky", fn, kagzi.WithRetry(policy))
	})
	cfg := fastWorker()
	cfg.MaxInProcessSleep = time.Second // the waits stay in process
	// A lease longer than the waits with room to spare: on a loaded box a late beat of
	// fastWorker's 1 s lease let another claim take the run over, and its step ran a
	// sixth time (a takeover, not a retry: what this test counts is the policy's).
	cfg.LeaseDuration = 10 * time.Second
	runWorker(t, e.client, cfg, wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != "ok" {
		t.Fatalf("got %q, %v", out, err)
	}
	if calls.Load() != 5 {
		t.Fatalf("%d attempts, want 5", calls.Load())
	}
	steps := stepsOf(t, e.client, run.RunID)
	a := steps[0].Attempts
	if len(a) != 5 || steps[0].Status != kagzi.StepCompleted {
		t.Fatalf("step %+v, want 5 recorded attempts ending COMPLETED", steps[0])
	}
	for i, at := range a {
		want := kagzi.StepFailed
		if i == 4 {
			want = kagzi.StepCompleted
		}
		if at.Number != i+1 || at.Status != want {
			t.Fatalf("attempt %d: %+v, want number %d %s", i, at, i+1, want)
		}
	}
	// Waits between attempts, from the recorded times: 100ms, 200ms, then capped at 250ms.
	var gaps []time.Duration
	for i := 1; i < len(a); i++ {
		gaps = append(gaps, a[i].StartedAt.Sub(a[i-1].FinishedAt))
	}
	for i, min := range []time.Duration{100, 200, 250, 250} {
		if gaps[i] < min*time.Millisecond {
			t.Fatalf("wait before attempt %d was %v, want at least %v (waits %v)", i+2, gaps[i], min*time.Millisecond, gaps)
		}
	}
	if gaps[3] >= 400*time.Millisecond { // uncapped it would be 800ms
		t.Fatalf("the fourth wait was %v: the 250ms cap did not hold (waits %v)", gaps[3], gaps)
	}
}

func TestNonRetryableErrorsFailTheStepAtOnce(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wrapped, wrappedCalls := failingStep(10, kagzi.NonRetryable(errors.New("bad card number")))
	coded, codedCalls := failingStep(10, &kagzi.Error{Code: "fraud", Message: "flagged"})
	wf := kagzi.Define("no-retry-kinds", func(ctx *kagzi.Context, _ int) ([]string, error) {
		policy := kagzi.Attempts(5).Initial(time.Millisecond).NonRetryable("fraud")
		_, err1 := kagzi.Step(ctx, "wrapped", wrapped, kagzi.WithRetry(policy))
		_, err2 := kagzi.Step(ctx, "coded", coded, kagzi.WithRetry(policy))
		return []string{fmt.Sprint(errors.Is(err1, kagzi.ErrNonRetryable)), kagzi.ErrorCode(err2)}, nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	out, err := run.Wait(ctx)
	if err != nil || fmt.Sprint(out) != "[true fraud]" {
		t.Fatalf("got %v, %v", out, err)
	}
	if wrappedCalls.Load() != 1 || codedCalls.Load() != 1 {
		t.Fatalf("attempts: wrapped %d, coded %d; want 1 each", wrappedCalls.Load(), codedCalls.Load())
	}
	for _, s := range stepsOf(t, e.client, run.RunID) {
		if s.Status != kagzi.StepFailed || len(s.Attempts) != 1 {
			t.Fatalf("step %+v, want FAILED after one attempt", s)
		}
	}
}

func TestForeverKeepsRetryingUntilTheStepSucceeds(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	fn, calls := failingStep(12, errors.New("still down"))
	wf := kagzi.Define("forever", func(ctx *kagzi.Context, _ int) (string, error) {
		return kagzi.Step(ctx, "call", fn, kagzi.WithRetry(kagzi.Forever().Initial(time.Millisecond).Max(5*time.Millisecond)))
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != "ok" {
		t.Fatalf("got %q, %v", out, err)
	}
	if calls.Load() != 13 || len(stepsOf(t, e.client, run.RunID)[0].Attempts) != 13 {
		t.Fatalf("%d attempts, want 13 (12 failures, then success)", calls.Load())
	}
}

func TestStepTimeoutCancelsItsContextAndIsRecordedTimedOut(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	sawCause := make(chan error, 1)
	wf := kagzi.Define("times-out", func(ctx *kagzi.Context, _ int) (string, error) {
		_, err := kagzi.Step(ctx, "slow", func(c context.Context) (string, error) {
			<-c.Done()
			sawCause <- context.Cause(c)
			return "", c.Err()
		}, kagzi.WithStepTimeout(50*time.Millisecond), kagzi.WithRetry(kagzi.NoRetry()))
		return "", err
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrDeadlineExceeded)
	if cause := <-sawCause; !errors.Is(cause, kagzi.ErrDeadlineExceeded) {
		t.Fatalf("the step's context ended with %v, want ErrDeadlineExceeded", cause)
	}
	s := stepsOf(t, e.client, run.RunID)[0]
	if s.Status != kagzi.StepFailed || s.Attempts[0].Status != kagzi.StepTimedOut || s.Attempts[0].Error.Code != kagzi.CodeDeadlineExceeded {
		t.Fatalf("step %+v (attempt %+v), want a TIMED_OUT attempt", s, s.Attempts[0])
	}
}

func TestStepIgnoringItsTimeoutIsReportedTimedOutAndItsLateResultDiscarded(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var calls atomic.Int32
	release := make(chan struct{})
	defer close(release)
	wf := kagzi.Define("ignores-timeout", func(ctx *kagzi.Context, _ int) (string, error) {
		return kagzi.Step(ctx, "stubborn", func(context.Context) (string, error) {
			if calls.Add(1) == 1 {
				<-release // ignores its context
				return "late result", nil
			}
			return "second attempt", nil
		}, kagzi.WithStepTimeout(50*time.Millisecond), kagzi.WithRetry(kagzi.Linear(2, 10*time.Millisecond)))
	})
	w, err := kagzi.NewWorker(e.client, fastWorker(), wf)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go w.Run(wctx)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != "second attempt" {
		t.Fatalf("got %q, %v; want the second attempt's output", out, err)
	}
	s := stepsOf(t, e.client, run.RunID)[0]
	if len(s.Attempts) != 2 || s.Attempts[0].Status != kagzi.StepTimedOut || string(s.Output) != `"second attempt"` {
		t.Fatalf("step %+v, want a TIMED_OUT attempt then the second attempt's output", s)
	}
	if w.AbandonedSteps() != 1 {
		t.Fatalf("AbandonedSteps = %d, want 1", w.AbandonedSteps())
	}
}

func TestPanickingStepIsARecordedFailureWithItsStack(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("step-panics", func(ctx *kagzi.Context, _ int) (string, error) {
		return kagzi.Step(ctx, "nil-map", func(context.Context) (string, error) {
			var m map[string]int
			m["x"]++
			return "", nil
		}, kagzi.WithRetry(kagzi.NoRetry()))
	})
	runWorker(t, e.client, fastWorker(), wf, greet)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	var we *kagzi.WorkflowError
	if !errors.As(err, &we) || we.Detail.Code != kagzi.CodePanic || !strings.Contains(we.Detail.Metadata["stack"], "retry_test.go") {
		t.Fatalf("got %v, want a PANIC failure whose stack names the step", err)
	}
	a := stepsOf(t, e.client, run.RunID)[0].Attempts[0]
	if a.Error.Code != kagzi.CodePanic || a.Error.Metadata["stack"] == "" {
		t.Fatalf("attempt error %+v, want PANIC with a stack", a.Error)
	}
	next, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: "after"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := next.Wait(ctx); err != nil {
		t.Fatalf("the worker did not survive the panic: %v", err)
	}
}

func TestWorkflowRetryRunsTheWholeWorkflowAgainKeepingCompletedSteps(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var stepCalls atomic.Int32
	wf := kagzi.Define("retried-run", func(ctx *kagzi.Context, _ int) (int, error) {
		if _, err := kagzi.Step(ctx, "once", func(context.Context) (int, error) { return int(stepCalls.Add(1)), nil }); err != nil {
			return 0, err
		}
		if ctx.Attempt() < 3 {
			return 0, fmt.Errorf("inventory service said no on attempt %d", ctx.Attempt())
		}
		return ctx.Attempt(), nil
	}, kagzi.WithWorkflowRetry(kagzi.Linear(3, 50*time.Millisecond)))
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != 3 {
		t.Fatalf("got %d, %v; want success on attempt 3", out, err)
	}
	if stepCalls.Load() != 1 {
		t.Fatalf("the completed step ran %d times across run attempts, want 1", stepCalls.Load())
	}
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil || info.Attempt != 3 {
		t.Fatalf("run %+v, %v; want attempt 3", info, err)
	}
}

func TestWorkflowRetryGivesUpAndTheRunFails(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var executions atomic.Int32
	wf := kagzi.Define("always-fails", func(ctx *kagzi.Context, _ int) (int, error) {
		executions.Add(1)
		return 0, errors.New("nope")
	}, kagzi.WithWorkflowRetry(kagzi.Linear(2, 10*time.Millisecond)))
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	var we *kagzi.WorkflowError
	if !errors.As(err, &we) || we.Detail.Message != "nope" || executions.Load() != 2 {
		t.Fatalf("got %v after %d executions; want FAILED with the error after 2", err, executions.Load())
	}
}

func TestAStepThatFailedForGoodFailsTheRunWithoutAWorkflowRetry(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	fn, calls := failingStep(100, errors.New("gateway down"))
	wf := kagzi.Define("step-exhausted", func(ctx *kagzi.Context, _ int) (string, error) {
		out, err := kagzi.Step(ctx, "charge", fn, kagzi.WithRetry(kagzi.Linear(2, time.Millisecond)))
		if err != nil {
			return "", fmt.Errorf("charging: %w", err)
		}
		return out, nil
	}, kagzi.WithWorkflowRetry(kagzi.Linear(5, time.Millisecond)))
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	var we *kagzi.WorkflowError
	if !errors.As(err, &we) || we.Detail.Subject != "charge#1" || we.Detail.Code != kagzi.CodeStepError {
		t.Fatalf("got %v, want the run FAILED with the step's detail", err)
	}
	if calls.Load() != 2 {
		t.Fatalf("the step ran %d times, want 2 (its own policy; no workflow retry on top)", calls.Load())
	}
}

func TestRetryAfterOverridesTheBackoffAndTheWaitingRunFreesItsSlot(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	fn, _ := failingStep(1, kagzi.RetryAfter(errors.New("rate limited"), 1500*time.Millisecond))
	limited := kagzi.Define("rate-limited", func(ctx *kagzi.Context, _ int) (string, error) {
		return kagzi.Step(ctx, "call", fn, kagzi.WithRetry(kagzi.Attempts(2).Initial(time.Millisecond)))
	})
	cfg := fastWorker()
	cfg.MaxConcurrent = 1
	runWorker(t, e.client, cfg, limited, greet)
	run, err := kagzi.Start(ctx, e.client, limited, 0)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the run to wait for its retry", func() bool {
		info, err := e.client.GetRun(ctx, run.RunID)
		return err == nil && info.Status == kagzi.StatusPending && info.StartedAt != nil
	})
	other, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: "meanwhile"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if s := runStatus(t, e.client, run.RunID); s != kagzi.StatusPending {
		t.Fatalf("the other run used the only slot while the retrying run was %s, want PENDING", s)
	}
	if out, err := run.Wait(ctx); err != nil || out != "ok" {
		t.Fatalf("got %q, %v", out, err)
	}
	a := stepsOf(t, e.client, run.RunID)[0].Attempts
	if gap := a[1].StartedAt.Sub(a[0].FinishedAt); gap < 1500*time.Millisecond {
		t.Fatalf("the retry came %v after the failure, want at least the 1.5s RetryAfter", gap)
	}
}

func TestAStepThatFailedForGoodReplaysTheSameErrorWithoutRunning(t *testing.T) {
	t.Parallel()
	fn, calls := failingStep(100, &kagzi.Error{Code: "sold_out", Message: "sold out"})
	wf := kagzi.Define("handles-failure", func(ctx *kagzi.Context, _ int) (string, error) {
		_, err := kagzi.Step(ctx, "reserve", fn, kagzi.WithRetry(kagzi.NoRetry()))
		code := kagzi.ErrorCode(err)
		if err := ctx.Sleep("nap", 24*time.Hour); err != nil { // suspends: the next line runs on a replay
			return "", err
		}
		return code, nil
	})
	env := kagzitest.New(t, wf)
	run := kagzitest.Start(env, wf, 0)
	if out, err := kagzitest.Wait(env, run); err != nil || out != "sold_out" {
		t.Fatalf("got %q, %v; want the replayed error's code", out, err)
	}
	if calls.Load() != 1 {
		t.Fatalf("the failed step ran %d times, want 1: a replay returns the recorded error", calls.Load())
	}
	env.AssertSteps(run.RunID, "reserve#1=FAILED", "nap#1=COMPLETED")
}

func TestRunDeadlineFailsASleepingRun(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("sleeps-too-long", func(ctx *kagzi.Context, _ int) (int, error) {
		if err := ctx.Sleep("forever", time.Hour); err != nil {
			return 0, err
		}
		return 1, nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	// Long enough for the run to be claimed and asleep first on a loaded box.
	run, err := kagzi.Start(ctx, e.client, wf, 0, kagzi.WithRunTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the run to sleep", func() bool { return runStatus(t, e.client, run.RunID) == kagzi.StatusSleeping })
	_, err = run.Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrDeadlineExceeded)
	var we *kagzi.WorkflowError
	if !errors.As(err, &we) || we.Detail.Code != kagzi.CodeDeadlineExceeded {
		t.Fatalf("got %v, want FAILED with DEADLINE_EXCEEDED", err)
	}
}

func TestRunDeadlineFailsARunThatNeverStarted(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	runWorker(t, e.client, fastWorker(), greet)
	run, err := kagzi.Start(ctx, e.client, greet, greetIn{}, kagzi.WithDelay(time.Hour), kagzi.WithRunTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrDeadlineExceeded)
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.steps`); n != 0 {
		t.Fatalf("a run past its deadline executed %d steps", n)
	}
}

func TestRunDeadlineCancelsARunningStep(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	started := make(chan struct{})
	sawCause := make(chan error, 1)
	wf := kagzi.Define("runs-too-long", func(ctx *kagzi.Context, _ int) (int, error) {
		return kagzi.Step(ctx, "block", func(c context.Context) (int, error) {
			close(started)
			<-c.Done()
			sawCause <- context.Cause(c)
			return 0, c.Err()
		})
	})
	runWorker(t, e.client, fastWorker(), wf)
	// The deadline must find the step running: on a loaded box a claim has once come
	// after 500 ms, and the run failed on its deadline before the step began.
	run, err := kagzi.Start(ctx, e.client, wf, 0, kagzi.WithDeadline(time.Now().Add(2*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrDeadlineExceeded)
	select {
	case <-started:
	default:
		t.Fatal("the run failed on its deadline before its step began; the test needs a later deadline")
	}
	select {
	case cause := <-sawCause:
		if !errors.Is(cause, kagzi.ErrDeadlineExceeded) {
			t.Fatalf("the step's context ended with %v, want ErrDeadlineExceeded", cause)
		}
	case <-ctx.Done():
		t.Fatal("the step's context did not end after the run's deadline")
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.step_attempts`); n != 0 {
		t.Fatalf("the step interrupted by the deadline recorded %d attempts, want 0", n)
	}
}

func TestInvalidRetryPoliciesAreRejectedBeforeAnythingRuns(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	bad := []kagzi.Retry{
		kagzi.Attempts(0),
		kagzi.Exponential(3).Initial(-time.Second),
		kagzi.Exponential(3).Max(-time.Second),
		kagzi.Exponential(3).Backoff(0.5),
		kagzi.Exponential(3).Jitter(2),
		kagzi.Linear(-1, time.Second),
		kagzi.Exponential(3).Initial(2 * time.Second).Max(time.Second),
		kagzi.Exponential(3).Max(time.Second).Initial(2 * time.Second),
	}
	for _, r := range bad {
		if !errors.Is(r.Err(), kagzi.ErrInvalidArgument) {
			t.Errorf("policy %v: Err() = %v, want ErrInvalidArgument", r, r.Err())
		}
		wf := kagzi.Define("bad-policy", func(*kagzi.Context, int) (int, error) { return 0, nil }, kagzi.WithWorkflowRetry(r))
		if _, err := kagzi.Start(ctx, e.client, wf, 0); !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("Start with policy %v: %v, want ErrInvalidArgument", r, err)
		}
		if _, err := kagzi.NewWorker(e.client, kagzi.WorkerConfig{DefaultRetry: r}, greet); !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("NewWorker with policy %v: %v, want ErrInvalidArgument", r, err)
		}
	}
	var ran atomic.Bool
	wf := kagzi.Define("bad-step-policy", func(ctx *kagzi.Context, _ int) (bool, error) {
		_, err := kagzi.Step(ctx, "s", func(context.Context) (int, error) { ran.Store(true); return 1, nil },
			kagzi.WithRetry(kagzi.Exponential(3).Backoff(0)))
		return errors.Is(err, kagzi.ErrInvalidArgument), nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if rejected, err := run.Wait(ctx); err != nil || !rejected || ran.Load() {
		t.Fatalf("Step with an invalid policy: rejected=%v ran=%v err=%v; want rejected before running", rejected, ran.Load(), err)
	}
}

func TestUndecodableRecordedStepOutputFailsTheRunNonRetryably(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("type-changed", func(ctx *kagzi.Context, _ int) (int, error) {
		v, err := kagzi.Step(ctx, "count", func(context.Context) (int, error) { return 41, nil })
		if err != nil {
			return 0, err
		}
		if err := ctx.Sleep("nap", 500*time.Millisecond); err != nil {
			return 0, err
		}
		return v + 1, nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the run to sleep", func() bool { return runStatus(t, e.client, run.RunID) == kagzi.StatusSleeping })
	// As if a deploy changed the step's output type: the recorded output no longer decodes.
	if _, err := e.pool.Exec(ctx, `UPDATE kagzi.steps SET output = '"forty-one"' WHERE step_key = 'count#1'`); err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrNonRetryable)
	if !strings.Contains(err.Error(), "int") || !strings.Contains(err.Error(), run.RunID) {
		t.Fatalf("error %q should name the type and the run", err)
	}
}

func TestARetryPolicyAddsNoRoundTripToAStepThatSucceeds(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	pool, rt := tracedPool(t, e.url)
	wf := kagzi.Define("happy", func(ctx *kagzi.Context, _ int) (int, error) {
		for range 5 {
			if _, err := kagzi.Step(ctx, "plain", func(context.Context) (int, error) { return 1, nil },
				kagzi.WithRetry(kagzi.NoRetry())); err != nil {
				return 0, err
			}
		}
		for range 5 {
			if _, err := kagzi.Step(ctx, "with-policy", func(context.Context) (int, error) { return 1, nil },
				kagzi.WithRetry(kagzi.Exponential(10).Initial(time.Second)), kagzi.WithStepTimeout(time.Minute)); err != nil {
				return 0, err
			}
		}
		return 1, nil
	})
	runWorker(t, newClient(t, pool, ""), fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rt.count("INSERT INTO kagzi.steps AS s"); n != 10 {
		t.Fatalf("%d step writes for 10 steps that succeed first time, with or without a policy; want 10", n)
	}
}
