package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kagzi/kagzi"
)

func ExampleClient_CancelTx() {
	pool, cleanup := exampleDB()
	defer cleanup()
	ctx := context.Background()
	client, _ := kagzi.NewClient(pool, kagzi.Config{Logger: quietLogger()})
	defer client.Close()
	_, _ = pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, status text)`)
	_, _ = pool.Exec(ctx, `INSERT INTO orders VALUES ('9', 'placed')`)
	run, _ := client.StartByName(ctx, "process-order", Order{ID: "9"}, kagzi.WithID("order-9"))

	// The order is marked cancelled and its run cancelled, together or not at all.
	tx, _ := pool.Begin(ctx)
	defer tx.Rollback(ctx)
	_, _ = tx.Exec(ctx, `UPDATE orders SET status = 'cancelled' WHERE id = '9'`)
	if err := client.CancelTx(ctx, tx, run.RunID); err != nil {
		fmt.Println(err)
		return
	}
	_ = tx.Commit(ctx)

	info, _ := client.GetRun(ctx, run.RunID)
	fmt.Println(info.Status)
	// Output:
	// CANCELLED
}

// A workflow that lives for months continues as new (ContinueAsNew) under one
// workflow id; CancelWorkflow stops it whichever run of the chain is active.
func ExampleClient_CancelWorkflow() {
	pool, cleanup := exampleDB()
	defer cleanup()
	ctx := context.Background()
	client, _ := kagzi.NewClient(pool, kagzi.Config{Logger: quietLogger()})
	defer client.Close()
	_, _ = client.StartByName(ctx, "subscription", "customer-7", kagzi.WithID("subscription-customer-7"))

	if err := client.CancelWorkflow(ctx, "subscription-customer-7"); err != nil {
		fmt.Println(err)
		return
	}
	run, _ := client.GetRunByWorkflowID(ctx, "subscription-customer-7")
	fmt.Println(run.Status)
	fmt.Println(errors.Is(client.CancelWorkflow(ctx, "no-such-workflow"), kagzi.ErrNotFound))
	// Output:
	// CANCELLED
	// true
}

func ExampleSignalKey() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	approvals := kagzi.Define("approvals", func(ctx *kagzi.Context, _ int) ([]string, error) {
		var by []string
		for range 2 {
			a, err := kagzi.WaitSignal[Approval](ctx, "approval", 0)
			if err != nil {
				return nil, err
			}
			by = append(by, a.By)
		}
		return by, nil
	})
	run, _ := kagzi.Start(ctx, client, approvals, 0)

	// A webhook delivered twice carries the same id: the second delivery stores nothing.
	for _, delivery := range []struct{ id, by string }{{"evt-1", "ada"}, {"evt-1", "ada"}, {"evt-2", "bo"}} {
		if err := client.Signal(ctx, run.RunID, "approval", Approval{By: delivery.by}, kagzi.SignalKey(delivery.id)); err != nil {
			fmt.Println(err)
			return
		}
	}
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, approvals)
	go worker.Run(ctx)
	by, err := run.Wait(ctx)
	fmt.Println(by, err)
	// Output:
	// [ada bo] <nil>
}

func ExampleStartChild_withID() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	fulfil := kagzi.Define("fulfil", func(ctx *kagzi.Context, o Order) (string, error) {
		// The child's workflow id is the caller's: "shipment-<order>", easy to look up.
		child, err := kagzi.StartChild(ctx, "ship", ShipOrder, o, kagzi.WithID("shipment-"+o.ID))
		if errors.Is(err, kagzi.ErrAlreadyExists) {
			return "another parent ships order " + o.ID, nil
		}
		if err != nil {
			return "", err
		}
		s, err := child.Get()
		return "shipped with " + s.Carrier, err
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, fulfil, ShipOrder)
	go worker.Run(ctx)

	for range 2 { // two parents ask for the same child id: it belongs to the first
		run, _ := kagzi.Start(ctx, client, fulfil, Order{ID: "1"})
		out, _ := run.Wait(ctx)
		fmt.Println(out)
	}
	shipment, _ := kagzi.RunOfWorkflow[Shipment](ctx, client, "shipment-1")
	s, _ := shipment.Wait(ctx)
	fmt.Println(s.Carrier)
	// Output:
	// shipped with DHL
	// another parent ships order 1
	// DHL
}

func ExampleSchedule_NextFireTimes() {
	s := kagzi.Schedule{ID: "nightly", Cron: "30 2 * * *", TimeZone: "Europe/Paris"}
	// 02:30 does not exist on 30 March 2025 in Paris: that night's tick is 03:00 CEST.
	from := time.Date(2025, 3, 28, 12, 0, 0, 0, time.UTC)
	times, err := s.NextFireTimes(from, 3)
	if err != nil {
		fmt.Println(err)
		return
	}
	paris, _ := time.LoadLocation("Europe/Paris")
	for _, t := range times {
		fmt.Println(t.In(paris).Format("2006-01-02 15:04 MST"))
	}
	// Output:
	// 2025-03-29 02:30 CET
	// 2025-03-30 03:00 CEST
	// 2025-03-31 02:30 CEST
}
