package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

var napper = kagzi.Define("napper", func(ctx *kagzi.Context, ms int) (string, error) {
	if err := ctx.Sleep("nap", time.Duration(ms)*time.Millisecond); err != nil {
		return "", err
	}
	return fmt.Sprintf("napped %dms", ms), nil
})

var failingChild = kagzi.Define("failing-child", func(ctx *kagzi.Context, _ int) (int, error) {
	return 0, &kagzi.Error{Code: "child_broke", Message: "the child broke", NonRetryable: true}
})

func TestChildResultIsAwaitedWhileTheParentSleeps(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	parent := kagzi.Define("parent", func(ctx *kagzi.Context, _ int) (string, error) {
		child, err := kagzi.StartChild(ctx, "nap", napper, 700)
		if err != nil {
			return "", err
		}
		return child.Get()
	})
	runWorker(t, e.client, fastWorker(), parent, napper)
	run, err := kagzi.Start(ctx, e.client, parent, 0)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the parent to sleep while its child runs", func() bool {
		return runStatus(t, e.client, run.RunID) == kagzi.StatusSleeping
	})
	if out, err := run.Wait(ctx); err != nil || out != "napped 700ms" {
		t.Fatalf("got %q, %v", out, err)
	}
	page, err := e.client.ListRuns(ctx, kagzi.RunFilter{ParentRunID: run.RunID})
	if err != nil || len(page.Runs) != 1 {
		t.Fatalf("children: %+v, %v", page, err)
	}
	child := page.Runs[0]
	if child.ParentRunID != run.RunID || child.ParentStepKey != "nap#1" || child.WorkflowID != run.RunID+"/nap#1" ||
		child.Status != kagzi.StatusCompleted {
		t.Fatalf("child %+v", child)
	}
}

