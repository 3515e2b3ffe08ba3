package kagzi_test

import (
	"context"
	"fmt"
	"time"

	"github.com/kagzi/kagzi"
)

// SyncAccount is a workflow that must run one at a time per account.
var SyncAccount = kagzi.Define("sync-account", func(ctx *kagzi.Context, account string) (string, error) {
	return kagzi.Step(ctx, "sync", func(context.Context) (string, error) { return "synced " + account, nil })
})

// Limits are stored in the database: every worker applies them at its next claim, in
// every process, and a run held back says why.
func ExampleClient_SetLimits() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx := context.Background()

	// At most 10 syncs at once, one at a time per account, 100 a minute.
	limits, err := client.SetLimits(ctx, kagzi.Limits{
		WorkflowType:   "sync-account",
		Concurrency:    10,
		KeyConcurrency: 1,
		Rate:           100, RatePeriod: time.Minute,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(limits.WorkflowType, limits.Concurrency, limits.KeyConcurrency, limits.Rate, limits.RatePeriod)

	// A negative limit is refused, and changes nothing.
	_, err = client.SetLimits(ctx, kagzi.Limits{WorkflowType: "sync-account", Concurrency: -1})
	fmt.Println(err != nil)
	// Output:
	// sync-account 10 1 100 1m0s
	// true
}

// A concurrency key runs the runs of one key one at a time (with KeyConcurrency 1),
// in start order, while other keys run side by side.
func ExampleWithConcurrencyKey() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx := context.Background()
	if _, err := client.SetLimits(ctx, kagzi.Limits{WorkflowType: "sync-account", KeyConcurrency: 1}); err != nil {
		fmt.Println(err)
		return
	}
	w, err := kagzi.NewWorker(client, kagzi.WorkerConfig{}, SyncAccount)
	if err != nil {
		fmt.Println(err)
		return
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() { stop(); <-done }()

	var runs []*kagzi.Run[string]
	for _, account := range []string{"acme", "acme", "globex"} {
		run, err := kagzi.Start(ctx, client, SyncAccount, account,
			kagzi.WithConcurrencyKey(account), kagzi.WithPriority(10))
		if err != nil {
			fmt.Println(err)
			return
		}
		runs = append(runs, run)
	}
	for _, run := range runs {
		out, err := run.Wait(ctx)
		fmt.Println(out, err)
	}
	// Output:
	// synced acme <nil>
	// synced acme <nil>
	// synced globex <nil>
}

// Debounce collapses a burst of starts into one run with the last input.
func ExampleWithDebounce() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx := context.Background()
	w, err := kagzi.NewWorker(client, kagzi.WorkerConfig{}, SyncAccount)
	if err != nil {
		fmt.Println(err)
		return
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() { stop(); <-done }()

	var last *kagzi.Run[string]
	for _, input := range []string{"draft-1", "draft-2", "draft-3"} {
		run, err := kagzi.Start(ctx, client, SyncAccount, input,
			kagzi.WithDebounce("doc-42", 200*time.Millisecond, 5*time.Second))
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(run.AlreadyExists)
		last = run
	}
	out, err := last.Wait(ctx)
	fmt.Println(out, err)
	// Output:
	// false
	// true
	// true
	// synced draft-3 <nil>
}
