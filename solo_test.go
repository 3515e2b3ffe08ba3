package kagzi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

// A run taken over MaxTakeovers times runs alone in its worker (see WorkerConfig.
// MaxTakeovers). These tests make a run such a suspect without killing processes:
// its start sets its takeover count in the same transaction.

// startSuspect starts a run of wf whose takeover count is already takeovers.
func startSuspect[In, Out any](t *testing.T, e *env, wf *kagzi.Workflow[In, Out], input In,
	takeovers int, opts ...kagzi.StartOption) *kagzi.Run[Out] {
	t.Helper()
	ctx := waitCtx(t)
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	run, err := kagzi.StartTx(ctx, tx, e.client, wf, input, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE kagzi.runs SET takeovers = $2 WHERE run_id = $1`, run.RunID, takeovers); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return run
}

// aloneRecord reads what the run's last execution recorded of how it ran ("" when
// nothing).
func aloneRecord(t *testing.T, pool *pgxpool.Pool, runID string) (alone bool, found bool) {
	t.Helper()
	var out []byte
	err := pool.QueryRow(context.Background(), `SELECT output FROM kagzi.steps WHERE run_id = $1 AND step_key = 'kagzi#alone'`,
		runID).Scan(&out)
	if err != nil {
		return false, false
	}
	var m struct {
		Alone bool `json:"alone"`
	}
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("the run's record of how it ran: %s: %v", out, err)
	}
	return m.Alone, true
}

// branchParent defines a parent that starts a child doubling its input and waits for
// it in a branch (where it cannot suspend), and the child; prefix names their types.
func branchParent(prefix string) (parent, child *kagzi.Workflow[int, int]) {
	child = kagzi.Define(prefix+"-child", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Step(ctx, "double", func(context.Context) (int, error) { return 2 * n, nil })
	})
	parent = kagzi.Define(prefix+"-parent", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Go(ctx, "branch", func(b *kagzi.Context) (int, error) {
			c, err := kagzi.StartChild(b, "child", child, n)
			if err != nil {
				return 0, err
			}
			return c.Get()
		}).Get()
	})
	return parent, child
}

// A suspect that waits in a branch for its own child (which it cannot suspend for)
// would wait for ever if its worker claimed nothing while it runs alone: its window
// alone ends, the worker claims the child, and the suspect completes.
func TestASuspectWaitingForItsOwnChildInABranchCompletesInItsOnlyWorker(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	parent, child := branchParent("solo")
	cfg := fastWorker()
	cfg.MaxTakeovers = 1
	run := startSuspect(t, e, parent, 21, 1)
	runWorker(t, e.client, cfg, parent, child)
	if out, err := run.Wait(ctx); err != nil || out != 42 {
		t.Fatalf("the suspect waiting for its child: %d, %v; want 42", out, err)
	}
	if alone, found := aloneRecord(t, e.pool, run.RunID); !found || alone {
		t.Fatalf("the suspect's record says alone=%v (found %v); want a record that it no longer ran alone", alone,
			found)
	}
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil || info.Takeovers != 1 {
		t.Fatalf("the suspect: %+v, %v; want its one takeover, no more", info, err)
	}
}

// A worker that claims a suspect while it executes other runs holds it and waits for
// its runs to end, but not for ever: a parent among them may wait for a child that
// only this worker claims. Past the wait, the suspect runs beside the others.
func TestAWorkerHoldingBackASuspectStillClaimsTheChildrenItsRunsWaitFor(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	entered, release := make(chan struct{}), make(chan struct{})
	child := kagzi.Define("held-child", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Step(ctx, "double", func(context.Context) (int, error) { return 2 * n, nil })
	})
	parent := kagzi.Define("held-parent", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Go(ctx, "branch", func(b *kagzi.Context) (int, error) {
			if _, err := kagzi.Step(b, "hold", func(context.Context) (int, error) {
				select {
				case entered <- struct{}{}:
				default:
				}
				<-release
				return 0, nil
			}); err != nil {
				return 0, err
			}
			c, err := kagzi.StartChild(b, "child", child, n)
			if err != nil {
				return 0, err
			}
			return c.Get()
		}).Get()
	})
	cfg := fastWorker()
	cfg.MaxTakeovers = 1
	cfg.MaxConcurrent = 4
	runWorker(t, e.client, cfg, parent, child, steadyWorkflow)
	p, err := kagzi.Start(ctx, e.client, parent, 5)
	if err != nil {
		t.Fatal(err)
	}
	<-entered
	s := startSuspect(t, e, steadyWorkflow, 1, 1)
	eventually(t, "the worker to claim the suspect", func() bool {
		_, found := aloneRecord(t, e.pool, s.RunID)
		var claims int
		if err := e.pool.QueryRow(ctx, `SELECT lease_epoch FROM kagzi.runs WHERE run_id = $1`, s.RunID).Scan(&claims); err != nil {
			t.Fatal(err)
		}
		return claims > 0 || found
	})
	close(release)
	if out, err := p.Wait(ctx); err != nil || out != 10 {
		t.Fatalf("the parent waiting for its child beside a held-back suspect: %d, %v; want 10", out, err)
	}
	if out, err := s.Wait(ctx); err != nil || out != 2 {
		t.Fatalf("the suspect: %d, %v; want 2", out, err)
	}
	if alone, found := aloneRecord(t, e.pool, s.RunID); found {
		t.Fatalf("the suspect's record says alone=%v; want none: it ran beside the parent", alone)
	}
}

// The record of how a suspect ran is not a patch: Patched of a change id that is its
// key answers as for any new change.
func TestPatchedDoesNotReadTheRecordOfARunAlone(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("solo-patched", func(ctx *kagzi.Context, _ int) (bool, error) {
		// The sleep ends the first execution: the second loads the record.
		if err := ctx.Sleep("nap", 50*time.Millisecond); err != nil {
			return false, err
		}
		return ctx.Patched("kagzi#alone"), nil
	})
	cfg := fastWorker()
	cfg.MaxTakeovers = 1
	cfg.MaxInProcessSleep = time.Millisecond
	run := startSuspect(t, e, wf, 0, 1)
	runWorker(t, e.client, cfg, wf)
	if out, err := run.Wait(ctx); err != nil || !out {
		t.Fatalf("Patched in a suspect: %v, %v; want true", out, err)
	}
	if alone, found := aloneRecord(t, e.pool, run.RunID); !found || !alone {
		t.Fatalf("the suspect's record says alone=%v (found %v); want that it ran alone", alone, found)
	}
}

// A run alone that loses its lease (here its deadline fails it) while its step, which
// ignores its context, goes on: its window alone still ends, and the worker claims
// again long before the step returns.
func TestAWorkerWhoseRunAloneLostItsLeaseClaimsAgainWhileTheStepStillRuns(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	entered := make(chan struct{}, 1)
	var returned atomic.Bool
	stubborn := kagzi.Define("solo-stubborn", func(ctx *kagzi.Context, _ int) (int, error) {
		return kagzi.Step(ctx, "stubborn", func(context.Context) (int, error) {
			entered <- struct{}{}
			time.Sleep(40 * time.Second) // ignores its context
			returned.Store(true)
			return 1, nil
		})
	})
	cfg := fastWorker()
	cfg.MaxTakeovers = 1
	cfg.MaxConcurrent = 4
	s := startSuspect(t, e, stubborn, 0, 1, kagzi.WithRunTimeout(2*time.Second))
	runWorker(t, e.client, cfg, stubborn, steadyWorkflow)
	<-entered
	r, err := kagzi.Start(ctx, e.client, steadyWorkflow, 1)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := r.Wait(ctx); err != nil || out != 2 {
		t.Fatalf("a run started beside the run alone: %d, %v", out, err)
	}
	if returned.Load() {
		t.Fatal("the worker claimed nothing until the step of its run alone returned")
	}
	if _, err := s.Wait(ctx); !errors.Is(err, kagzi.ErrDeadlineExceeded) {
		t.Fatalf("the run alone: %v, want its deadline exceeded", err)
	}
}

// A suspect whose record of running alone cannot be written (here a trigger refuses
// it) runs beside other runs: its worker does not stay alone, and the suspect's own
// child, which only this worker claims, runs.
func TestASuspectWhoseRecordCannotBeWrittenDoesNotKeepItsWorkerAlone(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	if _, err := e.pool.Exec(ctx, `
		CREATE FUNCTION refuse_alone() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.step_key = 'kagzi#alone' THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$;
		CREATE TRIGGER refuse_alone BEFORE INSERT OR UPDATE ON kagzi.steps FOR EACH ROW EXECUTE FUNCTION refuse_alone();`); err != nil {
		t.Fatal(err)
	}
	parent, child := branchParent("unmarked")
	cfg := fastWorker()
	cfg.MaxTakeovers = 1
	run := startSuspect(t, e, parent, 21, 1)
	runWorker(t, e.client, cfg, parent, child)
	if out, err := run.Wait(ctx); err != nil || out != 42 {
		t.Fatalf("the suspect: %d, %v; want 42", out, err)
	}
}

// Only a takeover of the execution that ran alone fails a suspect: one of a claim that
// never ran it since (a lost claim, a process killed before it began) does not, nor
// does the next execution of a suspect that ran alone and suspended.
func TestATakeoverOfAClaimThatNeverRanASuspectDoesNotFailIt(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("solo-napper", func(ctx *kagzi.Context, _ int) (int, error) {
		if err := ctx.Sleep("nap", 2*time.Second); err != nil {
			return 0, err
		}
		return 7, nil
	})
	s, cfg := sleepAfterRunningAlone(t, e, wf)
	// A claim that never ran it: RUNNING under the next epoch, its lease passed.
	if _, err := e.pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'RUNNING', lease_epoch = lease_epoch + 1,
		locked_by = 'ghost', available_at = now() WHERE run_id = $1`, s.RunID); err != nil {
		t.Fatal(err)
	}
	runWorker(t, e.client, cfg, wf)
	if out, err := s.Wait(ctx); err != nil || out != 7 {
		t.Fatalf("the suspect after a takeover of a claim that never ran it: %d, %v; want 7", out, err)
	}
	if info, err := e.client.GetRun(ctx, s.RunID); err != nil || info.Takeovers != 2 {
		t.Fatalf("the suspect: %+v, %v; want 2 takeovers", info, err)
	}
}

