package kagzi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

func versioned(v string) *kagzi.Workflow[int, string] {
	return kagzi.Define("versioned", func(ctx *kagzi.Context, n int) (string, error) {
		return kagzi.Step(ctx, "work", func(context.Context) (string, error) { return fmt.Sprintf("%s:%d", v, n), nil })
	}, kagzi.WithVersion(v))
}

func TestWorkersRunOnlyTheVersionsTheyRegistered(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	v1, v2 := versioned("v1"), versioned("v2")
	var runs []*kagzi.Run[string]
	for i := range 6 {
		wf := v1
		if i%2 == 1 {
			wf = v2
		}
		run, err := kagzi.Start(ctx, e.client, wf, i)
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, run)
	}
	old := newClient(t, e.pool, "")
	runWorker(t, old, fastWorker(), v1)
	time.Sleep(100 * time.Millisecond)
	runWorker(t, e.client, fastWorker(), v2) // the newest worker registered v2
	for i, run := range runs {
		out, err := run.Wait(ctx)
		want := fmt.Sprintf("v%d:%d", i%2+1, i)
		if err != nil || out != want {
			t.Fatalf("run %d: %q, %v; want %q: each version runs its own code", i, out, err, want)
		}
	}
	v := "v1"
	page, err := e.client.ListRuns(ctx, kagzi.RunFilter{Version: &v})
	if err != nil || len(page.Runs) != 3 {
		t.Fatalf("runs of v1: %d, %v; want 3", len(page.Runs), err)
	}
	eventually(t, "both workers to register", func() bool {
		p, err := e.client.ListWorkers(ctx, kagzi.WorkerFilter{WorkflowType: "versioned"})
		return err == nil && len(p.Workers) == 2
	})
	byName, err := e.client.StartByName(ctx, "versioned", 100)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := byName.Wait(ctx); err != nil || string(out) != `"v2:100"` {
		t.Fatalf("StartByName without a version ran %s, %v; want the newest registered version v2", out, err)
	}
	pinned, err := e.client.StartByName(ctx, "versioned", 7, kagzi.WithRunVersion("v1"))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := pinned.Wait(ctx); err != nil || string(out) != `"v1:7"` {
		t.Fatalf("WithRunVersion(v1) ran %s, %v", out, err)
	}
}

func TestAChangedStepOrderIsDetectedOnReplayWithAClearError(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	step := func(ctx *kagzi.Context, name string) error {
		_, err := kagzi.Step(ctx, name, func(context.Context) (string, error) { return name, nil })
		return err
	}
	before := kagzi.Define("reordered", func(ctx *kagzi.Context, _ int) (string, error) {
		if err := step(ctx, "reserve"); err != nil {
			return "", err
		}
		if err := step(ctx, "charge"); err != nil {
			return "", err
		}
		return "", ctx.Sleep("nap", time.Hour)
	})
	after := kagzi.Define("reordered", func(ctx *kagzi.Context, _ int) (string, error) {
		if err := step(ctx, "charge"); err != nil { // the deploy swapped the first two steps
			return "", err
		}
		if err := step(ctx, "reserve"); err != nil {
			return "", err
		}
		return "done", ctx.Sleep("nap", time.Hour)
	})
	stop := runWorker(t, e.client, fastWorker(), before)
	run, err := kagzi.Start(ctx, e.client, before, 0)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the run to sleep", func() bool { return runStatus(t, e.client, run.RunID) == kagzi.StatusSleeping })
	stop()
	if _, err := e.pool.Exec(ctx, `UPDATE kagzi.runs SET available_at = now()`); err != nil { // wake it now
		t.Fatal(err)
	}
	runWorker(t, e.client, fastWorker(), after)
	_, err = run.Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrNonDeterministic)
	mustErrorIs(t, err, kagzi.ErrNonRetryable)
	msg := err.Error()
	for _, want := range []string{run.RunID, "position 1", `"reserve" (STEP)`, `"charge" (STEP)`} {
		if !strings.Contains(msg, want) {
			t.Fatalf("error %q does not name %s", msg, want)
		}
	}
}

