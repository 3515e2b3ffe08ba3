package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

// ledger records, in order, what the steps and compensations of a test did.
type ledger struct {
	mu      sync.Mutex
	entries []string
}

func (l *ledger) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = append(l.entries, s)
}

func (l *ledger) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.entries)
}

func (l *ledger) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.entries {
		if e == s {
			n++
		}
	}
	return n
}

// lastError keeps the last error a workflow function saw, for the test to inspect.
type lastError struct {
	mu  sync.Mutex
	err error
}

func (l *lastError) set(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.err = err
}

func (l *lastError) get() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// soldOut is the failure of the step named "fail" in trip workflows.
var soldOut = &kagzi.Error{Code: "sold_out", Message: "sold out", NonRetryable: true}

// undoFunc gives the compensation of a step and its options; nil: one that records
// "undo <step>" and succeeds, with the default options.
type undoFunc func(step string, l *ledger) (func(context.Context) error, []kagzi.StepOption)

// tripWorkflow books the steps of its input in order and registers "undo-<step>"
// after each. A step named "fail" fails for good (sold_out), and the workflow returns
// its saga's Compensate error, which got keeps. executions counts the calls of the
// workflow function.
func tripWorkflow(name string, l *ledger, undo undoFunc, got *lastError, opts ...kagzi.DefineOption) (*kagzi.Workflow[[]string, string], *atomic.Int32) {
	var executions atomic.Int32
	return kagzi.Define(name, func(ctx *kagzi.Context, steps []string) (string, error) {
		executions.Add(1)
		saga := kagzi.NewSaga(ctx)
		for _, s := range steps {
			_, err := kagzi.Step(ctx, s, func(context.Context) (string, error) {
				l.add("do " + s)
				if s == "fail" {
					return "", soldOut
				}
				return s, nil
			})
			if err != nil {
				err = saga.Compensate(err)
				got.set(err)
				return "", err
			}
			fn := func(context.Context) error { l.add("undo " + s); return nil }
			var opts []kagzi.StepOption
			if undo != nil {
				fn, opts = undo(s, l)
			}
			if err := saga.Add("undo-"+s, fn, opts...); err != nil {
				return "", err
			}
		}
		return "booked", nil
	}, opts...), &executions
}

func stepKeys(steps []kagzi.StepInfo) []string {
	var keys []string
	for _, s := range steps {
		keys = append(keys, s.Key)
	}
	return keys
}

func waitFailed(t *testing.T, ctx context.Context, run *kagzi.Run[string]) *kagzi.WorkflowError {
	t.Helper()
	_, err := run.Wait(ctx)
	var we *kagzi.WorkflowError
	if !errors.As(err, &we) {
		t.Fatalf("Wait returned %v, want a *WorkflowError", err)
	}
	return we
}

