package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

// concurrency tracks how many step bodies run at once.
type concurrency struct{ now, max atomic.Int32 }

func (c *concurrency) enter() {
	n := c.now.Add(1)
	for {
		m := c.max.Load()
		if n <= m || c.max.CompareAndSwap(m, n) {
			return
		}
	}
}
func (c *concurrency) leave() { c.now.Add(-1) }

func keysOf(t *testing.T, c *kagzi.Client, runID string) []string {
	t.Helper()
	var keys []string
	for _, s := range stepsOf(t, c, runID) {
		keys = append(keys, s.Key)
	}
	slices.Sort(keys)
	return keys
}

func TestGoRunsBranchesConcurrentlyWithKeysFromCallPosition(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var cc concurrency
	wf := kagzi.Define("fan-out", func(ctx *kagzi.Context, _ int) ([]string, error) {
		var futures []*kagzi.Future[string]
		for i, name := range []string{"slow", "medium", "fast"} {
			futures = append(futures, kagzi.Go(ctx, name, func(ctx *kagzi.Context) (string, error) {
				return kagzi.Step(ctx, "work", func(context.Context) (string, error) {
					cc.enter()
					defer cc.leave()
					time.Sleep(time.Duration(3-i) * 60 * time.Millisecond) // the first called finishes last
					return name, nil
				})
			}))
		}
		var outs []string
		for _, f := range futures {
			out, err := f.Get()
			if err != nil {
				return nil, err
			}
			outs = append(outs, out)
		}
		return outs, nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	out, err := run.Wait(ctx)
	if err != nil || fmt.Sprint(out) != "[slow medium fast]" {
		t.Fatalf("got %v, %v", out, err)
	}
	if cc.max.Load() < 2 {
		t.Fatalf("at most %d branch ran at once, want them concurrent", cc.max.Load())
	}
	if keys := keysOf(t, e.client, run.RunID); fmt.Sprint(keys) != "[fast#1/work#1 medium#1/work#1 slow#1/work#1]" {
		t.Fatalf("keys %v", keys)
	}
}

func TestNestedBranchesPrefixTheirKeys(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("nested", func(ctx *kagzi.Context, _ int) (int, error) {
		outer := kagzi.Go(ctx, "outer", func(ctx *kagzi.Context) (int, error) {
			inner := kagzi.Go(ctx, "inner", func(ctx *kagzi.Context) (int, error) {
				return kagzi.Step(ctx, "leaf", func(context.Context) (int, error) { return 20, nil })
			})
			a, err := kagzi.Step(ctx, "leaf", func(context.Context) (int, error) { return 1, nil })
			if err != nil {
				return 0, err
			}
			b, err := inner.Get()
			return a + b, err
		})
		v, err := outer.Get()
		return v, err
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != 21 {
		t.Fatalf("got %d, %v", out, err)
	}
	if keys := keysOf(t, e.client, run.RunID); fmt.Sprint(keys) != "[outer#1/inner#1/leaf#1 outer#1/leaf#1]" {
		t.Fatalf("keys %v", keys)
	}
}

func TestMapReturnsOutputsInItemOrderAndRespectsMaxParallel(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var cc concurrency
	wf := kagzi.Define("map", func(ctx *kagzi.Context, n int) ([]int, error) {
		items := make([]int, n)
		for i := range items {
			items[i] = i
		}
		return kagzi.Map(ctx, "square", items, func(ctx *kagzi.Context, i int) (int, error) {
			return kagzi.Step(ctx, "calc", func(context.Context) (int, error) {
				cc.enter()
				defer cc.leave()
				time.Sleep(time.Duration(20-i) * time.Millisecond)
				return i * i, nil
			})
		}, kagzi.MaxParallel(4))
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 12)
	if err != nil {
		t.Fatal(err)
	}
	out, err := run.Wait(ctx)
	if err != nil || fmt.Sprint(out) != "[0 1 4 9 16 25 36 49 64 81 100 121]" {
		t.Fatalf("got %v, %v", out, err)
	}
	if m := cc.max.Load(); m > 4 || m < 2 {
		t.Fatalf("%d items ran at once, want 2..4 with MaxParallel(4)", m)
	}
}

func TestMapFailsFastAndCancelsTheItemsStillRunning(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var cancelled atomic.Int32
	wf := kagzi.Define("fail-fast", func(ctx *kagzi.Context, _ int) (string, error) {
		_, err := kagzi.Map(ctx, "item", []int{0, 1, 2, 3}, func(ctx *kagzi.Context, i int) (int, error) {
			return kagzi.Step(ctx, "work", func(c context.Context) (int, error) {
				if i == 2 {
					return 0, &kagzi.Error{Code: "broken", Message: "item 2 is broken"}
				}
				<-c.Done()
				cancelled.Add(1)
				return 0, c.Err()
			}, kagzi.WithRetry(kagzi.NoRetry()))
		})
		return kagzi.ErrorCode(err), nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != "broken" {
		t.Fatalf("got %q, %v; want the failing item's error", out, err)
	}
	if cancelled.Load() != 3 {
		t.Fatalf("%d other items saw their context cancelled, want 3", cancelled.Load())
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.step_attempts`); n != 1 {
		t.Fatalf("%d attempts recorded, want 1: cancelled items are interrupted, not failed", n)
	}
}

func TestMapCollectAllRunsEveryItemAndReportsTheFailures(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("collect-all", func(ctx *kagzi.Context, _ int) ([]string, error) {
		outs, err := kagzi.Map(ctx, "item", []int{0, 1, 2, 3}, func(ctx *kagzi.Context, i int) (int, error) {
			return kagzi.Step(ctx, "work", func(c context.Context) (int, error) {
				if i%2 == 1 {
					return 0, fmt.Errorf("odd %d", i)
				}
				return i * 10, nil
			}, kagzi.WithRetry(kagzi.NoRetry()))
		}, kagzi.CollectAll())
		var perr *kagzi.ParallelError
		if !errors.As(err, &perr) {
			return nil, fmt.Errorf("got %v, want a *ParallelError", err)
		}
		var failed []int
		for i := range perr.Errors {
			failed = append(failed, i)
		}
		slices.Sort(failed)
		return []string{fmt.Sprint(outs), fmt.Sprint(failed)}, nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || fmt.Sprint(out) != "[[0 0 20 0] [1 3]]" {
		t.Fatalf("got %v, %v", out, err)
	}
}

func TestRaceReturnsTheFirstSuccessAndReplaysTheSameWinner(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var calls atomic.Int32
	var losersCancelled atomic.Int32
	wf := kagzi.Define("race", func(ctx *kagzi.Context, _ int) (string, error) {
		winner, err := kagzi.Race(ctx, "mirror", []func(context.Context) (string, error){
			func(c context.Context) (string, error) {
				calls.Add(1)
				<-c.Done()
				losersCancelled.Add(1)
				return "", c.Err()
			},
			func(context.Context) (string, error) { calls.Add(1); return "", errors.New("mirror b is down") },
			func(context.Context) (string, error) {
				calls.Add(1)
				time.Sleep(20 * time.Millisecond)
				return "mirror c", nil
			},
		})
		if err != nil {
			return "", err
		}
		if err := ctx.Sleep("nap", 300*time.Millisecond); err != nil { // the race replays after this
			return "", err
		}
		return winner, nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != "mirror c" {
		t.Fatalf("got %q, %v", out, err)
	}
	if calls.Load() != 3 || losersCancelled.Load() != 1 {
		t.Fatalf("racers ran %d times (want 3, not again on replay); %d losers cancelled (want 1)",
			calls.Load(), losersCancelled.Load())
	}
}

func TestLongSleepWhileABranchRunsWaitsInProcess(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var executions atomic.Int32
	wf := kagzi.Define("sleep-beside-branch", func(ctx *kagzi.Context, _ int) (int, error) {
		executions.Add(1)
		f := kagzi.Go(ctx, "bg", func(ctx *kagzi.Context) (int, error) {
			if err := ctx.Sleep("inner-nap", 400*time.Millisecond); err != nil { // in a branch: in process
				return 0, err
			}
			return 1, nil
		})
		if err := ctx.Sleep("outer-nap", 300*time.Millisecond); err != nil { // a branch runs: in process
			return 0, err
		}
		return f.Get()
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != 1 {
		t.Fatalf("got %d, %v", out, err)
	}
	if executions.Load() != 1 {
		t.Fatalf("the workflow ran %d times: a sleep released the run while a branch was running", executions.Load())
	}
}

func TestCancelStopsEveryBranch(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var inside, stopped atomic.Int32
	wf := kagzi.Define("cancel-branches", func(ctx *kagzi.Context, _ int) ([]int, error) {
		return kagzi.Map(ctx, "item", []int{1, 2, 3}, func(ctx *kagzi.Context, i int) (int, error) {
			return kagzi.Step(ctx, "block", func(c context.Context) (int, error) {
				inside.Add(1)
				<-c.Done()
				stopped.Add(1)
				return 0, c.Err()
			})
		})
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "all branches to run", func() bool { return inside.Load() == 3 })
	if err := e.client.Cancel(ctx, run.RunID); err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrCancelled)
	if stopped.Load() != 3 {
		t.Fatalf("%d of 3 branches saw the cancel", stopped.Load())
	}
}
