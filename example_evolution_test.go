package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kagzi/kagzi"
)

func ExampleContext_Patched() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx := context.Background()

	pack := func(ctx *kagzi.Context) error {
		_, err := kagzi.Step(ctx, "pack", func(context.Context) (string, error) { return "packed", nil })
		return err
	}
	// The code deployed first: pack, let the glue dry, ship.
	oldCode := kagzi.Define("ship", func(ctx *kagzi.Context, _ struct{}) (string, error) {
		if err := pack(ctx); err != nil {
			return "", err
		}
		if err := ctx.Sleep("dry", 300*time.Millisecond); err != nil {
			return "", err
		}
		return "shipped", nil
	})
	// The next deploy insures parcels. A run that was already past this point under
	// the old code must not meet a new step there: Patched tells the two apart.
	newCode := kagzi.Define("ship", func(ctx *kagzi.Context, _ struct{}) (string, error) {
		if err := pack(ctx); err != nil {
			return "", err
		}
		insured := ctx.Patched("insure-parcels")
		if insured {
			if _, err := kagzi.Step(ctx, "insure", func(context.Context) (string, error) { return "ok", nil }); err != nil {
				return "", err
			}
		}
		if err := ctx.Sleep("dry", 300*time.Millisecond); err != nil {
			return "", err
		}
		return fmt.Sprintf("shipped, insured: %v", insured), nil
	})

	oldCtx, stopOld := context.WithCancel(ctx)
	oldWorker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, oldCode)
	oldDone := make(chan error)
	go func() { oldDone <- oldWorker.Run(oldCtx) }()
	inFlight, _ := kagzi.Start(ctx, client, oldCode, struct{}{})
	waitForStatus(ctx, client, inFlight.RunID, kagzi.StatusSleeping)

	// The deploy: the old worker stops while the run sleeps, the new one takes over.
	stopOld()
	<-oldDone
	newCtx, stopNew := context.WithCancel(ctx)
	defer stopNew()
	newWorker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, newCode)
	go newWorker.Run(newCtx)
	fresh, _ := kagzi.Start(ctx, client, newCode, struct{}{})

	out, err := inFlight.Wait(ctx)
	fmt.Println("run in flight:", out, err)
	out, err = fresh.Wait(ctx)
	fmt.Println("new run:", out, err)
	// Output:
	// run in flight: shipped, insured: false <nil>
	// new run: shipped, insured: true <nil>
}

func ExampleWithVersion() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	greetV1 := kagzi.Define("greet", func(ctx *kagzi.Context, name string) (string, error) {
		return "hello " + name, nil
	}, kagzi.WithVersion("1"))
	greetV2 := kagzi.Define("greet", func(ctx *kagzi.Context, name string) (string, error) {
		return "hi " + name, nil
	}, kagzi.WithVersion("2"))

	// During a deploy, old and new workers run side by side: a worker claims only
	// the versions it registered, so each finishes its own runs.
	oldWorker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, greetV1)
	newWorker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, greetV2)
	go oldWorker.Run(ctx)
	go newWorker.Run(ctx)

	a, _ := kagzi.Start(ctx, client, greetV1, "ada")
	b, _ := kagzi.Start(ctx, client, greetV2, "bob")
	// By name, WithRunVersion picks the version.
	c, _ := client.StartByName(ctx, "greet", "cy", kagzi.WithRunVersion("1"))

	outA, _ := a.Wait(ctx)
	outB, _ := b.Wait(ctx)
	outC, _ := c.Wait(ctx)
	fmt.Println(outA, "|", outB, "|", string(outC))

	v := "2"
	page, _ := client.ListRuns(ctx, kagzi.RunFilter{Version: &v})
	fmt.Println("runs of version 2:", len(page.Runs))
	// Output:
	// hello ada | hi bob | "hello cy"
	// runs of version 2: 1
}

func ExampleClient_Cancel() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	started := make(chan struct{})
	var once atomic.Bool
	crawl := kagzi.Define("crawl", func(ctx *kagzi.Context, site string) (int, error) {
		return kagzi.Step(ctx, "fetch-pages", func(ctx context.Context) (int, error) {
			if once.CompareAndSwap(false, true) {
				close(started)
			}
			<-ctx.Done() // a long step; the cancel cancels its context
			return 0, ctx.Err()
		})
	})

	// A run no worker has claimed yet ends CANCELLED at once.
	pending, _ := kagzi.Start(ctx, client, crawl, "a.example")
	fmt.Println(client.Cancel(ctx, pending.RunID))
	_, err := pending.Wait(ctx)
	fmt.Println(errors.Is(err, kagzi.ErrCancelled))

	// A RUNNING run: its worker hears of the cancel at once and cancels its context.
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, crawl)
	go worker.Run(ctx)
	running, _ := kagzi.Start(ctx, client, crawl, "b.example")
	<-started
	fmt.Println(client.Cancel(ctx, running.RunID))
	_, err = running.Wait(ctx)
	fmt.Println(errors.Is(err, kagzi.ErrCancelled))
	steps, _ := client.ListSteps(ctx, running.RunID)
	fmt.Println("steps recorded:", len(steps)) // the interrupted attempt is not recorded

	fmt.Println(client.Cancel(ctx, running.RunID)) // cancelling again is a no-op
	// Output:
	// <nil>
	// true
	// <nil>
	// true
	// steps recorded: 0
	// <nil>
}