func TestSagaRunsTheCompensationsOfCompletedStepsInReverseOrderOnceEach(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	l, got := &ledger{}, &lastError{}
	wf, _ := tripWorkflow("trip", l, nil, got)
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, []string{"flight", "hotel", "car", "fail"})
	if err != nil {
		t.Fatal(err)
	}
	we := waitFailed(t, ctx, run)

	want := []string{"do flight", "do hotel", "do car", "do fail", "undo car", "undo hotel", "undo flight"}
	if !slices.Equal(l.list(), want) {
		t.Fatalf("ledger %q, want %q", l.list(), want)
	}
	// The run records the failure that started the compensation, non-retryable, with
	// the compensations that ran.
	d := we.Detail
	if d.Code != "sold_out" || d.Subject != "fail#1" || !d.NonRetryable ||
		d.Metadata["compensated"] != `["undo-car","undo-hotel","undo-flight"]` {
		t.Fatalf("run failed with %+v, want sold_out in fail#1, non-retryable, compensated listed", d)
	}
	if errors.Is(we, kagzi.ErrCompensationFailed) || !errors.Is(we, kagzi.ErrNonRetryable) {
		t.Fatalf("run error %v: want ErrNonRetryable and not ErrCompensationFailed", we)
	}
	wantKeys := []string{"flight#1", "hotel#1", "car#1", "fail#1",
		"compensate/undo-car#1", "compensate/undo-hotel#1", "compensate/undo-flight#1"}
	steps := stepsOf(t, e.client, run.RunID)
	if !slices.Equal(stepKeys(steps), wantKeys) {
		t.Fatalf("steps %q, want %q", stepKeys(steps), wantKeys)
	}
	for _, s := range steps[4:] {
		if s.Kind != kagzi.KindStep || s.Status != kagzi.StepCompleted || len(s.Attempts) != 1 {
			t.Fatalf("compensation %s recorded as %+v, want a completed step of one attempt", s.Key, s)
		}
	}

	// What the workflow function got from Compensate.
	var se *kagzi.SagaError
	if err := got.get(); !errors.As(err, &se) {
		t.Fatalf("Compensate returned %v, want a *SagaError", err)
	}
	var stepErr *kagzi.StepError
	if !slices.Equal(se.Compensated, []string{"undo-car", "undo-hotel", "undo-flight"}) || len(se.Failed) != 0 ||
		!errors.As(se, &stepErr) || stepErr.Key != "fail#1" || kagzi.ErrorCode(se) != "sold_out" ||
		!errors.Is(se, kagzi.ErrNonRetryable) || errors.Is(se, kagzi.ErrCompensationFailed) {
		t.Fatalf("SagaError %+v (%v): want the cause's StepError, the compensations listed, none failed", se, se)
	}
}

func TestSagaRunsOnlyTheCompensationsOfStepsThatCompleted(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	l, got := &ledger{}, &lastError{}
	wf, _ := tripWorkflow("trip", l, nil, got)
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, []string{"flight", "fail", "hotel"})
	if err != nil {
		t.Fatal(err)
	}
	we := waitFailed(t, ctx, run)
	// The step that failed registered nothing, and the one after it never ran.
	if want := []string{"do flight", "do fail", "undo flight"}; !slices.Equal(l.list(), want) {
		t.Fatalf("ledger %q, want %q", l.list(), want)
	}
	if we.Detail.Metadata["compensated"] != `["undo-flight"]` {
		t.Fatalf("run failed with %+v, want only undo-flight compensated", we.Detail)
	}
	// A workflow that fails before any step completed has nothing to compensate.
	run, err = kagzi.Start(ctx, e.client, wf, []string{"fail", "flight"})
	if err != nil {
		t.Fatal(err)
	}
	we = waitFailed(t, ctx, run)
	if we.Detail.Code != "sold_out" || we.Detail.Metadata["compensated"] != `[]` {
		t.Fatalf("run failed with %+v, want sold_out and nothing compensated", we.Detail)
	}
	if l.count("undo flight") != 1 {
		t.Fatalf("ledger %q: undo flight ran for the second run", l.list())
	}
	if keys := stepKeys(stepsOf(t, e.client, run.RunID)); !slices.Equal(keys, []string{"fail#1"}) {
		t.Fatalf("steps %q, want only fail#1", keys)
	}
}

func TestSagaOfASuccessfulWorkflowRunsNoCompensation(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	l, got := &ledger{}, &lastError{}
	wf, _ := tripWorkflow("trip", l, nil, got)
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, []string{"flight", "hotel"})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != "booked" {
		t.Fatalf("got %q, %v; want booked", out, err)
	}
	if want := []string{"do flight", "do hotel"}; !slices.Equal(l.list(), want) {
		t.Fatalf("ledger %q, want %q", l.list(), want)
	}
	if keys := stepKeys(stepsOf(t, e.client, run.RunID)); !slices.Equal(keys, []string{"flight#1", "hotel#1"}) {
		t.Fatalf("steps %q, want no compensation", keys)
	}
}