// A busy worker that claims a suspect keeps it until it can run it alone: it is not
// handed back to the head of the queue, where every busy worker would claim it in turn
// and stop claiming for it.
func TestASuspectClaimedByABusyWorkerIsClaimedOnceAndOthersGoOn(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	release := make(chan struct{})
	hold := kagzi.Define("solo-hold", func(ctx *kagzi.Context, _ int) (int, error) {
		return kagzi.Step(ctx, "hold", func(c context.Context) (int, error) {
			select {
			case <-release:
			case <-c.Done():
				return 0, c.Err()
			}
			return 0, nil
		})
	})
	cfg := fastWorker()
	cfg.MaxTakeovers = 1
	cfg.MaxConcurrent = 4
	cfg.DisableEagerStart = true
	for _, id := range []string{"solo-a", "solo-b"} {
		c := cfg
		c.ID = id
		runWorker(t, e.client, c, hold, steadyWorkflow)
	}
	var holds []*kagzi.Run[int]
	for i := 0; countRows(t, e.pool, `SELECT count(DISTINCT locked_by) FROM kagzi.runs WHERE status = 'RUNNING'`) < 2; i++ {
		if i > 50 {
			t.Fatal("could not make both workers busy")
		}
		r, err := kagzi.Start(ctx, e.client, hold, i)
		if err != nil {
			t.Fatal(err)
		}
		holds = append(holds, r)
		time.Sleep(50 * time.Millisecond)
	}
	s := startSuspect(t, e, steadyWorkflow, 100, 1)
	var quick []*kagzi.Run[int]
	for i := range 6 {
		r, err := kagzi.Start(ctx, e.client, steadyWorkflow, i)
		if err != nil {
			t.Fatal(err)
		}
		quick = append(quick, r)
	}
	for i, r := range quick {
		if out, err := r.Wait(ctx); err != nil || out != i+1 {
			t.Fatalf("quick run %d beside a held suspect: %d, %v", i, out, err)
		}
	}
	close(release)
	for _, r := range holds {
		if _, err := r.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := s.Wait(ctx); err != nil || out != 101 {
		t.Fatalf("the suspect: %d, %v; want 101", out, err)
	}
	var claims int
	if err := e.pool.QueryRow(ctx, `SELECT lease_epoch FROM kagzi.runs WHERE run_id = $1`, s.RunID).Scan(&claims); err != nil {
		t.Fatal(err)
	}
	if claims != 1 {
		t.Fatalf("the suspect was claimed %d times, want once: a busy worker keeps it", claims)
	}
}

// longWorkflow is one step of 12 s: longer than twice a window alone (5 s with the
// subprocess worker's 1 s lease).
var longWorkflow = kagzi.Define("long", func(ctx *kagzi.Context, n int) (int, error) {
	return kagzi.Step(ctx, "wait", func(c context.Context) (int, error) {
		select {
		case <-time.After(12 * time.Second):
		case <-c.Done():
			return 0, c.Err()
		}
		return n + 1, nil
	})
})

// A healthy run longer than its window alone, queued before a poison run in the one
// worker process: once its window passes the poison run does not join it (another
// suspect executes), and runs alone after it; the healthy run completes.
func TestALongHealthyRunBesideAPoisonRunInOneProcessCompletes(t *testing.T) {
	e := newEnv(t)
	// Cycles of 12 s runs and windows of 5 s, with subprocesses starting under load.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE effects (run_id text, step text, pid int)`); err != nil {
		t.Fatal(err)
	}
	long, err := kagzi.Start(ctx, e.client, longWorkflow, 1)
	if err != nil {
		t.Fatal(err)
	}
	poison, err := kagzi.Start(ctx, e.client, poisonWorkflow(e.pool), 0)
	if err != nil {
		t.Fatal(err)
	}
	env := fmt.Sprint(crashMaxTakeoverEnv, "=", 1)
	restartWorkerUntil(t, e, env, 6, time.Minute, "the poison run to fail", func() bool {
		return runStatus(t, e.client, poison.RunID) == kagzi.StatusFailed
	})
	startWorkerProcessEnv(t, e.url, env)
	if out, err := long.Wait(ctx); err != nil || out != 2 {
		t.Fatalf("the long healthy run: %d, %v; want 2", out, err)
	}
	if _, err := poison.Wait(ctx); !errors.Is(err, kagzi.ErrRecoveryExhausted) {
		t.Fatalf("the poison run: %v, want RECOVERY_EXHAUSTED", err)
	}
}

