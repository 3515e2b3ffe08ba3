package kagzi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

// counter counts to its Target, continuing as new every Every iterations; each run
// records one step per iteration.
type counterState struct {
	N, Target, Every int
}

var countingWorkflow = kagzi.Define("counting", func(ctx *kagzi.Context, s counterState) (int, error) {
	for i := 0; i < s.Every && s.N < s.Target; i++ {
		n, err := kagzi.Step(ctx, "inc", func(context.Context) (int, error) { return s.N + 1, nil })
		if err != nil {
			return 0, err
		}
		s.N = n
	}
	if s.N < s.Target {
		return 0, kagzi.ContinueAsNew(ctx, s)
	}
	return s.N, nil
})

func TestContinueAsNewEndsTheRunAndStartsAFreshOneWithTheSameWorkflowIDAndWaitFollows(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	runWorker(t, e.client, fastWorker(), countingWorkflow)
	run, err := kagzi.Start(ctx, e.client, countingWorkflow, counterState{Target: 10, Every: 3}, kagzi.WithID("counter-1"),
		kagzi.WithPriority(5), kagzi.WithAttributes(map[string]any{"team": "a"}))
	if err != nil {
		t.Fatal(err)
	}
	out, err := run.Wait(ctx)
	if err != nil || out != 10 {
		t.Fatalf("Wait on the first run = %d, %v; want the last run's result 10", out, err)
	}
	// Four runs: 3+3+3+1 iterations, linked both ways, each with a fresh history.
	var chain []*kagzi.RunInfo
	for id := run.RunID; id != ""; {
		info, err := e.client.GetRun(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		chain = append(chain, info)
		id = info.ContinuedAsRunID
	}
	if len(chain) != 4 {
		t.Fatalf("%d runs in the chain, want 4", len(chain))
	}
	for i, info := range chain {
		if info.WorkflowID != "counter-1" || info.Status != kagzi.StatusCompleted || info.Priority != 5 ||
			info.Attributes["team"] != "a" {
			t.Errorf("run %d: %+v", i, info)
		}
		if i > 0 && info.ContinuedFromRunID != chain[i-1].RunID {
			t.Errorf("run %d continued from %q, want %s", i, info.ContinuedFromRunID, chain[i-1].RunID)
		}
		if i < 3 && len(info.Output) != 0 {
			t.Errorf("run %d continued as new but has output %s", i, info.Output)
		}
		steps := stepsOf(t, e.client, info.RunID)
		if want := min(3, 10-3*i); len(steps) != want {
			t.Errorf("run %d recorded %d steps, want a fresh history of %d", i, len(steps), want)
		}
	}
	var last counterState
	if err := json.Unmarshal(chain[3].Input, &last); err != nil || last != (counterState{N: 9, Target: 10, Every: 3}) ||
		string(chain[3].Output) != "10" {
		t.Errorf("last run: input %s (%v) output %s; want the state the third run continued with", chain[3].Input, err, chain[3].Output)
	}
	// A handle by workflow id reads the active (else newest) run: the last one.
	h, err := kagzi.RunOfWorkflow[int](ctx, e.client, "counter-1")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := h.Wait(ctx); err != nil || got != 10 || h.RunID != chain[3].RunID {
		t.Fatalf("RunOfWorkflow: %s = %d, %v", h.RunID, got, err)
	}
}

var signalLoop = kagzi.Define("signal-loop", func(ctx *kagzi.Context, seen []string) ([]string, error) {
	v, err := kagzi.WaitSignal[string](ctx, "item", time.Minute)
	if err != nil {
		return nil, err
	}
	seen = append(seen, v)
	if v != "last" {
		return nil, kagzi.ContinueAsNew(ctx, seen)
	}
	return seen, nil
})

func TestSignalsNotYetTakenMoveToTheRunThatContinues(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	run, err := kagzi.Start(ctx, e.client, signalLoop, []string{}, kagzi.WithID("inbox"))
	if err != nil {
		t.Fatal(err)
	}
	// Every signal is sent before any worker runs: the first run takes one, and the
	// others must reach the runs that continue it.
	for _, v := range []string{"a", "b", "c", "last"} {
		if err := e.client.SignalWorkflow(ctx, "inbox", "item", v); err != nil {
			t.Fatal(err)
		}
	}
	runWorker(t, e.client, fastWorker(), signalLoop)
	out, err := run.Wait(ctx)
	if err != nil || fmt.Sprint(out) != "[a b c last]" {
		t.Fatalf("Wait = %v, %v; want every signal, in order, across four runs", out, err)
	}
}

// summingInbox takes three signals a run, then continues as new with their sum so
// far, until it has received want of them.
var summingInbox = kagzi.Define("summing-inbox", func(ctx *kagzi.Context, in [2]int) (int, error) {
	total, want := in[0], in[1]
	for range 3 {
		if total == want {
			return total, nil
		}
		v, err := kagzi.WaitSignal[int](ctx, "inc", 0)
		if err != nil {
			return 0, err
		}
		total += v
	}
	return 0, kagzi.ContinueAsNew(ctx, [2]int{total, want})
})

// Signals sent to a workflow id while its runs keep continuing as new all arrive, and
// none is refused: a signal sent while a run continued waited for the continue and went
// on to the next run (found from outside: some stranded on finished runs, the sender
// told nil; others refused with ErrRunFinished although the id always had an active
// run).
func TestSignalsSentToAWorkflowIDWhileItsRunsContinueAsNewAllArriveAndNoneIsRefused(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	const senders, each = 4, 40
	run, err := kagzi.Start(ctx, e.client, summingInbox, [2]int{0, senders * each}, kagzi.WithID("summing"))
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, e.client, fastWorker(), summingInbox)
	var wg sync.WaitGroup
	errs := make(chan error, senders*each)
	for range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if err := e.client.SignalWorkflow(ctx, "summing", "inc", 1); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a signal to the workflow id was refused: %v", err)
	}
	if out, err := run.Wait(ctx); err != nil || out != senders*each {
		t.Fatalf("the chain's result: %d, %v; want every one of the %d signals", out, err, senders*each)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.signals WHERE consumed_by IS NULL`); n != 0 {
		t.Fatalf("%d signals never taken", n)
	}
}

var continuingChild = kagzi.Define("continuing-child", func(ctx *kagzi.Context, n int) (int, error) {
	if n < 3 {
		return 0, kagzi.ContinueAsNew(ctx, n+1)
	}
	return n * 100, nil
})

var parentOfContinuing = kagzi.Define("parent-of-continuing", func(ctx *kagzi.Context, _ int) (int, error) {
	child, err := kagzi.StartChild(ctx, "child", continuingChild, 0)
	if err != nil {
		return 0, err
	}
	return child.Get()
})

func TestAChildThatContinuesAsNewGivesItsParentTheLastRunsResult(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	runWorker(t, e.client, fastWorker(), continuingChild, parentOfContinuing)
	run, err := kagzi.Start(ctx, e.client, parentOfContinuing, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != 300 {
		t.Fatalf("parent = %d, %v; want the child chain's last result 300", out, err)
	}
}

func TestContinueAsNewRefusesBadInputAndIsAnOrdinaryErrorFromABranch(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	badInput := kagzi.Define("bad-continue", func(ctx *kagzi.Context, _ int) (int, error) {
		err := kagzi.ContinueAsNew(ctx, func() {}) // a func does not encode
		if !errors.Is(err, kagzi.ErrInvalidArgument) {
			return 0, fmt.Errorf("ContinueAsNew with a func input: %v", err)
		}
		// From a branch, it is an ordinary error: the branch fails, the run does not continue.
		_, err = kagzi.Go(ctx, "branch", func(b *kagzi.Context) (int, error) {
			return 0, kagzi.ContinueAsNew(b, 1)
		}).Get()
		if err == nil {
			return 0, errors.New("the branch's ContinueAsNew was not returned as an error")
		}
		return 7, nil
	})
	if err := kagzi.ContinueAsNew[int](nil, 1); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Fatalf("ContinueAsNew with a nil Context: %v", err)
	}
	runWorker(t, e.client, fastWorker(), badInput)
	run, err := kagzi.Start(ctx, e.client, badInput, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != 7 {
		t.Fatalf("run = %d, %v", out, err)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs`); n != 1 {
		t.Fatalf("%d runs; a refused or branch ContinueAsNew started one", n)
	}
}

