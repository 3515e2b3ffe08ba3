package kagzi_test

import (
	"context"
	"fmt"

	"github.com/kagzi/kagzi"
)

func ExampleWithAttributes() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx := context.Background()

	// Attributes are searchable: list a customer's runs without knowing their ids.
	for i, customer := range []string{"c-42", "c-7", "c-42"} {
		_, err := client.StartByName(ctx, "process-order", Order{ID: fmt.Sprint(i)}, kagzi.WithID(fmt.Sprint("order-", i)),
			kagzi.WithAttributes(map[string]any{"customer": customer, "channel": "web"}))
		if err != nil {
			fmt.Println(err)
			return
		}
	}
	page, err := client.ListRuns(ctx, kagzi.RunFilter{Attributes: map[string]any{"customer": "c-42"}, OldestFirst: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range page.Runs {
		fmt.Println(r.WorkflowID, r.Attributes["customer"], r.Attributes["channel"])
	}
	// Output:
	// order-0 c-42 web
	// order-2 c-42 web
}

func ExampleContext_SetAttributes() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	ship := kagzi.Define("ship", func(ctx *kagzi.Context, o Order) (string, error) {
		// Durable and memoized: a replay of the run does not write again.
		if err := ctx.SetAttributes(map[string]any{"stage": "packed", "carrier": "DHL"}); err != nil {
			return "", err
		}
		// A nil value removes its key.
		if err := ctx.SetAttributes(map[string]any{"stage": "shipped", "carrier": nil}); err != nil {
			return "", err
		}
		return "ok", nil
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, ship)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, ship, Order{ID: "1"}, kagzi.WithAttributes(map[string]any{"order": "1"}))
	_, _ = run.Wait(ctx)
	info, _ := client.GetRun(ctx, run.RunID)
	fmt.Println(info.Attributes)
	shipped, _ := client.ListRuns(ctx, kagzi.RunFilter{Attributes: map[string]any{"stage": "shipped"}})
	fmt.Println(len(shipped.Runs))
	// Output:
	// map[order:1 stage:shipped]
	// 1
}