// A suspect child of a suspect parent that waits for it in a branch (both died with
// their process) runs beside its parent: held behind it, it would wait for ever.
func TestASuspectChildOfASuspectParentWaitingForItRunsBesideIt(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	// Every child is inserted with one takeover, as if it had died with its parent.
	if _, err := e.pool.Exec(ctx, `
		CREATE FUNCTION child_taken_over() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.parent_run_id IS NOT NULL THEN NEW.takeovers := 1; END IF; RETURN NEW; END $$;
		CREATE TRIGGER child_taken_over BEFORE INSERT ON kagzi.runs FOR EACH ROW EXECUTE FUNCTION child_taken_over();`); err != nil {
		t.Fatal(err)
	}
	parent, child := branchParent("suspect")
	cfg := fastWorker()
	cfg.MaxTakeovers = 1
	cfg.DisableEagerStart = true
	cfg.MaxConcurrent = 2
	run := startSuspect(t, e, parent, 21, 1)
	runWorker(t, e.client, cfg, parent, child, steadyWorkflow)
	if out, err := run.Wait(ctx); err != nil || out != 42 {
		t.Fatalf("the suspect parent waiting for its suspect child: %d, %v; want 42", out, err)
	}
	q, err := kagzi.Start(ctx, e.client, steadyWorkflow, 1)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := q.Wait(ctx); err != nil || out != 2 {
		t.Fatalf("a run after them: %d, %v", out, err)
	}
}

