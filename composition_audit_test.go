package kagzi_test

import (
	"context"
	"errors"
	"testing"

	"github.com/kagzi/kagzi"
)

// Found by an outside audit of composition and messages.

func TestAForkKeepsTheEventsAndAttributesItsCopiedStepsSet(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	fail := true
	wf := kagzi.Define("fork-messages", func(ctx *kagzi.Context, in string) (string, error) {
		if err := ctx.SetEvent("progress", 40); err != nil {
			return "", err
		}
		if err := ctx.SetAttributes(map[string]any{"stage": "evented", "gone": "x"}); err != nil {
			return "", err
		}
		if err := ctx.SetAttributes(map[string]any{"gone": nil}); err != nil {
			return "", err
		}
		if _, err := kagzi.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil }); err != nil {
			return "", err
		}
		out, err := kagzi.Step(ctx, "b", func(context.Context) (string, error) {
			if fail && in != "ok" {
				return "", kagzi.NonRetryable(errors.New("b fails"))
			}
			return in, nil
		})
		if err != nil {
			return "", err
		}
		// Set after the fork's step: the fork sets it when it runs on.
		return out, ctx.SetAttributes(map[string]any{"late": true})
	})
	runWorker(t, e.client, fastWorker(), wf)
	origin, err := kagzi.Start(ctx, e.client, wf, "x", kagzi.WithAttributes(map[string]any{"customer": "c-1", "stage": "new"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := origin.Wait(ctx); err == nil {
		t.Fatal("the origin completed; want it FAILED at step b")
	}
	fork, err := e.client.Fork(ctx, origin.RunID, "b#1", kagzi.ForkOptions{Input: "ok"})
	if err != nil {
		t.Fatal(err)
	}
	// Before the fork runs: what its copied history says.
	info, err := e.client.GetRun(ctx, fork.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if info.Attributes["customer"] != "c-1" || info.Attributes["stage"] != "evented" || info.Attributes["gone"] != nil {
		t.Fatalf("the fork's attributes: %v, want customer c-1 (the origin's start) and stage evented (its copied change), without gone", info.Attributes)
	}
	progress, err := kagzi.GetEvent[int](ctx, e.client, fork.RunID, "progress")
	if err != nil || progress != 40 {
		t.Fatalf("the fork's event progress: %v, %v; want 40", progress, err)
	}
	if out, err := fork.Wait(ctx); err != nil || string(out) != `"ok"` {
		t.Fatalf("the fork: %s, %v; want it to complete with \"ok\"", out, err)
	}
	if info, err = e.client.GetRun(ctx, fork.RunID); err != nil || info.Attributes["late"] != true {
		t.Fatalf("the completed fork's attributes: %v, %v; want late set by its own run", info.Attributes, err)
	}
}

func TestBadEventsChildInputsAndSignalNamesAreInvalidArguments(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	child := kagzi.Define("audit-child", func(ctx *kagzi.Context, in any) (int, error) { return 1, nil })
	results := make(chan error, 3)
	wf := kagzi.Define("bad-values", func(ctx *kagzi.Context, in string) (string, error) {
		results <- ctx.SetEvent("nul", "a\x00b")
		results <- ctx.SetEvent("func", func() {})
		_, err := kagzi.StartChild(ctx, "c", child, any(func() {}))
		results <- err
		return "done", nil
	})
	runWorker(t, e.client, fastWorker(), wf, child)
	run, err := kagzi.Start(ctx, e.client, wf, "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	for _, what := range []string{"an event with a NUL", "an event that does not encode", "a child input that does not encode"} {
		if err := <-results; !errors.Is(err, kagzi.ErrInvalidArgument) || !errors.Is(err, kagzi.ErrNonRetryable) {
			t.Errorf("%s: %v, want a non-retryable ErrInvalidArgument", what, err)
		}
	}
	if _, err := kagzi.WaitEvent[int](ctx, nil, run.RunID, "k", 1); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("WaitEvent with a nil client: %v, want ErrInvalidArgument", err)
	}
	if _, err := kagzi.GetEvent[int](ctx, e.client, run.RunID, ""); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("GetEvent of an empty key: %v, want ErrInvalidArgument", err)
	}
	if _, err := kagzi.WaitEvent[int](ctx, e.client, run.RunID, "", 1); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("WaitEvent of an empty key: %v, want ErrInvalidArgument", err)
	}
	waiter := kagzi.Define("hash-waiter", func(ctx *kagzi.Context, in string) (string, error) {
		return kagzi.WaitSignal[string](ctx, "go", 0)
	})
	runWorker(t, e.client, fastWorker(), waiter)
	w, err := kagzi.Start(ctx, e.client, waiter, "x")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.client.Signal(ctx, w.RunID, "a#b", "v"); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("a signal name with '#': %v, want ErrInvalidArgument", err)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.signals`); n != 0 {
		t.Errorf("%d signals stored after the refusal, want none", n)
	}
	var zero kagzi.Future[int]
	if _, err := zero.Get(); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("Get of a zero Future: %v, want ErrInvalidArgument", err)
	}
	var none *kagzi.Future[int]
	if _, err := none.Get(); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("Get of a nil Future: %v, want ErrInvalidArgument", err)
	}
}
