package kagzi_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/kagzi/kagzi"
)

// Finished runs move into the history (tables partitioned by the day they finished)
// ArchiveAfter after they finish; retention then drops a day's partitions at a time.
// Reads find an archived run as before. Here runs are archived at once.
func ExampleConfig_archiveAfter() {
	pool, cleanup := exampleDB()
	defer cleanup()
	client, err := kagzi.NewClient(pool, kagzi.Config{
		ArchiveAfter: time.Millisecond,    // default 15 minutes
		Retention:    90 * 24 * time.Hour, // kept 90 days, then dropped with its day
		Logger:       quietLogger(),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	invoice := kagzi.Define("invoice", func(ctx *kagzi.Context, amount int) (string, error) {
		return kagzi.Step(ctx, "issue", func(context.Context) (string, error) {
			return fmt.Sprintf("invoice for %d", amount), nil
		})
	})
	// The workers archive (and apply the retention) every PruneInterval.
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{PruneInterval: 20 * time.Millisecond}, invoice)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, invoice, 42)
	out, _ := run.Wait(ctx)
	fmt.Println(out)
	for deadline := time.Now().Add(10 * time.Second); worker.ArchivedRuns() == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("archived:", worker.ArchivedRuns())

	// Archived, and read as before.
	info, _ := client.GetRun(ctx, run.RunID)
	steps, _ := client.ListSteps(ctx, run.RunID)
	again, _ := kagzi.RunOf[string](client, run.RunID).Wait(ctx)
	fmt.Println(info.Status, len(steps), again)
	// Output:
	// invoice for 42
	// archived: 1
	// COMPLETED 1 invoice for 42
}