func TestSagaRegistrationsAreReplayedAfterASleepReleasedTheRun(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	l := &ledger{}
	var executions atomic.Int32
	wf := kagzi.Define("nap-trip", func(ctx *kagzi.Context, _ int) (string, error) {
		executions.Add(1)
		saga := kagzi.NewSaga(ctx)
		if _, err := kagzi.Step(ctx, "flight", func(context.Context) (int, error) { l.add("do flight"); return 1, nil }); err != nil {
			return "", saga.Compensate(err)
		}
		if err := saga.Add("undo-flight", func(context.Context) error { l.add("undo flight"); return nil }); err != nil {
			return "", err
		}
		// Longer than MaxInProcessSleep: the run is released, and resumes by calling
		// this function again from the top, which registers undo-flight again.
		if err := ctx.Sleep("nap", 300*time.Millisecond); err != nil {
			return "", err
		}
		_, err := kagzi.Step(ctx, "hotel", func(context.Context) (int, error) { l.add("do hotel"); return 0, soldOut })
		return "", saga.Compensate(err)
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	if kagzi.ErrorCode(err) != "sold_out" {
		t.Fatalf("run ended with %v, want sold_out", err)
	}
	if want := []string{"do flight", "do hotel", "undo flight"}; !slices.Equal(l.list(), want) || executions.Load() != 2 {
		t.Fatalf("ledger %q after %d executions, want %q after 2", l.list(), executions.Load(), want)
	}
}

func TestSagaCompensationRetriesPerItsOwnPolicy(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	l, got := &ledger{}, &lastError{}
	undo := func(s string, l *ledger) (func(context.Context) error, []kagzi.StepOption) {
		failures := map[string]int{"hotel": 2, "flight": 1}[s]
		fn := func(context.Context) error {
			l.add("undo " + s)
			if l.count("undo "+s) <= failures {
				return errors.New("the provider is down")
			}
			return nil
		}
		switch s {
		case "hotel": // retried in process
			return fn, []kagzi.StepOption{kagzi.WithRetry(kagzi.Linear(3, time.Millisecond))}
		case "flight": // a backoff over MaxInProcessSleep: the run is released in between
			return fn, []kagzi.StepOption{kagzi.WithRetry(kagzi.Linear(2, 400*time.Millisecond))}
		}
		return fn, nil
	}
	wf, executions := tripWorkflow("patient-trip", l, undo, got)
	cfg := fastWorker()
	cfg.DefaultRetry = kagzi.NoRetry() // the compensations' own policies must win
	runWorker(t, e.client, cfg, wf)
	run, err := kagzi.Start(ctx, e.client, wf, []string{"flight", "hotel", "fail"})
	if err != nil {
		t.Fatal(err)
	}
	we := waitFailed(t, ctx, run)
	if we.Detail.Code != "sold_out" || we.Detail.Metadata["compensated"] != `["undo-hotel","undo-flight"]` {
		t.Fatalf("run failed with %+v, want sold_out with both compensated", we.Detail)
	}
	want := []string{"do flight", "do hotel", "do fail", "undo hotel", "undo hotel", "undo hotel", "undo flight", "undo flight"}
	if !slices.Equal(l.list(), want) {
		t.Fatalf("ledger %q, want %q", l.list(), want)
	}
	if executions.Load() != 2 {
		t.Fatalf("the workflow function ran %d times, want 2 (released during undo-flight's backoff)", executions.Load())
	}
	attempts := map[string][]kagzi.StepStatus{}
	for _, s := range stepsOf(t, e.client, run.RunID) {
		for _, a := range s.Attempts {
			attempts[s.Key] = append(attempts[s.Key], a.Status)
		}
	}
	if got := fmt.Sprint(attempts["compensate/undo-hotel#1"]); got != "[FAILED FAILED COMPLETED]" {
		t.Fatalf("undo-hotel attempts %s, want [FAILED FAILED COMPLETED]", got)
	}
	if got := fmt.Sprint(attempts["compensate/undo-flight#1"]); got != "[FAILED COMPLETED]" {
		t.Fatalf("undo-flight attempts %s, want [FAILED COMPLETED]", got)
	}
}

func TestSagaCompensationThatFailsForGoodFailsTheRunWithCompensationFailedAfterTheOthersRan(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	l, got := &ledger{}, &lastError{}
	undo := func(s string, l *ledger) (func(context.Context) error, []kagzi.StepOption) {
		return func(context.Context) error {
			l.add("undo " + s)
			if s == "hotel" {
				return &kagzi.Error{Code: "hotel_unreachable", Message: "the hotel does not answer"}
			}
			return nil
		}, []kagzi.StepOption{kagzi.WithRetry(kagzi.Linear(2, time.Millisecond))}
	}
	wf, executions := tripWorkflow("stuck-trip", l, undo, got, kagzi.WithWorkflowRetry(kagzi.Linear(3, time.Millisecond)))
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, []string{"flight", "hotel", "car", "fail"})
	if err != nil {
		t.Fatal(err)
	}
	we := waitFailed(t, ctx, run)

	want := []string{"do flight", "do hotel", "do car", "do fail", "undo car", "undo hotel", "undo hotel", "undo flight"}
	if !slices.Equal(l.list(), want) {
		t.Fatalf("ledger %q, want %q: the others run after a compensation fails", l.list(), want)
	}
	d := we.Detail
	if d.Code != kagzi.CodeCompensationFailed || d.Subject != "compensate/undo-hotel#1" || !d.NonRetryable ||
		d.Metadata["cause_code"] != "sold_out" || d.Metadata["cause_subject"] != "fail#1" ||
		d.Metadata["cause_message"] != "sold out" ||
		d.Metadata["compensated"] != `["undo-car","undo-flight"]` || d.Metadata["failed"] != `["undo-hotel"]` ||
		!strings.Contains(d.Message, "the hotel does not answer") || !strings.Contains(d.Message, "sold out") {
		t.Fatalf("run failed with %+v", d)
	}
	for _, target := range []error{kagzi.ErrWorkflowFailed, kagzi.ErrCompensationFailed, kagzi.ErrNonRetryable} {
		mustErrorIs(t, we, target)
	}
	if kagzi.ErrorCode(we) != kagzi.CodeCompensationFailed || executions.Load() != 1 {
		t.Fatalf("code %q after %d executions, want %s after 1: a compensated run is not retried",
			kagzi.ErrorCode(we), executions.Load(), kagzi.CodeCompensationFailed)
	}

	var se *kagzi.SagaError
	if err := got.get(); !errors.As(err, &se) {
		t.Fatalf("Compensate returned %v, want a *SagaError", err)
	}
	var failed, cause *kagzi.StepError
	if len(se.Failed) != 1 || !errors.As(se.Failed[0], &failed) || failed.Key != "compensate/undo-hotel#1" ||
		failed.Attempts != 2 || failed.Detail.Code != "hotel_unreachable" {
		t.Fatalf("SagaError.Failed %v, want undo-hotel's StepError after 2 attempts", se.Failed)
	}
	if !errors.As(se, &cause) || cause.Key != "fail#1" || !errors.Is(se, kagzi.ErrCompensationFailed) ||
		!slices.Equal(se.Compensated, []string{"undo-car", "undo-flight"}) {
		t.Fatalf("SagaError %+v: want the cause's StepError and ErrCompensationFailed", se)
	}
}

func TestACompensatedRunIsNotRetriedByItsWorkflowPolicy(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	l := &ledger{}
	var executions atomic.Int32
	wf := kagzi.Define("quote", func(ctx *kagzi.Context, limit int) (int, error) {
		executions.Add(1)
		saga := kagzi.NewSaga(ctx)
		price, err := kagzi.Step(ctx, "hold-price", func(context.Context) (int, error) { l.add("hold"); return 120, nil })
		if err != nil {
			return 0, saga.Compensate(err)
		}
		if err := saga.Add("release-price", func(context.Context) error { l.add("release"); return nil }); err != nil {
			return 0, err
		}
		if price > limit { // a decision of the workflow, not a step's failure
			return 0, saga.Compensate(fmt.Errorf("price %d over the limit %d", price, limit))
		}
		return price, nil
	}, kagzi.WithWorkflowRetry(kagzi.Linear(5, time.Millisecond)))
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 100)
	if err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	var we *kagzi.WorkflowError
	if !errors.As(err, &we) || we.Detail.Code != kagzi.CodeWorkflowError || !we.Detail.NonRetryable ||
		we.Detail.Message != "price 120 over the limit 100" || we.Detail.Metadata["compensated"] != `["release-price"]` {
		t.Fatalf("run ended with %v, want WORKFLOW_ERROR, non-retryable, release-price compensated", err)
	}
	if executions.Load() != 1 || !slices.Equal(l.list(), []string{"hold", "release"}) {
		t.Fatalf("%d executions, ledger %q: want 1, [hold release]", executions.Load(), l.list())
	}
	if info, err := e.client.GetRun(ctx, run.RunID); err != nil || info.Attempt != 1 {
		t.Fatalf("run %+v, %v: want attempt 1", info, err)
	}
}