func TestAChildIsStartedOnceAcrossReplaysEvenAfterItFinished(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var executions atomic.Int32
	parent := kagzi.Define("replaying-parent", func(ctx *kagzi.Context, _ int) (string, error) {
		executions.Add(1)
		child, err := kagzi.StartChild(ctx, "quick", greet, greetIn{Name: "child"})
		if err != nil {
			return "", err
		}
		if err := ctx.Sleep("after-start", 600*time.Millisecond); err != nil { // the child finishes meanwhile
			return "", err
		}
		out, err := child.Get()
		return out.Greeting, err
	})
	runWorker(t, e.client, fastWorker(), parent, greet)
	run, err := kagzi.Start(ctx, e.client, parent, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != "hello child" {
		t.Fatalf("got %q, %v", out, err)
	}
	if executions.Load() < 2 {
		t.Fatalf("the parent ran %d times, want a replay after its sleep", executions.Load())
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE parent_run_id = $1`, run.RunID); n != 1 {
		t.Fatalf("%d children, want 1", n)
	}
}

func TestAFailedChildIsAWorkflowErrorInTheParent(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	parent := kagzi.Define("parent-of-failure", func(ctx *kagzi.Context, _ int) (string, error) {
		child, err := kagzi.StartChild(ctx, "broken", failingChild, 0)
		if err != nil {
			return "", err
		}
		_, err = child.Get()
		var we *kagzi.WorkflowError
		if !errors.As(err, &we) || we.RunID != child.RunID {
			return "", fmt.Errorf("got %v, want the child's *WorkflowError", err)
		}
		return kagzi.ErrorCode(err), nil
	})
	runWorker(t, e.client, fastWorker(), parent, failingChild)
	run, err := kagzi.Start(ctx, e.client, parent, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != "child_broke" {
		t.Fatalf("got %q, %v", out, err)
	}
}

func TestCancellingAParentCancelsItsActiveChildren(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	grandparent := kagzi.Define("grandparent", func(ctx *kagzi.Context, _ int) (string, error) {
		child, err := kagzi.StartChild(ctx, "middle", middle, 0)
		if err != nil {
			return "", err
		}
		return child.Get()
	})
	runWorker(t, e.client, fastWorker(), grandparent, middle, napper)
	run, err := kagzi.Start(ctx, e.client, grandparent, 0)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "three generations to be asleep", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE status = 'SLEEPING'`) == 3
	})
	if err := e.client.Cancel(ctx, run.RunID); err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrCancelled)
	eventually(t, "the cancel to cascade to every descendant", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE status = 'CANCELLED'`) == 3
	})
}

var middle = kagzi.Define("middle", func(ctx *kagzi.Context, _ int) (string, error) {
	child, err := kagzi.StartChild(ctx, "leaf", napper, 60_000)
	if err != nil {
		return "", err
	}
	return child.Get()
})

func TestAFireAndForgetChildOutlivesItsParent(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	parent := kagzi.Define("forgetful", func(ctx *kagzi.Context, _ int) (string, error) {
		child, err := kagzi.StartChild(ctx, "background", napper, 500)
		if err != nil {
			return "", err
		}
		return child.RunID, nil
	})
	runWorker(t, e.client, fastWorker(), parent, napper)
	run, err := kagzi.Start(ctx, e.client, parent, 0)
	if err != nil {
		t.Fatal(err)
	}
	childID, err := run.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s := runStatus(t, e.client, childID); s.Terminal() {
		t.Fatalf("the child is %s as its parent completes, want it still going", s)
	}
	eventually(t, "the child to complete on its own", func() bool {
		return runStatus(t, e.client, childID) == kagzi.StatusCompleted
	})
}

func TestSignalsSentBeforeTheWaitAreReceivedOnceEachInOrder(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	release := make(chan struct{})
	wf := kagzi.Define("receiver", func(ctx *kagzi.Context, _ int) ([]string, error) {
		if _, err := kagzi.Step(ctx, "gate", func(context.Context) (int, error) { <-release; return 0, nil }); err != nil {
			return nil, err
		}
		var got []string
		for range 3 {
			v, err := kagzi.WaitSignal[string](ctx, "item", time.Minute)
			if err != nil {
				return nil, err
			}
			got = append(got, v)
		}
		return got, nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0, kagzi.WithID("inbox"))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"first", "second", "third"} {
		if err := e.client.SignalWorkflow(ctx, "inbox", "item", v); err != nil {
			t.Fatal(err)
		}
	}
	close(release)
	if out, err := run.Wait(ctx); err != nil || fmt.Sprint(out) != "[first second third]" {
		t.Fatalf("got %v, %v", out, err)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.signals WHERE consumed_by IS NULL`); n != 0 {
		t.Fatalf("%d signals left undelivered", n)
	}
}

func TestASignalWakesAWaitingRunAfterAWorkerRestart(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("approval", func(ctx *kagzi.Context, _ int) (string, error) {
		decision, err := kagzi.WaitSignal[string](ctx, "decision", time.Hour)
		if err != nil {
			return "", err
		}
		return "decided: " + decision, nil
	})
	stop := runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the run to sleep waiting for its signal", func() bool {
		return runStatus(t, e.client, run.RunID) == kagzi.StatusSleeping
	})
	stop()
	runWorker(t, e.client, fastWorker(), wf)
	if err := e.client.Signal(ctx, run.RunID, "decision", "approved"); err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != "decided: approved" {
		t.Fatalf("got %q, %v", out, err)
	}
}