// A run of a concurrency key that continues as new frees its key's place as it ends
// (migration 00014: its completion no longer fires the run_changed trigger), and the
// next run, queued in the same key, is announced by its own insert: it starts without
// a poll, and the key never holds two runs.
func TestAKeyedRunThatContinuesAsNewHandsItsKeyPlaceToItsNextRunWithoutAPoll(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "counting", KeyConcurrency: 1}); err != nil {
		t.Fatal(err)
	}
	cfg := fastWorker()
	cfg.PollInterval = time.Hour // only a notification can start the next run
	cfg.LeaseDuration = time.Minute
	runWorker(t, e.client, cfg, countingWorkflow)
	run, err := kagzi.Start(ctx, e.client, countingWorkflow, counterState{Target: 6, Every: 2},
		kagzi.WithID("keyed-counter"), kagzi.WithConcurrencyKey("customer-9"))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if out, err := run.Wait(wctx); err != nil || out != 6 {
		t.Fatalf("the chain ended with %d, %v; want 6", out, err)
	}
	// Three runs, one after another in the key: each started after the one before ended.
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE workflow_id = 'keyed-counter' AND flow_key = 'customer-9'
		AND status = 'COMPLETED'`); n != 3 {
		t.Fatalf("%d completed runs in the key, want 3", n)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs a JOIN kagzi.runs b ON b.continued_from_run_id = a.run_id
		WHERE a.workflow_id = 'keyed-counter' AND b.started_at < a.finished_at`); n != 0 {
		t.Fatalf("%d runs started before the run they continue ended: the key held two", n)
	}
}

