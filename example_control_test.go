package kagzi_test

import (
	"context"
	"fmt"

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
