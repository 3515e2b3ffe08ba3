package kagzi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

// Contracts of errors and inputs that a user relies on: what is recorded, what is
// refused, and what the reads report.

func TestACodeThePolicyListsIsRecordedNonRetryableOnTheStepAndTheRun(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	fn, calls := failingStep(10, &kagzi.Error{Code: "card_declined", Message: "card was declined"})
	wf := kagzi.Define("declined", func(ctx *kagzi.Context, _ int) (string, error) {
		return kagzi.Step(ctx, "card", fn, kagzi.WithRetry(kagzi.Attempts(5).Initial(time.Millisecond).NonRetryable("card_declined")))
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	var we *kagzi.WorkflowError
	if !errors.As(err, &we) || !we.Detail.NonRetryable || !errors.Is(err, kagzi.ErrNonRetryable) {
		t.Fatalf("run ended with %v; want its detail marked NonRetryable", err)
	}
	if calls.Load() != 1 {
		t.Fatalf("the step ran %d times, want 1", calls.Load())
	}
	steps := stepsOf(t, e.client, run.RunID)
	if len(steps) != 1 || steps[0].Error == nil || !steps[0].Error.NonRetryable ||
		steps[0].Attempts[0].Error == nil || !steps[0].Attempts[0].Error.NonRetryable {
		t.Fatalf("steps %+v: want the recorded step and attempt errors marked NonRetryable", steps)
	}
}

func TestAnExhaustedStepIsNotRecordedNonRetryable(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	fn, _ := failingStep(10, errors.New("gateway down"))
	wf := kagzi.Define("exhausted", func(ctx *kagzi.Context, _ int) (string, error) {
		return kagzi.Step(ctx, "call", fn, kagzi.WithRetry(kagzi.Linear(2, time.Millisecond)))
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	var we *kagzi.WorkflowError
	if !errors.As(err, &we) || we.Detail.NonRetryable {
		t.Fatalf("run ended with %v; an error whose attempts ran out is not NonRetryable", err)
	}
}

func TestARunFailedByAStepRecordsTheStepsDetailUnchanged(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	fn, _ := failingStep(10, &kagzi.Error{Code: "card_declined", Message: "card was declined",
		Metadata: map[string]string{"psp": "acme"}})
	wf := kagzi.Define("charge-fails", func(ctx *kagzi.Context, _ int) (string, error) {
		out, err := kagzi.Step(ctx, "card", fn, kagzi.WithRetry(kagzi.NoRetry()))
		if err != nil {
			return "", fmt.Errorf("charging the order: %w", err) // wrapped: the detail stays the step's
		}
		return out, nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	var we *kagzi.WorkflowError
	if !errors.As(err, &we) {
		t.Fatalf("got %v", err)
	}
	step := stepsOf(t, e.client, run.RunID)[0].Error
	if we.Detail.Message != "card was declined" || we.Detail.Code != "card_declined" || we.Detail.Subject != "card#1" ||
		we.Detail.Message != step.Message || we.Detail.Code != step.Code || we.Detail.Subject != step.Subject ||
		we.Detail.Metadata["psp"] != "acme" {
		t.Fatalf("run detail %+v, step detail %+v: want the same message, code and subject", we.Detail, *step)
	}
}

func TestDurableCallsFromInsideAStepBodyAreRefusedAndRecordNothing(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	child := kagzi.Define("inside-child", func(ctx *kagzi.Context, _ int) (int, error) { return 1, nil })
	calls := map[string]func(*kagzi.Context) error{
		"Step": func(c *kagzi.Context) error {
			_, err := kagzi.Step(c, "inner", func(context.Context) (int, error) { return 1, nil })
			return err
		},
		"Sleep":      func(c *kagzi.Context) error { return c.Sleep("nap", time.Millisecond) },
		"SleepUntil": func(c *kagzi.Context) error { return c.SleepUntil("nap", time.Now()) },
		"StartChild": func(c *kagzi.Context) error { _, err := kagzi.StartChild(c, "kid", child, 0); return err },
		"WaitSignal": func(c *kagzi.Context) error { _, err := kagzi.WaitSignal[int](c, "go", time.Second); return err },
		"SetEvent":   func(c *kagzi.Context) error { return c.SetEvent("progress", 1) },
		"Go": func(c *kagzi.Context) error {
			_, err := kagzi.Go(c, "branch", func(*kagzi.Context) (int, error) { return 1, nil }).Get()
			return err
		},
		"Map": func(c *kagzi.Context) error {
			_, err := kagzi.Map(c, "items", []int{1}, func(_ *kagzi.Context, i int) (int, error) { return i, nil })
			return err
		},
	}
	names := slices.Sorted(maps.Keys(calls))
	wf := kagzi.Define("calls-inside-step", func(ctx *kagzi.Context, _ int) (map[string]string, error) {
		got := map[string]string{}
		for _, name := range names {
			out, err := kagzi.Step(ctx, "outer-"+name, func(context.Context) (string, error) {
				err := calls[name](ctx) // the workflow's Context, from inside the body
				switch {
				case err == nil:
					return "accepted", nil
				case errors.Is(err, kagzi.ErrInsideStep) && errors.Is(err, kagzi.ErrInvalidArgument):
					return "refused", nil
				}
				return "other error: " + err.Error(), nil
			})
			if err != nil {
				return nil, err
			}
			got[name] = out
		}
		return got, nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := run.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if got[name] != "refused" {
			t.Errorf("%s from inside a step body: %s, want refused", name, got[name])
		}
	}
	// Only the outer steps exist: nothing the refused calls asked for was recorded.
	var keys []string
	for _, s := range stepsOf(t, e.client, run.RunID) {
		keys = append(keys, s.Key)
	}
	if len(keys) != len(calls) {
		t.Fatalf("recorded steps %v, want only the %d outer ones", keys, len(calls))
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs`); n != 1 {
		t.Fatalf("%d runs: a child was started from inside a step body", n)
	}
}

func TestANilOrZeroContextIsATypedErrorAtEveryEntryPoint(t *testing.T) {
	child := kagzi.Define("nil-ctx-child", func(ctx *kagzi.Context, _ int) (int, error) { return 1, nil })
	for _, c := range []*kagzi.Context{nil, {}} {
		errs := map[string]error{}
		_, errs["Step"] = kagzi.Step(c, "s", func(context.Context) (int, error) { return 1, nil })
		errs["Sleep"] = c.Sleep("s", time.Second)
		errs["SleepUntil"] = c.SleepUntil("s", time.Now())
		_, errs["WaitSignal"] = kagzi.WaitSignal[int](c, "s", time.Second)
		errs["SetEvent"] = c.SetEvent("s", 1)
		_, errs["StartChild"] = kagzi.StartChild(c, "s", child, 0)
		_, errs["Go"] = kagzi.Go(c, "s", func(*kagzi.Context) (int, error) { return 1, nil }).Get()
		_, errs["Map"] = kagzi.Map(c, "s", []int{}, func(*kagzi.Context, int) (int, error) { return 1, nil })
		_, errs["Race"] = kagzi.Race(c, "s", []func(context.Context) (int, error){
			func(context.Context) (int, error) { return 1, nil }})
		for name, err := range errs {
			if !errors.Is(err, kagzi.ErrInvalidArgument) {
				t.Errorf("%s with %#v: %v, want ErrInvalidArgument", name, c, err)
			}
		}
		if c.Patched("p") || c.RunID() != "" || c.Attempt() != 0 || c.Logger() == nil {
			t.Errorf("the accessors of %#v must answer zero values", c)
		}
		var none *kagzi.ChildRun[int]
		if _, err := none.Get(); !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("Get on a nil ChildRun: %v", err)
		}
	}
}

func TestRunInfoAttemptIsZeroUntilTheRunFirstExecutes(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	run, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil || info.Attempt != 0 || info.Takeovers != 0 {
		t.Fatalf("a run never claimed: %+v, %v; want attempt 0", info, err)
	}
	runWorker(t, e.client, fastWorker(), greet)
	if _, err := run.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if info, err = e.client.GetRun(ctx, run.RunID); err != nil || info.Attempt != 1 {
		t.Fatalf("after its execution: %+v, %v; want attempt 1", info, err)
	}
}

func TestAPendingRunsDeadlineFailsItWhileEverySlotIsBusy(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	release := make(chan struct{})
	wf := kagzi.Define("hold-the-slot", func(ctx *kagzi.Context, hold bool) (string, error) {
		return kagzi.Step(ctx, "work", func(c context.Context) (string, error) {
			if hold {
				select {
				case <-release:
				case <-c.Done():
				}
			}
			return "done", nil
		})
	})
	cfg := fastWorker()
	cfg.MaxConcurrent = 1
	cfg.PollInterval = time.Minute // no poll may rescue the test
	runWorker(t, e.client, cfg, wf)
	holder, err := kagzi.Start(ctx, e.client, wf, true)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the only slot to be taken", func() bool { return runStatus(t, e.client, holder.RunID) == kagzi.StatusRunning })
	late, err := kagzi.Start(ctx, e.client, wf, false, kagzi.WithRunTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	_, err = late.Wait(ctx)
	if !errors.Is(err, kagzi.ErrDeadlineExceeded) || kagzi.ErrorCode(err) != kagzi.CodeDeadlineExceeded {
		t.Fatalf("the waiting run ended with %v, want FAILED on its deadline", err)
	}
	if s := runStatus(t, e.client, holder.RunID); s != kagzi.StatusRunning {
		t.Fatalf("the slot's run is %s: the deadline must pass while the slot is still held", s)
	}
	close(release)
	if _, err := holder.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.steps WHERE run_id = $1`, late.RunID); n != 0 {
		t.Fatalf("the run failed on its deadline recorded %d steps", n)
	}
}

func TestARunOfATypeWithoutAWorkerFailsOnItsDeadline(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	cfg := fastWorker()
	cfg.PollInterval = time.Minute
	runWorker(t, e.client, cfg, greet) // a worker of the namespace, of another type
	run, err := e.client.StartByName(ctx, "nobody-runs-this", 1, kagzi.WithRunTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrDeadlineExceeded)
}

func TestWorkerRunReturnsErrClosedSoonAfterItsPoolIsClosed(t *testing.T) {
	e := newEnv(t)
	pool, err := pgxpool.New(context.Background(), e.url)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, pool, "")
	w, err := kagzi.NewWorker(c, kagzi.WorkerConfig{}, greet) // the default 5 s poll and 3.3 s heartbeat
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()
	eventually(t, "the worker to register", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.workers WHERE status = 'ONLINE'`) == 1
	})
	pool.Close()
	select {
	case err := <-done:
		mustErrorIs(t, err, kagzi.ErrClosed)
	case <-time.After(2 * time.Second):
		t.Fatal("Run did not return within 2 s of its pool closing")
	}
}

func TestRunInfoAndScheduleInfoMarshalToTheCLIsSnakeCaseJSON(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	b, err := json.Marshal(kagzi.RunInfo{RunID: "r", WorkflowType: "t", Status: kagzi.StatusRunning, Attempt: 1,
		LockedBy: "w1", CreatedAt: now, AvailableAt: now, UpdatedAt: now})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"run_id":"r"`, `"workflow_type":"t"`, `"status":"RUNNING"`, `"worker_id":"w1"`,
		`"takeovers":0`, `"created_at":"2026-01-02T03:04:05Z"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("RunInfo JSON %s lacks %s", b, want)
		}
	}
	if strings.Contains(string(b), `"output"`) || strings.Contains(string(b), `"error"`) {
		t.Errorf("RunInfo JSON %s shows empty optional fields", b)
	}
	b, err = json.Marshal(kagzi.ScheduleInfo{ID: "s", WorkflowType: "t", Workflow: "t", Overlap: kagzi.OverlapBufferOne})
	if err != nil || !strings.Contains(string(b), `"schedule_id":"s"`) || !strings.Contains(string(b), `"overlap":"BUFFER_ONE"`) ||
		strings.Count(string(b), `"t"`) != 1 {
		t.Fatalf("ScheduleInfo JSON %s, %v", b, err)
	}
	var back kagzi.ScheduleInfo
	if err := json.Unmarshal(b, &back); err != nil || back.Overlap != kagzi.OverlapBufferOne {
		t.Fatalf("decoded %+v, %v", back, err)
	}
}

func TestANilOptionIsATypedErrorThatStartsNothing(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("nil-options", func(ctx *kagzi.Context, n int) (bool, error) {
		_, err := kagzi.Step(ctx, "s", func(context.Context) (int, error) { return n, nil }, nil)
		_, merr := kagzi.Map(ctx, "m", []int{1}, func(ctx *kagzi.Context, i int) (int, error) { return i, nil }, nil)
		_, cerr := kagzi.StartChild(ctx, "c", kagzi.Define("nil-options-child", func(ctx *kagzi.Context, n int) (int, error) {
			return n, nil
		}), 1, nil)
		return errors.Is(err, kagzi.ErrInvalidArgument) && errors.Is(merr, kagzi.ErrInvalidArgument) &&
			errors.Is(cerr, kagzi.ErrInvalidArgument), nil
	})
	if _, err := kagzi.Start(ctx, e.client, wf, 1, nil); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("Start with a nil option: %v, want ErrInvalidArgument", err)
	}
	if _, err := kagzi.StartMany(ctx, e.client, wf, []int{1, 2}, nil); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("StartMany with a nil option: %v, want ErrInvalidArgument", err)
	}
	if _, err := e.client.StartByName(ctx, "nil-options", 1, kagzi.WithPriority(1), nil); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("StartByName with a nil option: %v, want ErrInvalidArgument", err)
	}
	bad := kagzi.Define("nil-define-option", func(ctx *kagzi.Context, n int) (int, error) { return n, nil }, nil)
	if _, err := kagzi.Start(ctx, e.client, bad, 1); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("Start of a workflow defined with a nil option: %v, want ErrInvalidArgument", err)
	}
	var n int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.runs`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("runs after the rejected starts: %d, %v; want none", n, err)
	}
	runWorker(t, e.client, kagzi.WorkerConfig{}, wf)
	run, err := kagzi.Start(ctx, e.client, wf, 1)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || !out {
		t.Fatalf("Step, Map and StartChild with a nil option inside a workflow: all ErrInvalidArgument = %v, %v", out, err)
	}
	if err := e.client.Signal(ctx, run.RunID, "go", 1, nil); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("Signal with a nil option: %v, want ErrInvalidArgument", err)
	}
}

// Found from outside: with runs executing, Run waited for the drain (writes to a
// closed pool were retried as transient) and returned only after the lease.
func TestWorkerRunReturnsErrClosedWithoutWaitingForItsRunsWhenItsPoolIsClosed(t *testing.T) {
	e := newEnv(t)
	pool, err := pgxpool.New(context.Background(), e.url)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, pool, "")
	stuck := make(chan struct{})
	t.Cleanup(func() { close(stuck) })
	began := make(chan struct{}, 3)
	wf := kagzi.Define("stuck-step", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Step(ctx, "wait", func(context.Context) (int, error) {
			began <- struct{}{}
			<-stuck // ignores its context
			return n, nil
		})
	})
	w, err := kagzi.NewWorker(c, kagzi.WorkerConfig{LeaseDuration: time.Minute, DrainTimeout: time.Minute}, wf)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()
	for i := range 3 {
		if _, err := kagzi.Start(waitCtx(t), newClient(t, e.pool, ""), wf, i); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		<-began
	}
	pool.Close()
	select {
	case err := <-done:
		mustErrorIs(t, err, kagzi.ErrClosed)
	case <-time.After(20 * time.Second): // the lease and the drain are a minute
		t.Fatal("Run did not return while its runs' steps were still blocked after its pool closed")
	}
}

// Found from outside: the deadline of a run whose worker froze holding its lease
// (SIGSTOP, a paused VM) waited for the lease to pass.
func TestARunningRunWhoseWorkerFrozePastItsDeadlineFailsWithoutWaitingForTheLease(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	frozen := kagzi.Define("frozen-owner", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
	run, err := kagzi.Start(ctx, e.client, frozen, 1, kagzi.WithRunTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	leaseTo(t, e, run.RunID, "frozen") // claimed by a worker that then froze
	// Another, held by a worker whose heartbeat interval is a minute: its run is left
	// to it for that long past the deadline (a live worker's end may take a moment).
	slow, err := kagzi.Start(ctx, e.client, frozen, 2, kagzi.WithRunTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `
		INSERT INTO kagzi.workers (namespace, worker_id, hostname, pid, version, labels, workflow_types,
			max_concurrent, heartbeat_interval_ms, status, workflow_versions)
		VALUES ('default', 'slow-beat', 'h', 1, 'v', '{}', '{frozen-owner}', 1, 60000, 'ONLINE', '{""}')`); err != nil {
		t.Fatal(err)
	}
	leaseTo(t, e, slow.RunID, "slow-beat")
	runWorker(t, e.client, fastWorker(), greet) // of another type: only its sweep can act
	_, err = run.Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrDeadlineExceeded)
	var we *kagzi.WorkflowError
	if !errors.As(err, &we) || we.Detail.Code != kagzi.CodeDeadlineExceeded {
		t.Fatalf("the frozen owner's run: %v, want it FAILED with %s", err, kagzi.CodeDeadlineExceeded)
	}
	if s := runStatus(t, e.client, slow.RunID); s != kagzi.StatusRunning {
		t.Fatalf("the run of a worker whose heartbeat interval is a minute is %s a moment past its deadline, want it left RUNNING", s)
	}
}