func TestPatchedAnswersFalseForOldHistoriesTrueForNewRunsAndTheSameOnReplay(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var newStepRan atomic.Int32
	step := func(ctx *kagzi.Context, name string) error {
		_, err := kagzi.Step(ctx, name, func(context.Context) (string, error) { return name, nil })
		return err
	}
	oldCode := kagzi.Define("patched", func(ctx *kagzi.Context, _ int) (string, error) {
		if err := step(ctx, "a"); err != nil {
			return "", err
		}
		if err := ctx.Sleep("nap", 400*time.Millisecond); err != nil {
			return "", err
		}
		return "old", step(ctx, "c")
	})
	newCode := kagzi.Define("patched", func(ctx *kagzi.Context, _ int) (string, error) {
		if err := step(ctx, "a"); err != nil {
			return "", err
		}
		path := "old-path"
		if ctx.Patched("add-b") {
			path = "new-path"
			if _, err := kagzi.Step(ctx, "b", func(context.Context) (int, error) { return int(newStepRan.Add(1)), nil }); err != nil {
				return "", err
			}
		}
		if err := ctx.Sleep("nap", 400*time.Millisecond); err != nil {
			return "", err
		}
		return path, step(ctx, "c")
	})
	stop := runWorker(t, e.client, fastWorker(), oldCode)
	inFlight, err := kagzi.Start(ctx, e.client, oldCode, 0)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the old run to sleep", func() bool { return runStatus(t, e.client, inFlight.RunID) == kagzi.StatusSleeping })
	stop() // deploy: the new code takes over
	runWorker(t, e.client, fastWorker(), newCode)
	fresh, err := kagzi.Start(ctx, e.client, newCode, 1)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := inFlight.Wait(ctx); err != nil || out != "old-path" {
		t.Fatalf("the run in flight took %q, %v; want the old path", out, err)
	}
	if out, err := fresh.Wait(ctx); err != nil || out != "new-path" {
		t.Fatalf("the new run took %q, %v; want the new path after its sleep's replay too", out, err)
	}
	if newStepRan.Load() != 1 {
		t.Fatalf("the patched step ran %d times, want 1", newStepRan.Load())
	}
}

func TestRetryRunsAFailedRunAgainFromItsFailedStep(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var fixed atomic.Bool
	var firstRuns, secondRuns atomic.Int32
	wf := kagzi.Define("fixable", func(ctx *kagzi.Context, _ int) (string, error) {
		if _, err := kagzi.Step(ctx, "first", func(context.Context) (int, error) { return int(firstRuns.Add(1)), nil }); err != nil {
			return "", err
		}
		return kagzi.Step(ctx, "second", func(context.Context) (string, error) {
			secondRuns.Add(1)
			if !fixed.Load() {
				return "", errors.New("bug")
			}
			return "fixed", nil
		}, kagzi.WithRetry(kagzi.NoRetry()))
	}, kagzi.WithWorkflowRetry(kagzi.NoRetry()))
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.Wait(ctx); !errors.Is(err, kagzi.ErrWorkflowFailed) {
		t.Fatalf("got %v, want the run FAILED", err)
	}
	mustErrorIs(t, e.client.Rerun(ctx, "0190a0a0-0000-7000-8000-000000000000"), kagzi.ErrNotFound)
	fixed.Store(true)
	if err := e.client.Rerun(ctx, run.RunID); err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != "fixed" {
		t.Fatalf("after Retry: %q, %v", out, err)
	}
	if firstRuns.Load() != 1 || secondRuns.Load() != 2 {
		t.Fatalf("first ran %d times (want 1: kept), second %d (want 2)", firstRuns.Load(), secondRuns.Load())
	}
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil || info.Attempt != 2 || info.Error != nil {
		t.Fatalf("run after retry %+v, %v", info, err)
	}
	mustErrorIs(t, e.client.Rerun(ctx, run.RunID), kagzi.ErrInvalidArgument) // COMPLETED now
}