// Found from outside: the next run of a keyed chain queued behind every run of its
// key started before the continue, so those ran between the chain's runs.
func TestAKeyedChainKeepsItsKeyPlaceAheadOfRunsQueuedWhileItRan(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "chain-order", KeyConcurrency: 1}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []string
	queued := make(chan struct{})
	wf := kagzi.Define("chain-order", func(ctx *kagzi.Context, n int) (int, error) {
		mu.Lock()
		order = append(order, fmt.Sprint(n))
		mu.Unlock()
		if n >= 0 && n < 2 {
			if n == 0 {
				<-queued // the other runs of the key are queued while the chain's first run holds it
			}
			return 0, kagzi.ContinueAsNew(ctx, n+1)
		}
		return n, nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	chain, err := kagzi.Start(ctx, e.client, wf, 0, kagzi.WithID("subscription-k"), kagzi.WithConcurrencyKey("k"))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the chain's first run to hold the key", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == 1
	})
	var others []*kagzi.Run[int]
	for i := range 3 {
		r, err := kagzi.Start(ctx, e.client, wf, -1-i, kagzi.WithConcurrencyKey("k"))
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, r)
	}
	close(queued)
	if _, err := chain.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range others {
		if _, err := r.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(order, " "); got != "0 1 2 -1 -2 -3" {
		t.Fatalf("execution order %q, want the chain's three runs first, then the runs queued meanwhile", got)
	}
}

var keyedChain = kagzi.Define("keyed-chain", func(ctx *kagzi.Context, n int) (int, error) {
	m, err := kagzi.WaitSignal[string](ctx, "go", 0)
	if err != nil {
		return n, err
	}
	if m != "stop" {
		return n, kagzi.ContinueAsNew(ctx, n+1)
	}
	received := 0
	for {
		if _, err := kagzi.WaitSignal[string](ctx, "data", 300*time.Millisecond); err != nil {
			return received, nil
		}
		received++
	}
})

