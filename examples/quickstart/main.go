// Command quickstart is the smallest complete Kagzi program: it defines a workflow
// with a few steps and a durable sleep, runs a worker in the same process, starts a
// run, waits for its result and prints what Kagzi recorded about it.
//
//	go run ./examples/quickstart      # needs a PostgreSQL server, see below
//	scripts/quickstart                # finds a local server or starts a throwaway one
//
// PostgreSQL is the one KAGZI_DATABASE_URL or DATABASE_URL names, else
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable. Kagzi's tables live in
// the "kagzi" schema of that database; this example's runs live in the namespace
// "quickstart".
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Greeting is the workflow's input.
type Greeting struct {
	Name string `json:"name"`
}

// Card is the workflow's output.
type Card struct {
	Message string `json:"message"`
	Signed  string `json:"signed"`
}

// coolDown is longer than the worker's MaxInProcessSleep (200ms by default), so the
// run is released while it sleeps: it becomes SLEEPING, holds no goroutine, and the
// worker resumes it at its wake time by calling the workflow again from the top.
const coolDown = 2 * time.Second

var calls atomic.Int64

// GreetingCard is a workflow of three memoized steps around a durable sleep. When the
// run resumes after the sleep, "compose" and "decorate" return their recorded outputs
// without running again (their print lines appear once), and "sign" runs.
var GreetingCard = kagzi.Define("greeting-card", func(ctx *kagzi.Context, in Greeting) (Card, error) {
	// Only for the printout: count how often this process calls the workflow function.
	// (Workflow logic must not depend on such state; see "Determinism" in the docs.)
	fmt.Printf("  workflow function call #%d\n", calls.Add(1))
	msg, err := kagzi.Step(ctx, "compose", func(context.Context) (string, error) {
		fmt.Printf("  step compose:  writing a greeting for %s\n", in.Name)
		return "Hello, " + in.Name, nil
	})
	if err != nil {
		return Card{}, err
	}
	msg, err = kagzi.Step(ctx, "decorate", func(context.Context) (string, error) {
		fmt.Println("  step decorate: adding some flourish")
		return "*** " + msg + "! ***", nil
	})
	if err != nil {
		return Card{}, err
	}

	fmt.Printf("  sleep cool-down: %v\n", coolDown)
	if err := ctx.Sleep("cool-down", coolDown); err != nil {
		return Card{}, err
	}
	fmt.Println("  cool-down is over")

	signed, err := kagzi.Step(ctx, "sign", func(context.Context) (string, error) {
		// Reading the clock is not deterministic, so it belongs in a step: its output
		// is recorded and replayed.
		fmt.Println("  step sign:     signing the card")
		return "Kagzi, " + time.Now().UTC().Format(time.RFC3339), nil
	})
	if err != nil {
		return Card{}, err
	}
	return Card{Message: msg, Signed: signed}, nil
})

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	dbURL := databaseURL()
	pool, err := connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	// Create or update Kagzi's tables (in the "kagzi" schema). Safe to call on every start.
	if err := kagzi.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}

	// Kagzi logs through log/slog; warnings and errors are enough here.
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	client, err := kagzi.NewClient(pool, kagzi.Config{Namespace: "quickstart", Logger: logger})
	if err != nil {
		return err
	}

	// A worker in the same process. Run claims runs until its context is done, then
	// drains and returns.
	worker, err := kagzi.NewWorker(client, kagzi.WorkerConfig{}, GreetingCard)
	if err != nil {
		return err
	}
	workerCtx, stopWorker := context.WithCancel(ctx)
	defer stopWorker()
	workerDone := make(chan error, 1)
	go func() { workerDone <- worker.Run(workerCtx) }()

	// The workflow id is the run's idempotency key: starting the same id again while
	// the run is active returns that run. A timestamp makes each invocation new.
	workflowID := fmt.Sprintf("greeting-%s", time.Now().UTC().Format("20060102T150405.000000000"))
	started := time.Now()
	r, err := kagzi.Start(ctx, client, GreetingCard, Greeting{Name: "Ada"}, kagzi.WithID(workflowID))
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	fmt.Printf("started run %s\n  workflow id %s (type %s)\n", r.RunID, r.WorkflowID, r.WorkflowType)

	card, err := r.Wait(ctx)
	if err != nil {
		return fmt.Errorf("wait: %w", err)
	}
	fmt.Printf("\nresult after %v:\n  message: %s\n  signed:  %s\n",
		time.Since(started).Round(time.Millisecond), card.Message, card.Signed)

	// What Kagzi recorded: every step with its attempts, and the run itself.
	steps, err := client.ListSteps(ctx, r.RunID)
	if err != nil {
		return fmt.Errorf("list steps: %w", err)
	}
	fmt.Println("\nstep timeline:")
	fmt.Printf("  %-14s %-6s %-10s %-9s %s\n", "KEY", "KIND", "STATUS", "ATTEMPTS", "DETAIL")
	for _, s := range steps {
		detail := ""
		switch {
		case s.WakeAt != nil:
			detail = fmt.Sprintf("wake at %s (+%v after recorded)",
				s.WakeAt.Local().Format("15:04:05.000"), s.WakeAt.Sub(s.CreatedAt).Round(time.Millisecond))
		case len(s.Output) > 0:
			detail = "output " + truncate(string(s.Output), 50)
		}
		if s.Error != nil {
			detail = "error " + s.Error.String()
		}
		fmt.Printf("  %-14s %-6s %-10s %-9d %s\n", s.Key, s.Kind, s.Status, len(s.Attempts), detail)
	}

	info, err := client.GetRun(ctx, r.RunID)
	if err != nil {
		return fmt.Errorf("get run: %w", err)
	}
	fmt.Printf("\nrun %s: status %s, attempt %d", info.RunID, info.Status, info.Attempt)
	if info.StartedAt != nil && info.FinishedAt != nil {
		fmt.Printf(", ran %v from first claim to finish", info.FinishedAt.Sub(*info.StartedAt).Round(time.Millisecond))
	}
	fmt.Printf("\n  output %s\n", info.Output)

	// Shut the worker down and wait for it to drain.
	stopWorker()
	if err := <-workerDone; err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	fmt.Println("\nworker stopped; done")
	return nil
}

// databaseURL is KAGZI_DATABASE_URL, else DATABASE_URL, else a local default.
func databaseURL() string {
	for _, v := range []string{"KAGZI_DATABASE_URL", "DATABASE_URL"} {
		if u := os.Getenv(v); u != "" {
			return u
		}
	}
	return defaultDatabaseURL
}

// connect opens a pool and checks that the server answers, with a hint when it does not.
func connect(ctx context.Context, dbURL string) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, dbURL)
	if err == nil {
		pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = pool.Ping(pingCtx)
		cancel()
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf(`cannot reach PostgreSQL at %s: %w

Point the example at a server with DATABASE_URL (or KAGZI_DATABASE_URL), e.g.
  DATABASE_URL='postgres://user:password@localhost:5432/dbname?sslmode=disable' go run ./examples/quickstart
or run scripts/quickstart, which finds a local server or starts a throwaway one`,
			redact(dbURL), err)
	}
	return pool, nil
}

// redact hides a password in a URL for printing.
func redact(dbURL string) string {
	if u, err := url.Parse(dbURL); err == nil && u.Scheme != "" {
		return u.Redacted()
	}
	if strings.Contains(dbURL, "password") {
		return "(connection string)"
	}
	return dbURL
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
