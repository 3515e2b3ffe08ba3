package kagzi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/testdb"
)

// The examples run against a real PostgreSQL server: the one KAGZI_DATABASE_URL or
// DATABASE_URL names, else postgres@127.0.0.1:5432 (scripts/test finds or starts
// one). Each example gets a database of its own, so examples never see each other's
// runs, workers or schedules.

// exampleDB gives an example its own migrated database (in real code: your DSN and
// kagzi.Migrate) and returns a pool on it and a function that drops it.
func exampleDB() (*pgxpool.Pool, func()) {
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
	return pool, func() { pool.Close(); drop() }
}

// exampleSetup is exampleDB with a client of the default namespace.
func exampleSetup() (*kagzi.Client, func()) {
	pool, cleanup := exampleDB()
	client, err := kagzi.NewClient(pool, kagzi.Config{Logger: quietLogger()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	return client, func() { client.Close(); cleanup() }
}

// waitForStatus polls a run until it has the status, for up to 10 seconds, and
// returns the status it saw last (examples only: real code waits with Run.Wait).
func waitForStatus(ctx context.Context, client *kagzi.Client, runID string, status kagzi.RunStatus) kagzi.RunStatus {
	var seen kagzi.RunStatus
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if info, err := client.GetRun(ctx, runID); err == nil {
			if seen = info.Status; seen == status {
				break
			}
		}
	}
	return seen
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

	// From an HTTP handler: the workflow id makes the start idempotent.
	run, err := kagzi.Start(ctx, client, ProcessOrder, Order{ID: "123", Total: 9.99}, kagzi.WithID("order-123"))
	if err != nil {
		fmt.Println(err)
		return
	}
	again, _ := kagzi.Start(ctx, client, ProcessOrder, Order{ID: "123", Total: 9.99}, kagzi.WithID("order-123"))
	fmt.Println("second start returned the same run:", again.AlreadyExists && again.RunID == run.RunID)

	// A worker, usually in the same process, claims the run and executes it.
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, ProcessOrder)
	go worker.Run(ctx)

	receipt, err := run.Wait(ctx) // typed result; listens for the end, does not spin
	fmt.Println(receipt.TransactionID, err)
	// Output:
	// second start returned the same run: true
	// tx-123 <nil>
}

func ExampleStartTx() {
	pool, cleanup := exampleDB()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, _ := kagzi.NewClient(pool, kagzi.Config{Logger: quietLogger()})
	defer client.Close()
	_, _ = pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, total numeric)`) // the application's own table

	// The order row and the run that processes it commit together, or neither does.
	placeOrder := func(o Order, commit bool) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, total) VALUES ($1, $2)`, o.ID, o.Total); err != nil {
			fmt.Println(err)
			return
		}
		if _, err := kagzi.StartTx(ctx, tx, client, ProcessOrder, o, kagzi.WithID("order-"+o.ID)); err != nil {
			fmt.Println(err)
			return
		}
		if commit {
			_ = tx.Commit(ctx)
		}
	}
	placeOrder(Order{ID: "1", Total: 20}, true)
	placeOrder(Order{ID: "2", Total: 30}, false) // rolled back: no order, no run

	page, _ := client.ListRuns(ctx, kagzi.RunFilter{})
	for _, r := range page.Runs {
		fmt.Println(r.WorkflowID, r.Status)
	}
	var orders int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders)
	fmt.Println("orders:", orders)
	// Output:
	// order-1 PENDING
	// orders: 1
}

func ExampleClient_StartByName() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// A caller without the Go definition at hand (another service, a script) starts
	// the workflow by its type name; the input is encoded with encoding/json.
	run, err := client.StartByName(ctx, "process-order", map[string]any{"id": "9", "total": 5})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(run.WorkflowType, "started; no worker runs it yet")

	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, ProcessOrder)
	go worker.Run(ctx)

	out, err := run.Wait(ctx) // the output as JSON
	if err != nil {
		fmt.Println(err)
		return
	}
	var receipt Receipt
	_ = json.Unmarshal(out, &receipt)
	fmt.Println(receipt.TransactionID)
	// Output:
	// process-order started; no worker runs it yet
	// tx-9
}