// A keyed signal stored on a run and moved, not taken, to the run it continued as was
// delivered: a retry sent to the first run's id returns nil, as the key promises
// (found from outside: it returned ErrRunFinished), and stores nothing more.
func TestARetryOfAKeyedSignalThatMovedWithAContinueAsNewReturnsNil(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	runWorker(t, e.client, fastWorker(), keyedChain)
	run, err := kagzi.Start(ctx, e.client, keyedChain, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.client.Signal(ctx, run.RunID, "data", "payload", kagzi.SignalKey("webhook-1")); err != nil {
		t.Fatal(err)
	}
	if err := e.client.SignalWorkflow(ctx, run.WorkflowID, "go", "next"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the run to continue as new", func() bool {
		info, err := e.client.GetRun(ctx, run.RunID)
		return err == nil && info.ContinuedAsRunID != ""
	})
	if err := e.client.Signal(ctx, run.RunID, "data", "payload", kagzi.SignalKey("webhook-1")); err != nil {
		t.Fatalf("a retry of the keyed signal after it moved down the chain: %v, want nil", err)
	}
	if err := e.client.Signal(ctx, run.RunID, "data", "payload", kagzi.SignalKey("another")); !errors.Is(err, kagzi.ErrRunFinished) {
		t.Fatalf("a new keyed signal to the finished run: %v, want ErrRunFinished", err)
	}
	if err := e.client.SignalWorkflow(ctx, run.WorkflowID, "go", "stop"); err != nil {
		t.Fatal(err)
	}
	if n, err := run.Wait(ctx); err != nil || n != 1 {
		t.Fatalf("the chain received %d data signals, %v; want the one", n, err)
	}
}

// A chain that continues as new every few milliseconds stops when its workflow id is
// cancelled (found from outside: CancelRuns by workflow id matched only the finished
// runs of such a chain, and Cancel of a run id came too late, ErrRunFinished).
func TestCancelWorkflowStopsAChainThatKeepsContinuingAsNew(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	endless := kagzi.Define("endless-chain", func(ctx *kagzi.Context, n int) (int, error) {
		if _, err := kagzi.Step(ctx, "tick", func(context.Context) (int, error) { return n, nil }); err != nil {
			return 0, err
		}
		return 0, kagzi.ContinueAsNew(ctx, n+1)
	})
	runWorker(t, e.client, fastWorker(), endless)
	for round := range 5 {
		id := fmt.Sprint("endless-", round)
		if _, err := kagzi.Start(ctx, e.client, endless, 0, kagzi.WithID(id)); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the chain to continue", func() bool {
			return countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE workflow_id = $1`, id) > 3
		})
		if err := e.client.CancelWorkflow(ctx, id); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		eventually(t, "the chain to stop", func() bool {
			return countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs
				WHERE workflow_id = $1 AND status IN ('PENDING', 'RUNNING', 'SLEEPING')`, id) == 0
		})
		info, err := e.client.GetRunByWorkflowID(ctx, id)
		if err != nil || info.Status != kagzi.StatusCancelled {
			t.Fatalf("round %d: the chain's newest run %+v, %v; want it CANCELLED", round, info, err)
		}
		// Cancelling it again is a no-op, as for a run.
		if err := e.client.CancelWorkflow(ctx, id); err != nil {
			t.Fatalf("round %d: a second cancel: %v", round, err)
		}
	}
}

func TestCancelWorkflowRefusesAnEmptyIdAndTellsANotFoundOrFinishedWorkflow(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	if err := e.client.CancelWorkflow(ctx, ""); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Fatalf("an empty workflow id: %v, want ErrInvalidArgument", err)
	}
	if err := e.client.CancelWorkflow(ctx, "never-started"); !errors.Is(err, kagzi.ErrNotFound) {
		t.Fatalf("a workflow id no run has: %v, want ErrNotFound", err)
	}
	runWorker(t, e.client, fastWorker(), countingWorkflow)
	run, err := kagzi.Start(ctx, e.client, countingWorkflow, counterState{Target: 4, Every: 1}, kagzi.WithID("counted"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.client.CancelWorkflow(ctx, "counted"); !errors.Is(err, kagzi.ErrRunFinished) {
		t.Fatalf("a workflow id whose chain completed: %v, want ErrRunFinished", err)
	}
	if info, err := e.client.GetRunByWorkflowID(ctx, "counted"); err != nil || info.Status != kagzi.StatusCompleted {
		t.Fatalf("the completed chain's newest run: %+v, %v", info, err)
	}
}