func TestForkCopiesExactlyTheOutputsBeforeTheChosenStep(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var calls [3]atomic.Int32
	wf := kagzi.Define("forkable", func(ctx *kagzi.Context, in int) ([]int, error) {
		var outs []int
		for i := range 3 {
			v, err := kagzi.Step(ctx, fmt.Sprintf("s%d", i+1), func(context.Context) (int, error) {
				calls[i].Add(1)
				return in*10 + i, nil
			})
			if err != nil {
				return nil, err
			}
			outs = append(outs, v)
		}
		return outs, nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 1)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || fmt.Sprint(out) != "[10 11 12]" {
		t.Fatalf("origin: %v, %v", out, err)
	}
	fork, err := e.client.Fork(ctx, run.RunID, "s2#1", kagzi.ForkOptions{Input: 5})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := fork.Wait(ctx)
	var out []int
	if err == nil {
		err = json.Unmarshal(raw, &out)
	}
	if err != nil || fmt.Sprint(out) != "[10 51 52]" {
		t.Fatalf("fork: %s, %v; want s1 copied from the origin and s2, s3 run with the new input", raw, err)
	}
	if calls[0].Load() != 1 || calls[1].Load() != 2 || calls[2].Load() != 2 {
		t.Fatalf("step runs %d %d %d, want 1 2 2", calls[0].Load(), calls[1].Load(), calls[2].Load())
	}
	info, err := e.client.GetRun(ctx, fork.RunID)
	if err != nil || info.ForkedFromRunID != run.RunID || info.ForkedFromStep != "s2#1" {
		t.Fatalf("fork info %+v, %v", info, err)
	}
	_, err = e.client.Fork(ctx, run.RunID, "nope#1", kagzi.ForkOptions{})
	mustErrorIs(t, err, kagzi.ErrInvalidArgument)
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs`); n != 2 {
		t.Fatalf("%d runs after a rejected fork, want 2", n)
	}
}

func TestPruningRemovesOnlyOldFinishedRunsWhileWorkersRun(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	c, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	other := newClient(t, e.pool, "other-ns")
	worker := runWorker(t, c, fastWorker(), greet)
	var ids []string
	for i := range 3 {
		run, err := kagzi.Start(ctx, c, greet, greetIn{Name: fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := run.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, run.RunID)
	}
	pending, err := c.StartByName(ctx, "nobody-runs-this", 0)
	if err != nil {
		t.Fatal(err)
	}
	elsewhere, err := other.StartByName(ctx, "nobody-runs-this", 0)
	if err != nil {
		t.Fatal(err)
	}
	worker()
	// Age everything by two hours: the finished runs of the namespace fall out of retention.
	if _, err := e.pool.Exec(ctx, `UPDATE kagzi.runs SET created_at = created_at - interval '2 hours',
		finished_at = finished_at - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'COMPLETED', finished_at = now() - interval '2 hours'
		WHERE run_id = $1`, elsewhere.RunID); err != nil {
		t.Fatal(err)
	}
	recent, err := kagzi.Start(ctx, c, greet, greetIn{Name: "recent"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := fastWorker()
	cfg.PruneInterval = 50 * time.Millisecond
	w, _ := startWorker(t, c, cfg, greet)
	if _, err := recent.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the old finished runs to be pruned", func() bool { return w.PrunedRuns() == 3 })
	for _, id := range ids {
		if _, err := c.GetRun(ctx, id); !errors.Is(err, kagzi.ErrNotFound) {
			t.Fatalf("old finished run %s: %v, want pruned", id, err)
		}
	}
	for _, id := range []string{pending.RunID, recent.RunID} {
		if _, err := c.GetRun(ctx, id); err != nil {
			t.Fatalf("run %s was pruned: %v; only finished runs past retention go", id, err)
		}
	}
	if _, err := other.GetRun(ctx, elsewhere.RunID); err != nil {
		t.Fatalf("another namespace's run was pruned: %v", err)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.steps WHERE run_id::text = ANY($1)`, ids); n != 0 {
		t.Fatalf("%d steps of pruned runs remain", n)
	}
}

// Found from outside: a fork from after a StartChild whose child still ran copied the
// child's start, and its Get waited on the origin's child, whose end wakes the origin,
// sleeping an hour at a time; a cancel of the fork left the child running.
func TestAForkThatWouldWaitOnTheOriginsRunningChildIsRefused(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	release := make(chan struct{})
	child := kagzi.Define("slow-child", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Step(ctx, "wait", func(context.Context) (int, error) { <-release; return n, nil })
	})
	parent := kagzi.Define("failing-parent", func(ctx *kagzi.Context, n int) (int, error) {
		ch, err := kagzi.StartChild(ctx, "c", child, n)
		if err != nil {
			return 0, err
		}
		if _, err := kagzi.Step(ctx, "boom", func(context.Context) (int, error) {
			return 0, kagzi.NonRetryable(errors.New("boom"))
		}); err != nil {
			return 0, err
		}
		return ch.Get()
	})
	runWorker(t, e.client, fastWorker(), parent, child)
	p, err := kagzi.Start(ctx, e.client, parent, 7)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(ctx); err == nil {
		t.Fatal("the parent completed; want it FAILED at boom")
	}
	before := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs`)
	if _, err := e.client.Fork(ctx, p.RunID, "boom#1", kagzi.ForkOptions{}); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Fatalf("a fork past the start of a running child: %v, want ErrInvalidArgument", err)
	}
	if after := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs`); after != before {
		t.Fatalf("%d runs after the refused fork, %d before", after, before)
	}
	// From the StartChild step on, the fork starts a child of its own.
	if _, err := e.client.Fork(ctx, p.RunID, "c#1", kagzi.ForkOptions{}); err != nil {
		t.Fatalf("a fork from the StartChild step: %v", err)
	}
	close(release)
}