func ExampleClient_Rerun() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var downloads atomic.Int32
	var fixed atomic.Bool // the fix, deployed between the failure and the rerun
	importFile := kagzi.Define("import", func(ctx *kagzi.Context, file string) (string, error) {
		rows, err := kagzi.Step(ctx, "download", func(context.Context) (int, error) {
			downloads.Add(1)
			return 3, nil
		})
		if err != nil {
			return "", err
		}
		return kagzi.Step(ctx, "load", func(context.Context) (string, error) {
			if !fixed.Load() {
				return "", errors.New("column total is missing")
			}
			return fmt.Sprintf("%d rows loaded", rows), nil
		}, kagzi.WithRetry(kagzi.NoRetry()))
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, importFile)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, importFile, "orders.csv")
	_, err := run.Wait(ctx)
	fmt.Println(err != nil, kagzi.ErrorCode(err))

	fixed.Store(true)
	// From the failed step on: completed steps replay, the run's attempt goes up.
	if err := client.Rerun(ctx, run.RunID); err != nil {
		fmt.Println(err)
	}
	out, err := run.Wait(ctx)
	fmt.Println(out, err)
	info, _ := client.GetRun(ctx, run.RunID)
	fmt.Println("downloads:", downloads.Load(), "attempt:", info.Attempt)

	// Only a FAILED or CANCELLED run can be rerun.
	fmt.Println(errors.Is(client.Rerun(ctx, run.RunID), kagzi.ErrInvalidArgument))
	// Output:
	// true STEP_ERROR
	// 3 rows loaded <nil>
	// downloads: 1 attempt: 2
	// true
}

func ExampleClient_Fork() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var quotes atomic.Int32
	book := kagzi.Define("book-trip", func(ctx *kagzi.Context, city string) (string, error) {
		price, err := kagzi.Step(ctx, "quote", func(context.Context) (int, error) {
			quotes.Add(1)
			return 420, nil
		})
		if err != nil {
			return "", err
		}
		return kagzi.Step(ctx, "book", func(context.Context) (string, error) {
			return fmt.Sprintf("booked %s for %d", city, price), nil
		})
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, book)
	go worker.Run(ctx)

	origin, _ := kagzi.Start(ctx, client, book, "Lisbon")
	out, _ := origin.Wait(ctx)
	fmt.Println(out)

	// A new run holding copies of the steps recorded before book#1, with another
	// input: it replays the quote and runs from book#1 on. The origin is untouched.
	fork, err := client.Fork(ctx, origin.RunID, "book#1", kagzi.ForkOptions{Input: "Porto"})
	if err != nil {
		fmt.Println(err)
		return
	}
	raw, _ := fork.Wait(ctx)
	fmt.Println(string(raw), "| quotes made:", quotes.Load())
	info, _ := client.GetRun(ctx, fork.RunID)
	fmt.Println(info.ForkedFromRunID == origin.RunID, info.ForkedFromStep)
	// Output:
	// booked Lisbon for 420
	// "booked Porto for 420" | quotes made: 1
	// true book#1
}

// A workflow that runs for ever continues as new every so many iterations, so that its
// history (and the cost of resuming it) stays small.
func ExampleContinueAsNew() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx := context.Background()
	type Tally struct{ Seen, Goal int }
	tally := kagzi.Define("tally", func(ctx *kagzi.Context, t Tally) (int, error) {
		for i := 0; i < 2 && t.Seen < t.Goal; i++ { // two items per run
			n, err := kagzi.Step(ctx, "count", func(context.Context) (int, error) { return t.Seen + 1, nil })
			if err != nil {
				return 0, err
			}
			t.Seen = n
		}
		if t.Seen < t.Goal {
			return 0, kagzi.ContinueAsNew(ctx, t)
		}
		return t.Seen, nil
	})
	w, err := kagzi.NewWorker(client, kagzi.WorkerConfig{}, tally)
	if err != nil {
		fmt.Println(err)
		return
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() { stop(); <-done }()

	run, err := kagzi.Start(ctx, client, tally, Tally{Goal: 5}, kagzi.WithID("tally-1"))
	if err != nil {
		fmt.Println(err)
		return
	}
	total, err := run.Wait(ctx) // follows the chain of runs to the last one
	fmt.Println(total, err)
	first, _ := client.GetRun(ctx, run.RunID)
	fmt.Println(first.Status, first.ContinuedAsRunID != "")
	// Output:
	// 5 <nil>
	// COMPLETED true
}
