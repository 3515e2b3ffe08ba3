package kagziadmin_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/admin/adminpb"
)

// Echo returns its input; Kinds starts it as a child.
var Echo = kagzi.Define("echo", func(ctx *kagzi.Context, in string) (string, error) { return in, nil })

// Kinds records a step of every recorded kind but STEP and SLEEP, and then waits for
// the "approve" signal, which no test sends.
var Kinds = kagzi.Define("kinds", func(ctx *kagzi.Context, _ struct{}) (string, error) {
	if err := ctx.SetAttributes(map[string]any{"stage": "kinds"}); err != nil {
		return "", err
	}
	ctx.Patched("new-path")
	if err := ctx.SetEvent("progress", 1); err != nil {
		return "", err
	}
	if _, err := kagzi.StartChild(ctx, "echo", Echo, "hi"); err != nil {
		return "", err
	}
	return kagzi.WaitSignal[string](ctx, "approve", 0)
})

func TestListStepsAndGetStepNameEveryRecordedKindAndTheWaitingStatus(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	c := admin(t, f.addr, token)

	w, err := kagzi.NewWorker(f.a, kagzi.WorkerConfig{ID: "worker-kinds", PollInterval: 100 * time.Millisecond,
		DisableScheduler: true}, Kinds, Echo)
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	run, err := kagzi.Start(ctx, f.a, Kinds, struct{}{})
	if err != nil {
		t.Fatal(err)
	}

	want := map[string]adminpb.StepKind{
		"attributes": adminpb.StepKind_STEP_KIND_ATTRIBUTES, "new-path": adminpb.StepKind_STEP_KIND_PATCH,
		"progress": adminpb.StepKind_STEP_KIND_EVENT, "echo": adminpb.StepKind_STEP_KIND_CHILD,
		"approve": adminpb.StepKind_STEP_KIND_SIGNAL,
	}
	var steps []*adminpb.Step
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := c.ListSteps(ctx, &adminpb.ListStepsRequest{Namespace: nsA, RunId: run.RunID})
		if err != nil {
			t.Fatal(err)
		}
		if steps = resp.Steps; len(steps) == len(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run recorded %d steps, want %d: %v", len(steps), len(want), steps)
		}
	}
	for _, s := range steps {
		if s.Kind == adminpb.StepKind_STEP_KIND_UNSPECIFIED || s.Status == adminpb.StepStatus_STEP_STATUS_UNSPECIFIED {
			t.Errorf("step %s: kind %v, status %v; want specific values", s.Key, s.Kind, s.Status)
		}
		got, err := c.GetStep(ctx, &adminpb.GetStepRequest{Namespace: nsA, RunId: run.RunID, StepKey: s.Key})
		if err != nil {
			t.Fatal(err)
		}
		if got.Step.Kind != s.Kind || got.Step.Status != s.Status {
			t.Errorf("GetStep %s: %v/%v, ListSteps said %v/%v", s.Key, got.Step.Kind, got.Step.Status, s.Kind, s.Status)
		}
	}
	byName := map[string]*adminpb.Step{}
	for _, s := range steps {
		byName[s.Name] = s
	}
	for name, kind := range want {
		if s := byName[name]; s == nil || s.Kind != kind {
			t.Errorf("step %q: %v, want kind %v", name, s, kind)
		}
	}
	if s := byName["approve"]; s != nil && s.Status != adminpb.StepStatus_STEP_STATUS_WAITING {
		t.Errorf("the unanswered signal wait is %v, want STEP_STATUS_WAITING", s.Status)
	}
}

func TestListStepsWithAnEmptyStepNameFiltersNothing(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	c := admin(t, f.addr, token)
	all, err := c.ListSteps(ctx, &adminpb.ListStepsRequest{Namespace: nsA, RunId: f.greets[0]})
	if err != nil || len(all.Steps) != 2 {
		t.Fatalf("ListSteps without step_name: %v, %v; want the run's 2 steps", all, err)
	}
	empty, err := c.ListSteps(ctx, &adminpb.ListStepsRequest{Namespace: nsA, RunId: f.greets[0], StepName: proto.String("")})
	if err != nil {
		t.Fatal(err)
	}
	if len(empty.Steps) != 2 || empty.Steps[0].Key != "compose#1" || empty.Steps[1].Key != "flaky#1" {
		t.Fatalf("ListSteps with step_name \"\": %v; want the run's 2 steps, as without it", empty.Steps)
	}
}