// Found from outside: an old process restarting during a rollout (after the new
// version's) moved the runs started without a version, and continue-as-new, back to
// the old code; and runs pinned to a version no live worker has were not reported.
func TestAnOldVersionsProcessRestartingDuringARolloutDoesNotTakeTheNewestVersionsPlace(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	v1, v2 := versioned("v1"), versioned("v2")
	// Each worker registers (its started_at) before the next starts: a worker registers
	// from its own goroutine, and on a loaded box a sleep between the starts did not
	// keep their registrations in order.
	registered := func(n int) {
		t.Helper()
		eventually(t, fmt.Sprintf("%d workers to register", n), func() bool {
			p, err := e.client.ListWorkers(ctx, kagzi.WorkerFilter{WorkflowType: "versioned"})
			return err == nil && len(p.Workers) == n
		})
		time.Sleep(10 * time.Millisecond) // distinct registration times
	}
	runWorker(t, newClient(t, e.pool, ""), fastWorker(), v1) // the old deployment
	registered(1)
	runWorker(t, newClient(t, e.pool, ""), fastWorker(), v2) // the rollout's first process
	registered(2)
	runWorker(t, newClient(t, e.pool, ""), fastWorker(), v1) // an old process restarting
	registered(3)
	byName, err := e.client.StartByName(ctx, "versioned", 1)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := byName.Wait(ctx); err != nil || string(out) != `"v2:1"` {
		t.Fatalf("StartByName without a version ran %s, %v; want v2, the version that came last", out, err)
	}
}

func TestHealthReportsRunsPinnedToAVersionNoLiveWorkerHas(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	runWorker(t, e.client, fastWorker(), versioned("v2"))
	eventually(t, "the worker to register", func() bool {
		p, err := e.client.ListWorkers(ctx, kagzi.WorkerFilter{WorkflowType: "versioned"})
		return err == nil && len(p.Workers) == 1
	})
	if _, err := e.client.StartByName(ctx, "versioned", 1, kagzi.WithRunVersion("v1")); err != nil {
		t.Fatal(err)
	}
	if h := e.client.Health(ctx); !slices.Contains(h.PendingTypesWithoutWorker, "versioned") {
		t.Fatalf("health with a run pinned to v1 and only a v2 worker: %+v, want the type among those without a worker", h)
	}
}

// Found from outside: an old run resumed on new code answered false at a change's
// first Patched (inside its old history) and true at a later one of the same change
// (past it), taking the old branch at one place and the new branch at the other.
func TestEveryPatchedOfOneChangeInARunGivesTheRunsFirstAnswer(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	oldCode := kagzi.Define("twice-patched", func(ctx *kagzi.Context, _ int) (string, error) {
		if _, err := kagzi.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil }); err != nil {
			return "", err
		}
		return "old", ctx.Sleep("nap", 400*time.Millisecond)
	})
	newCode := kagzi.Define("twice-patched", func(ctx *kagzi.Context, _ int) (string, error) {
		if _, err := kagzi.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil }); err != nil {
			return "", err
		}
		first := ctx.Patched("new-pricing")
		if err := ctx.Sleep("nap", 400*time.Millisecond); err != nil {
			return "", err
		}
		second := ctx.Patched("new-pricing")
		return fmt.Sprintf("%t/%t", first, second), nil
	})
	stop := runWorker(t, e.client, fastWorker(), oldCode)
	inFlight, err := kagzi.Start(ctx, e.client, oldCode, 0)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the old run to sleep", func() bool { return runStatus(t, e.client, inFlight.RunID) == kagzi.StatusSleeping })
	stop()
	runWorker(t, e.client, fastWorker(), newCode)
	fresh, err := kagzi.Start(ctx, e.client, newCode, 1)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := inFlight.Wait(ctx); err != nil || out != "false/false" {
		t.Fatalf("the run in flight before the change answered %q, %v; want false at both places", out, err)
	}
	if out, err := fresh.Wait(ctx); err != nil || out != "true/true" {
		t.Fatalf("the run started after the change answered %q, %v; want true at both places", out, err)
	}
}