func TestASignalWaitTimesOutWithADistinctError(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("impatient", func(ctx *kagzi.Context, _ int) (string, error) {
		_, err := kagzi.WaitSignal[string](ctx, "never", 500*time.Millisecond)
		if !errors.Is(err, kagzi.ErrSignalTimeout) {
			return "", fmt.Errorf("got %v, want ErrSignalTimeout", err)
		}
		if err := ctx.Sleep("nap", 300*time.Millisecond); err != nil { // replays the timed-out wait
			return "", err
		}
		return "gave up", nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != "gave up" {
		t.Fatalf("got %q, %v", out, err)
	}
	// A signal that arrives after the timeout is not received by the timed-out wait.
}

func TestSignalToAFinishedOrUnknownRunIsATypedErrorAndStoresNothing(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	runWorker(t, e.client, fastWorker(), greet)
	run, err := kagzi.Start(ctx, e.client, greet, greetIn{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	mustErrorIs(t, e.client.Signal(ctx, run.RunID, "late", 1), kagzi.ErrRunFinished)
	mustErrorIs(t, e.client.Signal(ctx, "0190a0a0-0000-7000-8000-000000000000", "x", 1), kagzi.ErrNotFound)
	mustErrorIs(t, e.client.Signal(ctx, run.RunID, "", 1), kagzi.ErrInvalidArgument)
	mustErrorIs(t, newClient(t, e.pool, "other").Signal(ctx, run.RunID, "x", 1), kagzi.ErrNotFound)

	pending, err := e.client.StartByName(ctx, "nobody-runs-this", 0)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.client.SignalTx(ctx, tx, pending.RunID, "x", 1); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.signals`); n != 0 {
		t.Fatalf("%d signals stored, want 0", n)
	}
}

func TestEventsArePublishedForCallersToReadAndAwait(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	type progress struct{ Percent int }
	wf := kagzi.Define("reports-progress", func(ctx *kagzi.Context, _ int) (string, error) {
		if err := ctx.SetEvent("progress", progress{Percent: 50}); err != nil {
			return "", err
		}
		if _, err := kagzi.WaitSignal[int](ctx, "go-on", time.Minute); err != nil {
			return "", err
		}
		if err := ctx.SetEvent("progress", progress{Percent: 100}); err != nil {
			return "", err
		}
		return "done", nil
	})
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = kagzi.GetEvent[progress](ctx, e.client, run.RunID, "progress")
	mustErrorIs(t, err, kagzi.ErrNotFound)
	runWorker(t, e.client, fastWorker(), wf)
	p, err := kagzi.WaitEvent[progress](ctx, e.client, run.RunID, "progress", 10*time.Second)
	if err != nil || p.Percent != 50 {
		t.Fatalf("got %+v, %v", p, err)
	}
	if err := e.client.Signal(ctx, run.RunID, "go-on", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := run.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if p, err := kagzi.GetEvent[progress](ctx, e.client, run.RunID, "progress"); err != nil || p.Percent != 100 {
		t.Fatalf("final event %+v, %v", p, err)
	}
	_, err = kagzi.WaitEvent[progress](ctx, e.client, run.RunID, "never-set", 200*time.Millisecond)
	mustErrorIs(t, err, kagzi.ErrDeadlineExceeded)
}

// signalOnWait sends the awaited signal from inside the worker, after the wait found no
// signal and right before it suspends: the window a missed wake-up would fall into.
type signalOnWait struct {
	kagzi.NopHooks
	sender *kagzi.Client
	sent   sync.Map
}

func (h *signalOnWait) Signal(ctx context.Context, e *kagzi.SignalEvent) {
	if e.Action != kagzi.SignalWaiting {
		return
	}
	if _, done := h.sent.LoadOrStore(e.RunID, true); !done {
		_ = h.sender.Signal(context.Background(), e.RunID, e.Name, 42)
	}
}

func TestASignalSentJustAsTheRunSuspendsStillWakesIt(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("racing-signal", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.WaitSignal[int](ctx, "go", time.Hour) // a missed wake-up would sleep for an hour
	})
	workerClient, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(),
		Hooks: &signalOnWait{sender: e.client}})
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, workerClient, fastWorker(), wf)
	for range 5 {
		run, err := kagzi.Start(ctx, e.client, wf, 0)
		if err != nil {
			t.Fatal(err)
		}
		if out, err := run.Wait(ctx); err != nil || out != 42 {
			t.Fatalf("got %d, %v", out, err)
		}
	}
}