func ExampleWithID() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, ProcessOrder)
	go worker.Run(ctx)

	// One active run per workflow id: a retried request finds the run it started.
	first, _ := kagzi.Start(ctx, client, ProcessOrder, Order{ID: "42"}, kagzi.WithID("order-42"))
	_, _ = first.Wait(ctx)

	// Once that run finished, the same id starts a new run...
	second, _ := kagzi.Start(ctx, client, ProcessOrder, Order{ID: "42"}, kagzi.WithID("order-42"))
	fmt.Println("after the finish, a new run:", !second.AlreadyExists && second.RunID != first.RunID)
	_, _ = second.Wait(ctx)

	// ...unless the run was started with IDReuseNever: then the id is an idempotency
	// key for good, and a later start returns the finished run.
	once, _ := kagzi.Start(ctx, client, ProcessOrder, Order{ID: "43"}, kagzi.WithID("order-43"),
		kagzi.WithIDReuse(kagzi.IDReuseNever))
	_, _ = once.Wait(ctx)
	again, _ := kagzi.Start(ctx, client, ProcessOrder, Order{ID: "43"}, kagzi.WithID("order-43"),
		kagzi.WithIDReuse(kagzi.IDReuseNever))
	fmt.Println("IDReuseNever returns the finished run:", again.AlreadyExists && again.RunID == once.RunID)

	// An id whose active run is of another workflow type is an error.
	_, _ = client.StartByName(ctx, "send-invoice", nil, kagzi.WithID("invoice-7")) // no worker runs it: PENDING
	_, err := kagzi.Start(ctx, client, ProcessOrder, Order{ID: "7"}, kagzi.WithID("invoice-7"))
	fmt.Println(errors.Is(err, kagzi.ErrAlreadyExists))
	// Output:
	// after the finish, a new run: true
	// IDReuseNever returns the finished run: true
	// true
}

func ExampleStartMany() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, ProcessOrder)
	go worker.Run(ctx)

	// One statement, one commit and one notification for all of them.
	runs, err := kagzi.StartMany(ctx, client, ProcessOrder, []Order{{ID: "a"}, {ID: "b"}, {ID: "c"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, run := range runs { // in the inputs' order
		receipt, _ := run.Wait(ctx)
		fmt.Println(receipt.TransactionID)
	}
	// Output:
	// tx-a
	// tx-b
	// tx-c
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

	info, _ := client.GetWorker(context.Background(), worker.ID())
	fmt.Println(info.Status, info.CompletedTotal)
	// Output:
	// tx-7
	// <nil>
	// OFFLINE 1
}

func ExampleClient_Health() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, ProcessOrder)
	go worker.Run(ctx)
	run, _ := kagzi.Start(ctx, client, ProcessOrder, Order{ID: "1"})
	_, _ = run.Wait(ctx) // the worker is up

	// A run of a type that no live worker registered waits: Health names the type.
	_, _ = client.StartByName(ctx, "send-invoice", nil)

	h := client.Health(ctx) // for readiness and liveness probes; it takes no lock
	fmt.Println("database:", h.DatabaseOK, "schema current:", h.SchemaCurrent)
	for _, w := range h.Workers {
		fmt.Println("worker:", w.Status, "stale:", w.Stale)
	}
	fmt.Println("ready runs without a worker:", h.PendingTypesWithoutWorker)
	fmt.Println("healthy:", h.Healthy())
	// Output:
	// database: true schema current: true
	// worker: ONLINE stale: false
	// ready runs without a worker: [send-invoice]
	// healthy: true
}

func ExampleUnavailableError() {
	// A pool on a server that does not answer (nothing listens on port 1).
	pool, _ := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/app?connect_timeout=2")
	defer pool.Close()
	client, _ := kagzi.NewClient(pool, kagzi.Config{Logger: quietLogger()})

	_, err := kagzi.Start(context.Background(), client, ProcessOrder, Order{ID: "5"}, kagzi.WithID("order-5"))
	var ue *kagzi.UnavailableError
	if errors.As(err, &ue) {
		// The connection was never made, so the start did not commit. Had it broken
		// after the start was sent, MayHaveCommitted would say so; starting again with
		// the same WithID is safe either way.
		fmt.Println(errors.Is(err, kagzi.ErrUnavailable), "may have committed:", ue.MayHaveCommitted)
	}
	// Output:
	// true may have committed: false
}
