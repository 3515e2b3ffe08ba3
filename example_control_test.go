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