// A run cancelled while it waited for a worker never executed: rerun, its first
// execution is attempt 1, not 2.
func TestARerunOfARunCancelledBeforeAnyWorkerClaimedItRunsAsAttemptOne(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	attempts := make(chan int, 4)
	wf := kagzi.Define("attempt-of-rerun", func(ctx *kagzi.Context, _ int) (int, error) {
		attempts <- ctx.Attempt()
		return ctx.Attempt(), nil
	})
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.client.Cancel(ctx, run.RunID); err != nil {
		t.Fatal(err)
	}
	if err := e.client.Rerun(ctx, run.RunID); err != nil {
		t.Fatal(err)
	}
	if info, err := e.client.GetRun(ctx, run.RunID); err != nil || info.Attempt != 0 {
		t.Fatalf("rerun, before a claim: attempt %d, %v (want 0: never executed)", info.Attempt, err)
	}
	runWorker(t, e.client, fastWorker(), wf)
	if got, err := run.Wait(ctx); err != nil || got != 1 {
		t.Fatalf("the rerun's first execution: attempt %d, %v (want 1)", got, err)
	}
	if info, err := e.client.GetRun(ctx, run.RunID); err != nil || info.Attempt != 1 {
		t.Fatalf("after it: attempt %d, %v (want 1)", info.Attempt, err)
	}
}

// Patched inside a branch answers false for a run whose history went past the branch
// under older code (found from outside: on replay the branch ran the new step and
// changed a value the run had already acted on; with Map, once per item).
func TestPatchedInABranchAnswersFalseWhenTheRunWentPastTheBranchUnderOlderCode(t *testing.T) {
	for _, useMap := range []bool{false, true} {
		t.Run(fmt.Sprintf("map=%v", useMap), func(t *testing.T) {
			e := newEnv(t)
			ctx := waitCtx(t)
			var newStepRan atomic.Int32
			define := func(patched bool) *kagzi.Workflow[int, string] {
				branch := func(ctx *kagzi.Context, _ int) (int, error) {
					total, err := kagzi.Step(ctx, "x", func(context.Context) (int, error) { return 10, nil })
					if err != nil || !patched || !ctx.Patched("bonus") {
						return total, err
					}
					bonus, err := kagzi.Step(ctx, "new", func(context.Context) (int, error) { newStepRan.Add(1); return 5, nil })
					return total + bonus, err
				}
				return kagzi.Define("branchy", func(ctx *kagzi.Context, _ int) (string, error) {
					var total int
					if useMap {
						outs, err := kagzi.Map(ctx, "items", []int{1, 2}, branch)
						if err != nil {
							return "", err
						}
						total = outs[0] + outs[1]
					} else {
						out, err := kagzi.Go(ctx, "br", func(ctx *kagzi.Context) (int, error) { return branch(ctx, 0) }).Get()
						if err != nil {
							return "", err
						}
						total = out
					}
					decided, err := kagzi.Step(ctx, "decide", func(context.Context) (int, error) { return total, nil })
					if err != nil {
						return "", err
					}
					if err := ctx.Sleep("nap", 400*time.Millisecond); err != nil {
						return "", err
					}
					return fmt.Sprintf("decided on %d, total %d", decided, total), nil
				})
			}
			stop := runWorker(t, e.client, fastWorker(), define(false))
			inFlight, err := kagzi.Start(ctx, e.client, define(false), 0)
			if err != nil {
				t.Fatal(err)
			}
			eventually(t, "the old run to sleep", func() bool { return runStatus(t, e.client, inFlight.RunID) == kagzi.StatusSleeping })
			stop() // deploy: the branch gains a patched step
			runWorker(t, e.client, fastWorker(), define(true))
			out, err := inFlight.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			want := "decided on 10, total 10"
			if useMap {
				want = "decided on 20, total 20"
			}
			if out != want || newStepRan.Load() != 0 {
				t.Fatalf("the run in flight returned %q with the new step run %d times; want %q and none",
					out, newStepRan.Load(), want)
			}
		})
	}
}
