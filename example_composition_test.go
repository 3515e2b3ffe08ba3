package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kagzi/kagzi"
)

type Approval struct {
	By string `json:"by"`
}

func ExampleWaitSignal() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	expense := kagzi.Define("expense", func(ctx *kagzi.Context, amount int) (string, error) {
		// The run sleeps (SLEEPING, no worker slot) until the signal arrives, for at
		// most the timeout; the outcome is memoized like a step.
		a, err := kagzi.WaitSignal[Approval](ctx, "approval", 72*time.Hour)
		if errors.Is(err, kagzi.ErrSignalTimeout) {
			return "escalated", nil
		}
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%d approved by %s", amount, a.By), nil
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, expense)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, expense, 120)
	// From outside the workflow (an HTTP handler, say). A signal sent before the run
	// waits is kept until it does; each is delivered once, in order.
	if err := client.Signal(ctx, run.RunID, "approval", Approval{By: "ada"}); err != nil {
		fmt.Println(err)
	}
	out, _ := run.Wait(ctx)
	fmt.Println(out)

	// Signalling a finished run stores nothing.
	err := client.Signal(ctx, run.RunID, "approval", Approval{By: "bob"})
	fmt.Println(errors.Is(err, kagzi.ErrRunFinished))
	// Output:
	// 120 approved by ada
	// true
}

func ExampleWaitSignal_timeout() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	expense := kagzi.Define("expense", func(ctx *kagzi.Context, amount int) (string, error) {
		_, err := kagzi.WaitSignal[Approval](ctx, "approval", 300*time.Millisecond)
		if errors.Is(err, kagzi.ErrSignalTimeout) {
			return "escalated to a manager", nil
		}
		return "approved", err
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, expense)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, expense, 120)
	out, _ := run.Wait(ctx)
	fmt.Println(out)
	steps, _ := client.ListSteps(ctx, run.RunID)
	fmt.Println(steps[0].Key, steps[0].Kind, steps[0].Status, steps[0].Error.Code)
	// Output:
	// escalated to a manager
	// approval#1 SIGNAL FAILED DEADLINE_EXCEEDED
}

type Progress struct {
	Percent int `json:"percent"`
}

func ExampleContext_SetEvent() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	export := kagzi.Define("export", func(ctx *kagzi.Context, _ struct{}) (string, error) {
		// An event is a key/value state of the run that callers read or wait for.
		if err := ctx.SetEvent("progress", Progress{Percent: 50}); err != nil {
			return "", err
		}
		if _, err := kagzi.WaitSignal[string](ctx, "go-on", time.Hour); err != nil {
			return "", err
		}
		if err := ctx.SetEvent("progress", Progress{Percent: 100}); err != nil { // replaces the value
			return "", err
		}
		return "exported", nil
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, export)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, export, struct{}{})
	p, err := kagzi.WaitEvent[Progress](ctx, client, run.RunID, "progress", 10*time.Second)
	fmt.Println(p.Percent, err)

	_ = client.Signal(ctx, run.RunID, "go-on", "")
	out, _ := run.Wait(ctx)
	p, err = kagzi.GetEvent[Progress](ctx, client, run.RunID, "progress")
	fmt.Println(out, p.Percent, err)
	// Output:
	// 50 <nil>
	// exported 100 <nil>
}

type Shipment struct {
	Carrier string `json:"carrier"`
}

var ShipOrder = kagzi.Define("ship-order", func(ctx *kagzi.Context, o Order) (Shipment, error) {
	return kagzi.Step(ctx, "book-carrier", func(context.Context) (Shipment, error) {
		return Shipment{Carrier: "DHL"}, nil
	})
})

func ExampleStartChild() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	fulfil := kagzi.Define("fulfil", func(ctx *kagzi.Context, o Order) (string, error) {
		// The start is memoized: a replay of the parent reattaches to the same child.
		child, err := kagzi.StartChild(ctx, "ship", ShipOrder, o)
		if err != nil {
			return "", err
		}
		// The parent sleeps without a slot until the child ends.
		s, err := child.Get()
		if err != nil {
			return "", err
		}
		return "shipped with " + s.Carrier, nil
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, fulfil, ShipOrder)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, fulfil, Order{ID: "1"})
	out, _ := run.Wait(ctx)
	fmt.Println(out)

	children, _ := client.ListRuns(ctx, kagzi.RunFilter{ParentRunID: run.RunID})
	for _, c := range children.Runs {
		// The child's workflow id derives from the parent's run id and the step key.
		fmt.Println(c.WorkflowType, c.Status, strings.TrimPrefix(c.WorkflowID, run.RunID))
	}
	// Output:
	// shipped with DHL
	// ship-order COMPLETED /ship#1
}

func ExampleGo() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	page := kagzi.Define("profile-page", func(ctx *kagzi.Context, userID string) (string, error) {
		// Two branches at once; their steps are keyed by call position, never by
		// which branch finishes first.
		user := kagzi.Go(ctx, "user", func(ctx *kagzi.Context) (string, error) {
			return kagzi.Step(ctx, "get", func(context.Context) (string, error) { return "Ada", nil })
		})
		cart := kagzi.Go(ctx, "cart", func(ctx *kagzi.Context) (int, error) {
			return kagzi.Step(ctx, "get", func(context.Context) (int, error) { return 3, nil })
		})
		name, err := user.Get()
		if err != nil {
			return "", err
		}
		items, err := cart.Get()
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s has %d items in the cart", name, items), nil
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, page)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, page, "u1")
	out, _ := run.Wait(ctx)
	fmt.Println(out)
	steps, _ := client.ListSteps(ctx, run.RunID)
	var keys []string
	for _, s := range steps {
		keys = append(keys, s.Key)
	}
	slices.Sort(keys) // listed in the order they were recorded, which varies
	fmt.Println(keys)
	// Output:
	// Ada has 3 items in the cart
	// [cart#1/get#1 user#1/get#1]
}

func ExampleMap() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	thumbnails := kagzi.Define("thumbnails", func(ctx *kagzi.Context, images []string) ([]string, error) {
		// Each item is a branch; at most 2 run at once. The first error cancels the
		// others (kagzi.CollectAll() runs them all and reports every failure).
		return kagzi.Map(ctx, "resize", images, func(ctx *kagzi.Context, img string) (string, error) {
			return kagzi.Step(ctx, "resize", func(context.Context) (string, error) {
				return strings.TrimSuffix(img, ".png") + "-small.png", nil
			})
		}, kagzi.MaxParallel(2))
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, thumbnails)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, thumbnails, []string{"a.png", "b.png", "c.png"})
	out, _ := run.Wait(ctx)
	fmt.Println(out) // in the items' order
	// Output:
	// [a-small.png b-small.png c-small.png]
}

func ExampleRace() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	quote := kagzi.Define("quote", func(ctx *kagzi.Context, _ struct{}) (string, error) {
		// One step: the first success wins and is recorded, so a replay returns the
		// same winner; the others' contexts are cancelled.
		return kagzi.Race(ctx, "best-quote", []func(context.Context) (string, error){
			func(ctx context.Context) (string, error) {
				select { // a slow provider
				case <-time.After(time.Minute):
					return "quote from A", nil
				case <-ctx.Done():
					return "", ctx.Err()
				}
			},
			func(context.Context) (string, error) { return "quote from B", nil },
		})
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, quote)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, quote, struct{}{})
	out, _ := run.Wait(ctx)
	fmt.Println(out)
	// Output:
	// quote from B
}
