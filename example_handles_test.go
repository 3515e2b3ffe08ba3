package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kagzi/kagzi"
)

func ExampleRunOf() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, ProcessOrder)
	go worker.Run(ctx)

	// POST /orders starts the run and answers with its id...
	run, err := kagzi.Start(ctx, client, ProcessOrder, Order{ID: "5"}, kagzi.WithID("order-5"))
	if err != nil {
		fmt.Println(err)
		return
	}
	runID := run.RunID

	// ...and GET /orders/5/receipt, in another request or process, waits for the result.
	receipt, err := kagzi.RunOf[Receipt](client, runID).Wait(ctx)
	fmt.Println(receipt.TransactionID, err)

	// The workflow id is enough too.
	byID, err := kagzi.RunOfWorkflow[Receipt](ctx, client, "order-5")
	if err != nil {
		fmt.Println(err)
		return
	}
	receipt, err = byID.Wait(ctx)
	fmt.Println(byID.WorkflowType, receipt.TransactionID, err)
	// Output:
	// tx-5 <nil>
	// process-order tx-5 <nil>
}

func ExampleRequireWorker() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// A typo in a type name would wait PENDING for ever; RequireWorker refuses it.
	_, err := client.StartByName(ctx, "proces-order", Order{ID: "1"}, kagzi.RequireWorker())
	fmt.Println(errors.Is(err, kagzi.ErrNoWorker))

	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, ProcessOrder)
	go worker.Run(ctx)
	for { // the worker registers as it starts
		if _, err = client.StartByName(ctx, "process-order", Order{ID: "1"}, kagzi.RequireWorker()); !errors.Is(err, kagzi.ErrNoWorker) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println(err)
	// Output:
	// true
	// <nil>
}