func TestCancellingARunDoesNotRunItsCompensations(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	l := &ledger{}
	hanging := make(chan string, 2)
	// Input "step": the step after flight hangs; input "compensation": the workflow
	// fails and undo-hotel hangs, after undo-car ran.
	wf := kagzi.Define("hang-trip", func(ctx *kagzi.Context, where string) (string, error) {
		saga := kagzi.NewSaga(ctx)
		for _, s := range []string{"flight", "hotel", "car", "fail"} {
			_, err := kagzi.Step(ctx, s, func(c context.Context) (string, error) {
				l.add(where + ": do " + s)
				if s == "car" && where == "step" {
					hanging <- where
					<-c.Done()
					return "", c.Err()
				}
				if s == "fail" {
					return "", soldOut
				}
				return s, nil
			})
			if err != nil {
				return "", saga.Compensate(err)
			}
			if err := saga.Add("undo-"+s, func(c context.Context) error {
				l.add(where + ": undo " + s)
				if s == "hotel" {
					hanging <- where
					<-c.Done()
					return c.Err()
				}
				return nil
			}); err != nil {
				return "", err
			}
		}
		return "booked", nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	for _, where := range []string{"step", "compensation"} {
		run, err := kagzi.Start(ctx, e.client, wf, where)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-hanging:
		case <-ctx.Done():
			t.Fatal("the run never reached its hanging call")
		}
		if err := e.client.Cancel(ctx, run.RunID); err != nil {
			t.Fatal(err)
		}
		if _, err := run.Wait(ctx); !errors.Is(err, kagzi.ErrCancelled) {
			t.Fatalf("%s: Wait returned %v, want ErrCancelled", where, err)
		}
		var wantKeys []string
		switch where {
		case "step": // nothing compensated
			wantKeys = []string{"flight#1", "hotel#1"}
		case "compensation": // the compensations after the interrupted one do not run
			wantKeys = []string{"flight#1", "hotel#1", "car#1", "fail#1", "compensate/undo-car#1"}
		}
		if keys := stepKeys(stepsOf(t, e.client, run.RunID)); !slices.Equal(keys, wantKeys) {
			t.Fatalf("%s: steps %q, want %q", where, keys, wantKeys)
		}
	}
	want := []string{"step: do flight", "step: do hotel", "step: do car",
		"compensation: do flight", "compensation: do hotel", "compensation: do car", "compensation: do fail",
		"compensation: undo car", "compensation: undo hotel"}
	if !slices.Equal(l.list(), want) {
		t.Fatalf("ledger %q, want %q", l.list(), want)
	}
}

func TestSagaRefusesBadInputWithErrInvalidArgumentAndRecordsNothing(t *testing.T) {
	cause := errors.New("boom")
	noop := func(context.Context) error { return nil }
	// Without a workflow: a nil Saga, a zero one, and one made from a nil or zero Context.
	for name, saga := range map[string]*kagzi.Saga{"nil": nil, "zero": {}, "nil ctx": kagzi.NewSaga(nil),
		"zero ctx": kagzi.NewSaga(&kagzi.Context{})} {
		if err := saga.Add("undo", noop); !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("%s saga: Add returned %v, want ErrInvalidArgument", name, err)
		}
		err := saga.Compensate(cause)
		if !errors.Is(err, kagzi.ErrInvalidArgument) || !errors.Is(err, cause) {
			t.Errorf("%s saga: Compensate returned %v, want ErrInvalidArgument wrapping the cause", name, err)
		}
	}

	e := newEnv(t)
	ctx := waitCtx(t)
	l := &ledger{}
	var mu sync.Mutex
	refusals := map[string]error{}
	refused := func(what string, err error) {
		mu.Lock()
		defer mu.Unlock()
		refusals[what] = err
	}
	long := strings.Repeat("x", 244) // "compensate/" + 244 bytes = 255: the longest name
	wf := kagzi.Define("bad-saga", func(ctx *kagzi.Context, _ int) (string, error) {
		saga := kagzi.NewSaga(ctx)
		undo := func(name string) func(context.Context) error {
			return func(context.Context) error { l.add("undo " + name); return nil }
		}
		if err := saga.Add("ok", undo("ok")); err != nil {
			return "", err
		}
		if err := saga.Add(long, undo("long")); err != nil {
			return "", err
		}
		refused("empty name", saga.Add("", undo("empty")))
		refused("control character", saga.Add("bad\nname", undo("bad")))
		refused("invalid UTF-8", saga.Add("bad\xff", undo("bad")))
		refused("too long", saga.Add(long+"x", undo("too long")))
		refused("duplicate", saga.Add("ok", undo("duplicate")))
		refused("nil fn", saga.Add("nil-fn", nil))
		refused("nil option", saga.Add("nil-option", undo("nil option"), nil))
		refused("negative timeout", saga.Add("timeout", undo("timeout"), kagzi.WithStepTimeout(-time.Second)))
		refused("invalid policy", saga.Add("policy", undo("policy"), kagzi.WithRetry(kagzi.Attempts(0))))
		refused("nil cause", saga.Compensate(nil))
		if _, err := kagzi.Step(ctx, "probe", func(context.Context) (string, error) {
			refused("Add inside a step", saga.Add("inside", undo("inside")))
			refused("Compensate inside a step", saga.Compensate(cause))
			return "", nil
		}); err != nil {
			return "", err
		}
		err := saga.Compensate(cause) // the refusals above changed nothing: this one runs
		refused("Add after Compensate", saga.Add("late", undo("late")))
		refused("Compensate twice", saga.Compensate(cause))
		return "", err
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	var we *kagzi.WorkflowError
	if !errors.As(err, &we) || we.Detail.Message != "boom" || we.Detail.Metadata["compensated"] != `["`+long+`","ok"]` {
		t.Fatalf("run ended with %v, want boom with the two valid compensations", err)
	}
	for _, what := range []string{"empty name", "control character", "invalid UTF-8", "too long", "duplicate",
		"nil fn", "nil option", "negative timeout", "invalid policy", "nil cause", "Add inside a step",
		"Compensate inside a step", "Add after Compensate", "Compensate twice"} {
		err, ok := refusals[what]
		if !ok || !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("%s: got %v, want an error wrapping ErrInvalidArgument", what, err)
		}
	}
	for _, what := range []string{"Add inside a step", "Compensate inside a step"} {
		mustErrorIs(t, refusals[what], kagzi.ErrInsideStep)
	}
	for _, what := range []string{"Compensate inside a step", "Compensate twice"} {
		mustErrorIs(t, refusals[what], cause)
	}
	if want := []string{"undo long", "undo ok"}; !slices.Equal(l.list(), want) {
		t.Fatalf("ledger %q, want %q: each valid compensation once, nothing else", l.list(), want)
	}
	wantKeys := []string{"probe#1", "compensate/" + long + "#1", "compensate/ok#1"}
	if keys := stepKeys(stepsOf(t, e.client, run.RunID)); !slices.Equal(keys, wantKeys) {
		t.Fatalf("steps %q, want %q", keys, wantKeys)
	}
}

// sagaCrashWorkflow books three things, registering their compensations, then fails
// to pay, and compensates. Every step and compensation body records its execution in
// saga_effects; in processes started with crashBlockEnv, undo-hotel hangs after
// recording it.
func sagaCrashWorkflow(pool *pgxpool.Pool, block bool) *kagzi.Workflow[int, int] {
	effect := func(ctx context.Context, runID, what string) error {
		_, err := pool.Exec(ctx, `INSERT INTO saga_effects (run_id, what, pid) VALUES ($1, $2, $3)`, runID, what, os.Getpid())
		return err
	}
	return kagzi.Define("saga-crash", func(ctx *kagzi.Context, _ int) (int, error) {
		saga := kagzi.NewSaga(ctx)
		for _, s := range []string{"flight", "hotel", "car"} {
			if _, err := kagzi.Step(ctx, s, func(c context.Context) (int, error) {
				return 1, effect(c, ctx.RunID(), "do "+s)
			}); err != nil {
				return 0, saga.Compensate(err)
			}
			if err := saga.Add("undo-"+s, func(c context.Context) error {
				if err := effect(c, ctx.RunID(), "undo "+s); err != nil {
					return err
				}
				if block && s == "hotel" {
					<-c.Done() // hang until killed
					return c.Err()
				}
				return nil
			}, kagzi.WithRetry(kagzi.Forever().Initial(10*time.Millisecond))); err != nil {
				return 0, err
			}
		}
		_, err := kagzi.Step(ctx, "pay", func(context.Context) (int, error) {
			return 0, &kagzi.Error{Code: "card_declined", Message: "card declined", NonRetryable: true}
		})
		if err != nil {
			return 0, saga.Compensate(err)
		}
		return 1, nil
	})
}

func TestSagaCompensationsRunInReverseOrderOnceEachWhenTheWorkerIsKilledMidCompensation(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE saga_effects (id bigserial, run_id text, what text, pid int)`); err != nil {
		t.Fatal(err)
	}
	wf := sagaCrashWorkflow(e.pool, false)
	const runs = 3
	var started []*kagzi.Run[int]
	for i := range runs {
		run, err := kagzi.Start(ctx, e.client, wf, i)
		if err != nil {
			t.Fatal(err)
		}
		started = append(started, run)
	}
	first := startWorkerProcess(t, e.url, true)
	eventually(t, "every run to hang in undo-hotel in the first process", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM saga_effects WHERE what = 'undo hotel'`) == runs
	})
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	startWorkerProcess(t, e.url, false)

	for _, run := range started {
		_, err := run.Wait(ctx)
		var we *kagzi.WorkflowError
		if !errors.As(err, &we) || we.Detail.Code != "card_declined" ||
			we.Detail.Metadata["compensated"] != `["undo-car","undo-hotel","undo-flight"]` {
			t.Fatalf("run %s ended with %v, want card_declined with all three compensated", run.RunID, err)
		}
		rows, err := e.pool.Query(ctx, `SELECT what FROM saga_effects WHERE run_id = $1 ORDER BY id`, run.RunID)
		if err != nil {
			t.Fatal(err)
		}
		effects, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		// Bookings once; undo-car, recorded before the kill, once; undo-hotel, which
		// the kill interrupted, once per process; undo-flight once, after it.
		want := []string{"do flight", "do hotel", "do car", "undo car", "undo hotel", "undo hotel", "undo flight"}
		if !slices.Equal(effects, want) {
			t.Fatalf("run %s effects %q, want %q", run.RunID, effects, want)
		}
		steps := stepsOf(t, e.client, run.RunID)
		var pay []kagzi.AttemptInfo
		for _, s := range steps {
			if s.Key == "pay#1" {
				pay = s.Attempts
			}
		}
		if len(pay) != 1 {
			t.Fatalf("run %s: pay attempted %d times, want 1 (replayed, not run again)", run.RunID, len(pay))
		}
	}
	if n := countRows(t, e.pool, `SELECT count(DISTINCT pid) FROM saga_effects WHERE what = 'undo flight'`); n != 1 {
		t.Fatalf("undo-flight ran in %d processes, want 1 (the second)", n)
	}
}
