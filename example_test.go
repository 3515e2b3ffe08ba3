package kagzi_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/testdb"
)

// exampleSetup gives an example its own migrated database (in real code: your DSN
// and kagzi.Migrate) and a client.
func exampleSetup() (*kagzi.Client, func()) {
	ctx := context.Background()
	dsn, drop, err := testdb.Create(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := kagzi.Migrate(ctx, pool); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	client, err := kagzi.NewClient(pool, kagzi.Config{Logger: quietLogger()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	return client, func() { pool.Close(); drop() }
}

type Order struct {
	ID    string  `json:"id"`
	Total float64 `json:"total"`
}

type Receipt struct {
	OrderID       string `json:"order_id"`
	TransactionID string `json:"transaction_id"`
}

// ProcessOrder is a workflow: a Go function of steps, registered under a name.
var ProcessOrder = kagzi.Define("process-order", func(ctx *kagzi.Context, o Order) (Receipt, error) {
	tx, err := kagzi.Step(ctx, "charge-card", func(ctx context.Context) (string, error) {
		return "tx-" + o.ID, nil // call the payment provider here
	}, kagzi.WithStepTimeout(2*time.Minute))
	if err != nil {
		return Receipt{}, err
	}
	return Receipt{OrderID: o.ID, TransactionID: tx}, nil
})

func ExampleStart() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, ProcessOrder)
	go worker.Run(ctx)

	// From an HTTP handler: the workflow id makes the start idempotent.
	run, err := kagzi.Start(ctx, client, ProcessOrder, Order{ID: "123", Total: 9.99}, kagzi.WithID("order-123"))
	if err != nil {
		fmt.Println(err)
		return
	}
	again, _ := kagzi.Start(ctx, client, ProcessOrder, Order{ID: "123", Total: 9.99}, kagzi.WithID("order-123"))
	fmt.Println("second start returned the same run:", again.AlreadyExists && again.RunID == run.RunID)

	receipt, err := run.Wait(ctx)
	fmt.Println(receipt.TransactionID, err)
	// Output:
	// second start returned the same run: true
	// tx-123 <nil>
}

func ExampleStep() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var calls atomic.Int32
	countdown := kagzi.Define("countdown", func(ctx *kagzi.Context, from int) ([]string, error) {
		var lines []string
		for i := from; i > 0; i-- {
			// The same name in a loop: keys "say#1", "say#2", ...
			line, err := kagzi.Step(ctx, "say", func(context.Context) (string, error) {
				calls.Add(1)
				return fmt.Sprint(i), nil
			})
			if err != nil {
				return nil, err
			}
			lines = append(lines, line)
		}
		// A sleep longer than MaxInProcessSleep releases the run; when it resumes, the
		// function runs again from the top and the steps above replay their outputs.
		if err := ctx.Sleep("pause", 300*time.Millisecond); err != nil {
			return nil, err
		}
		return append(lines, "liftoff"), nil
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, countdown)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, countdown, 3)
	out, _ := run.Wait(ctx)
	fmt.Println(out, "step bodies ran:", calls.Load())
	steps, _ := client.ListSteps(ctx, run.RunID)
	for _, s := range steps {
		fmt.Println(s.Key, s.Kind, s.Status)
	}
	// Output:
	// [3 2 1 liftoff] step bodies ran: 3
	// say#1 STEP COMPLETED
	// say#2 STEP COMPLETED
	// say#3 STEP COMPLETED
	// pause#1 SLEEP COMPLETED
}

func ExampleContext_Sleep() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	reminder := kagzi.Define("reminder", func(ctx *kagzi.Context, who string) (string, error) {
		// Durable: the wake time is recorded, the run holds no worker slot while it
		// sleeps, and any worker resumes it at the wake time, even after a restart.
		if err := ctx.Sleep("wait-a-moment", time.Second); err != nil {
			return "", err
		}
		return kagzi.Step(ctx, "remind", func(context.Context) (string, error) {
			return "reminded " + who, nil
		})
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, reminder)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, reminder, "ada")
	info, _ := client.GetRun(ctx, run.RunID)
	for info.Status == kagzi.StatusPending || info.Status == kagzi.StatusRunning {
		time.Sleep(20 * time.Millisecond)
		info, _ = client.GetRun(ctx, run.RunID)
	}
	fmt.Println("while asleep:", info.Status)
	out, _ := run.Wait(ctx)
	fmt.Println(out)
	// Output:
	// while asleep: SLEEPING
	// reminded ada
}

func ExampleWorker_Run() {
	client, cleanup := exampleSetup()
	defer cleanup()

	worker, err := kagzi.NewWorker(client, kagzi.WorkerConfig{
		MaxConcurrent: 50,              // runs executed at once
		DrainTimeout:  5 * time.Second, // on shutdown, how long running workflows may finish
	}, ProcessOrder)
	if err != nil {
		fmt.Println(err)
		return
	}
	// In a service: ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- worker.Run(ctx) }()

	run, _ := kagzi.Start(ctx, client, ProcessOrder, Order{ID: "7"})
	receipt, _ := run.Wait(ctx)
	fmt.Println(receipt.TransactionID)

	stop()              // stop claiming, drain, hand back what is still running
	fmt.Println(<-done) // Run returns nil after a graceful drain
	// Output:
	// tx-7
	// <nil>
}
