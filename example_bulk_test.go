package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kagzi/kagzi"
)

// Cancel every pending run of a workflow type: the runs a bad deploy started, say.
func ExampleClient_CancelRuns() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx := context.Background()
	report := kagzi.Define("nightly-report", func(ctx *kagzi.Context, day string) (string, error) { return day, nil })
	if _, err := kagzi.StartMany(ctx, client, report, []string{"mon", "tue", "wed"}); err != nil {
		fmt.Println(err)
		return
	}

	res, err := client.CancelRuns(ctx, kagzi.RunFilter{
		WorkflowType: "nightly-report",
		Statuses:     []kagzi.RunStatus{kagzi.StatusPending},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("matched %d, cancelled %d\n", res.Matched, res.Changed)
	// Output: matched 3, cancelled 3
}

// Rerun every failed run after fixing what made them fail. A finished run, or one
// whose workflow id is taken by another active run, is skipped and counted.
func ExampleClient_RerunRuns() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx := context.Background()
	var fixed atomic.Bool
	charge := kagzi.Define("charge", func(ctx *kagzi.Context, id string) (string, error) {
		return kagzi.Step(ctx, "call-bank", func(context.Context) (string, error) {
			if !fixed.Load() {
				return "", kagzi.NonRetryable(errors.New("bank API changed"))
			}
			return "charged " + id, nil
		})
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, charge)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- worker.Run(wctx) }()
	defer func() { stop(); <-done }()

	runs, _ := kagzi.StartMany(ctx, client, charge, []string{"a", "b"})
	for _, r := range runs {
		_, _ = r.Wait(ctx) // FAILED
	}
	fixed.Store(true) // the fix is deployed

	res, err := client.RerunRuns(ctx, kagzi.RunFilter{Statuses: []kagzi.RunStatus{kagzi.StatusFailed}})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("rerun %d of %d\n", res.Changed, res.Matched)
	for _, r := range runs {
		out, err := r.Wait(ctx)
		fmt.Println(out, err)
	}
	// Output:
	// rerun 2 of 2
	// charged a <nil>
	// charged b <nil>
}

// The signals a run was sent, received or still waiting, and the events it published.
func ExampleClient_ListSignals() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx := context.Background()
	approval := kagzi.Define("approval", func(ctx *kagzi.Context, _ string) (string, error) {
		if err := ctx.SetEvent("stage", "waiting"); err != nil {
			return "", err
		}
		return kagzi.WaitSignal[string](ctx, "approve", time.Hour)
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, approval)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- worker.Run(wctx) }()
	defer func() { stop(); <-done }()

	run, _ := kagzi.Start(ctx, client, approval, "po-17")
	_ = client.Signal(ctx, run.RunID, "approve", "alice")
	_, _ = run.Wait(ctx)
	_ = client.Signal(ctx, run.RunID, "approve", "bob") // the run finished: ErrRunFinished

	signals, _ := client.ListSignals(ctx, run.RunID, kagzi.ListOptions{})
	for _, s := range signals.Signals {
		fmt.Printf("%s %s received by %s\n", s.Name, s.Payload, s.ConsumedBy)
	}
	events, _ := client.ListEvents(ctx, run.RunID, kagzi.ListOptions{})
	for _, e := range events.Events {
		fmt.Printf("event %s = %s\n", e.Key, e.Value)
	}
	// Output:
	// approve "alice" received by approve#1
	// event stage = "waiting"
}
