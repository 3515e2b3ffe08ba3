package kagzi_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/kagzi/kagzi"
)

func ExampleClient_ListRuns() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, ProcessOrder)
	go worker.Run(ctx)

	for _, id := range []string{"1", "2", "3"} {
		run, _ := kagzi.Start(ctx, client, ProcessOrder, Order{ID: id}, kagzi.WithID("order-"+id))
		_, _ = run.Wait(ctx)
	}

	// Newest first, a page at a time; the token continues where a page ended.
	filter := kagzi.RunFilter{
		WorkflowType: ProcessOrder.Name(),
		Statuses:     []kagzi.RunStatus{kagzi.StatusCompleted},
		PageSize:     2,
	}
	for {
		page, err := client.ListRuns(ctx, filter)
		if err != nil {
			fmt.Println(err)
			return
		}
		for _, r := range page.Runs {
			fmt.Println(r.WorkflowID, r.Status)
		}
		if page.NextPageToken == "" {
			break
		}
		filter.PageToken = page.NextPageToken
	}
	// Output:
	// order-3 COMPLETED
	// order-2 COMPLETED
	// order-1 COMPLETED
}

func ExampleClient_ListSteps() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, ProcessOrder)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, ProcessOrder, Order{ID: "8"}, kagzi.WithID("order-8"))
	_, _ = run.Wait(ctx)

	info, _ := client.GetRun(ctx, run.RunID) // or GetRunByWorkflowID(ctx, "order-8")
	fmt.Println(info.WorkflowType, info.Status, "attempt", info.Attempt, "takeovers", info.Takeovers)

	steps, _ := client.ListSteps(ctx, run.RunID) // the timeline: every step, every attempt
	for _, s := range steps {
		fmt.Println(s.Key, s.Kind, s.Status, string(s.Output), "attempts:", len(s.Attempts))
	}
	// Output:
	// process-order COMPLETED attempt 1 takeovers 0
	// charge-card#1 STEP COMPLETED "tx-8" attempts: 1
}

// gzipCodec compresses every payload (inputs, outputs, signals, events) before it
// reaches PostgreSQL. An encrypting codec has the same shape.
type gzipCodec struct{}

func (gzipCodec) Encode(payload []byte) ([]byte, error) {
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	if _, err := w.Write(payload); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func (gzipCodec) Decode(encoded []byte) ([]byte, error) {
	r, err := gzip.NewReader(bytes.NewReader(encoded))
	if err != nil {
		return nil, err
	}
	return io.ReadAll(r)
}

func ExampleCodec() {
	pool, cleanup := exampleDB()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Every process of the namespace needs the same codec.
	client, _ := kagzi.NewClient(pool, kagzi.Config{Codec: gzipCodec{}, Logger: quietLogger()})
	defer client.Close()
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, ProcessOrder)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, ProcessOrder, Order{ID: "secret-77"})
	receipt, _ := run.Wait(ctx)
	fmt.Println(receipt.TransactionID)

	// The table holds the encoded payload; reads through the client decode it.
	var stored string
	_ = pool.QueryRow(ctx, `SELECT input::text FROM kagzi.runs WHERE run_id = $1`, run.RunID).Scan(&stored)
	fmt.Println(strings.HasPrefix(stored, `{"$kagzi_codec": `), strings.Contains(stored, "secret-77"))
	info, _ := client.GetRun(ctx, run.RunID)
	fmt.Println(string(info.Input))
	// Output:
	// tx-secret-77
	// true false
	// {"id":"secret-77","total":0}
}

// stepLog is a Hooks implementation that records the end of every step attempt.
// Embedding NopHooks implements the other methods, and keeps it compiling when
// methods are added.
type stepLog struct {
	kagzi.NopHooks
	mu    sync.Mutex
	lines []string
}

func (h *stepLog) StepEnd(ctx context.Context, e *kagzi.StepEvent) {
	h.mu.Lock() // hooks are called concurrently, on Kagzi's hot path: be quick
	defer h.mu.Unlock()
	h.lines = append(h.lines, fmt.Sprintf("%s attempt %d: %s", e.Key, e.Attempt, e.Status))
}

func ExampleNopHooks() {
	pool, cleanup := exampleDB()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	hooks := &stepLog{}
	// kagziotel.New gives OpenTelemetry traces and metrics; MultiHooks combines both.
	client, _ := kagzi.NewClient(pool, kagzi.Config{Hooks: hooks, Logger: quietLogger()})
	defer client.Close()

	failures := 0
	flaky := kagzi.Define("flaky", func(ctx *kagzi.Context, _ struct{}) (string, error) {
		return kagzi.Step(ctx, "call", func(context.Context) (string, error) {
			if failures++; failures == 1 {
				return "", errors.New("timeout")
			}
			return "ok", nil
		}, kagzi.WithRetry(kagzi.Linear(3, 10*time.Millisecond)))
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, flaky)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, flaky, struct{}{})
	_, _ = run.Wait(ctx)
	hooks.mu.Lock()
	fmt.Println(strings.Join(hooks.lines, "\n"))
	hooks.mu.Unlock()
	// Output:
	// call#1 attempt 1: FAILED
	// call#1 attempt 2: COMPLETED
}