// Several runs that kill their process, and healthy runs, in one worker process
// restarted after each death: a worker holds one suspect at a time, so a poison run
// alone takes no other suspect with it, and the healthy runs complete.
func TestSeveralPoisonRunsInOneProcessFailAloneAndTheHealthyRunsComplete(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a subprocess per death
	defer cancel()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE effects (run_id text, step text, pid int)`); err != nil {
		t.Fatal(err)
	}
	var poisons, healthy []*kagzi.Run[int]
	for i := range 3 {
		p, err := kagzi.Start(ctx, e.client, poisonWorkflow(e.pool), i)
		if err != nil {
			t.Fatal(err)
		}
		poisons = append(poisons, p)
	}
	for i := range 3 {
		r, err := kagzi.Start(ctx, e.client, slowWorkflow, i)
		if err != nil {
			t.Fatal(err)
		}
		healthy = append(healthy, r)
	}
	env := fmt.Sprint(crashMaxTakeoverEnv, "=", 1)
	allFailed := func() bool {
		for _, p := range poisons {
			if runStatus(t, e.client, p.RunID) != kagzi.StatusFailed {
				return false
			}
		}
		return true
	}
	restartWorkerUntil(t, e, env, 12, 20*time.Second, "the poison runs to fail", allFailed)
	startWorkerProcessEnv(t, e.url, env)
	for i, r := range healthy {
		if out, err := r.Wait(ctx); err != nil || out != i+1 {
			t.Fatalf("healthy run %d beside the poison runs: %d, %v; want %d", i, out, err, i+1)
		}
	}
	for i, p := range poisons {
		if _, err := p.Wait(ctx); !errors.Is(err, kagzi.ErrRecoveryExhausted) {
			t.Fatalf("poison run %d: %v, want RECOVERY_EXHAUSTED", i, err)
		}
	}
}

// The suspects a claim returns beyond the one the worker holds go back to the queue,
// where another worker takes them: they do not wait in line in one worker.
func TestSuspectsBeyondTheOneAWorkerHoldsGoToOtherWorkers(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	release := make(chan struct{})
	var running atomic.Int32
	var both atomic.Bool
	gate := kagzi.Define("solo-gate", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Step(ctx, "gate", func(c context.Context) (int, error) {
			if running.Add(1) >= 2 {
				both.Store(true)
			}
			defer running.Add(-1)
			select {
			case <-release:
			case <-c.Done():
				return 0, c.Err()
			}
			return n, nil
		})
	})
	var suspects []*kagzi.Run[int]
	for i := range 3 {
		suspects = append(suspects, startSuspect(t, e, gate, i, 1))
	}
	cfg := fastWorker()
	cfg.MaxTakeovers = 1
	cfg.MaxConcurrent = 3
	cfg.DisableEagerStart = true
	for _, id := range []string{"solo-first", "solo-second"} {
		c := cfg
		c.ID = id
		runWorker(t, e.client, c, gate)
	}
	eventually(t, "suspects to run in both workers at once", both.Load)
	close(release)
	for i, r := range suspects {
		if out, err := r.Wait(ctx); err != nil || out != i {
			t.Fatalf("suspect %d: %d, %v", i, out, err)
		}
	}
}

// timebombWorkflow is a step with a timeout whose body ignores its context and kills
// its process 1.5 s later (a cgo call that hangs, then crashes): the step is abandoned
// at its timeout and the run fails, while its goroutine goes on.
var timebombWorkflow = kagzi.Define("timebomb", func(ctx *kagzi.Context, _ int) (int, error) {
	return kagzi.Step(ctx, "bomb", func(context.Context) (int, error) {
		time.Sleep(1500 * time.Millisecond)
		if os.Getenv(crashWorkerEnv) != "" {
			os.Exit(3)
		}
		return 0, nil
	}, kagzi.WithStepTimeout(200*time.Millisecond), kagzi.WithRetry(kagzi.NoRetry()))
}, kagzi.WithWorkflowRetry(kagzi.NoRetry()))

// A step goroutine abandoned at its timeout still runs code that may kill the process:
// a suspect does not run alone beside it, and does not fail when it kills the process.
func TestASuspectDoesNotRunAloneBesideAnAbandonedStepThatKillsTheProcess(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a 12 s run, subprocesses
	defer cancel()
	env := fmt.Sprint(crashMaxTakeoverEnv, "=", 1)
	proc := startWorkerProcessEnv(t, e.url, env)
	bomb, err := kagzi.Start(ctx, e.client, timebombWorkflow, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bomb.Wait(ctx); err == nil {
		t.Fatal("the run of the abandoned step completed")
	}
	s := startSuspect(t, e, longWorkflow, 1, 1)
	eventually(t, "the abandoned step to kill its process", func() bool { return processState(t, proc.Process.Pid) == "Z" })
	if alone, found := aloneRecord(t, e.pool, s.RunID); found && alone {
		t.Fatal("the suspect ran alone beside the abandoned step")
	}
	startWorkerProcessEnv(t, e.url, env)
	if out, err := s.Wait(ctx); err != nil || out != 2 {
		t.Fatalf("the suspect: %d, %v; want 2", out, err)
	}
}

// A held suspect cancelled while its worker drains for it ends at once, not when the
// drain's window passes.
func TestAHeldSuspectCancelledEndsAtOnce(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	release := make(chan struct{})
	defer close(release)
	entered := make(chan struct{}, 1)
	busy := kagzi.Define("solo-busy", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Step(ctx, "wait", func(c context.Context) (int, error) {
			entered <- struct{}{}
			select {
			case <-release:
			case <-c.Done():
				return 0, c.Err()
			}
			return n, nil
		})
	})
	cfg := fastWorker()
	cfg.MaxTakeovers = 1
	cfg.DisableEagerStart = true
	cfg.LeaseDuration = 10 * time.Second // a window of 30 s
	runWorker(t, e.client, cfg, busy, steadyWorkflow)
	if _, err := kagzi.Start(ctx, e.client, busy, 1); err != nil {
		t.Fatal(err)
	}
	<-entered
	s := startSuspect(t, e, steadyWorkflow, 1, 1)
	eventually(t, "the worker to hold the suspect", func() bool {
		var epoch int
		if err := e.pool.QueryRow(ctx, `SELECT lease_epoch FROM kagzi.runs WHERE run_id = $1`, s.RunID).Scan(&epoch); err != nil {
			t.Fatal(err)
		}
		return epoch > 0
	})
	if err := e.client.Cancel(ctx, s.RunID); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second) // half the window
	defer cancel()
	if _, err := s.Wait(wctx); !errors.Is(err, kagzi.ErrCancelled) {
		t.Fatalf("the held suspect, cancelled: %v; want it cancelled before the drain's window passed", err)
	}
}

// sleepAfterRunningAlone starts a suspect of wf (input 0, taken over once, at
// MaxTakeovers 1) and runs a worker until the suspect, executing alone, sleeps; it
// returns the run and the worker's configuration.
func sleepAfterRunningAlone(t *testing.T, e *env, wf *kagzi.Workflow[int, int]) (*kagzi.Run[int], kagzi.WorkerConfig) {
	t.Helper()
	cfg := fastWorker()
	cfg.MaxTakeovers = 1
	cfg.MaxInProcessSleep = time.Millisecond
	s := startSuspect(t, e, wf, 0, 1)
	stop := runWorker(t, e.client, cfg, wf)
	eventually(t, "the suspect to sleep after running alone", func() bool {
		return runStatus(t, e.client, s.RunID) == kagzi.StatusSleeping
	})
	stop()
	if alone, found := aloneRecord(t, e.pool, s.RunID); !found || !alone {
		t.Fatalf("the suspect's record says alone=%v (found %v); want that it ran alone", alone, found)
	}
	return s, cfg
}
