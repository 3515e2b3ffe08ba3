package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

// freezingWorkflow has one step, "charge", whose body records its execution in
// effects and returns its process's pid. In a worker process started with
// crashFreezeEnv, the first execution stops the whole process (SIGSTOP) after the
// claim and before the step: a process frozen by a VM pause or a long GC pause.
func freezingWorkflow(pool *pgxpool.Pool) *kagzi.Workflow[int, int] {
	var froze atomic.Bool
	return kagzi.Define("freezes-after-claim", func(ctx *kagzi.Context, _ int) (int, error) {
		if os.Getenv(crashFreezeEnv) == "1" && froze.CompareAndSwap(false, true) {
			_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			time.Sleep(100 * time.Millisecond) // the kernel stops every thread soon, not at once
		}
		return kagzi.Step(ctx, "charge", func(c context.Context) (int, error) {
			_, err := pool.Exec(c, `INSERT INTO effects (run_id, step, pid) VALUES ($1, 'charge', $2)`, ctx.RunID(), os.Getpid())
			return os.Getpid(), err
		})
	})
}

func TestAWorkerFrozenAfterItsClaimDoesNotRunAStepAnotherWorkerRecorded(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE effects (run_id text, step text, pid int)`); err != nil {
		t.Fatal(err)
	}
	run, err := kagzi.Start(ctx, e.client, freezingWorkflow(e.pool), 0)
	if err != nil {
		t.Fatal(err)
	}
	frozen := startWorkerProcessEnv(t, e.url, crashFreezeEnv+"=1")
	eventually(t, "the first process to claim the run and freeze", func() bool {
		return processState(t, frozen.Process.Pid) == "T"
	})
	if s := runStatus(t, e.client, run.RunID); s != kagzi.StatusRunning {
		t.Fatalf("the frozen process's run is %s, want RUNNING", s)
	}
	healthy := startWorkerProcess(t, e.url, false)
	out, err := run.Wait(ctx) // taken over once the frozen process's lease (1 s) passed
	if err != nil || out != healthy.Process.Pid {
		t.Fatalf("got %d, %v; want the output of the process that took the run over (%d)", out, err, healthy.Process.Pid)
	}
	// The frozen process wakes up to a finished run. Whatever it does, it does at
	// once; a graceful stop then waits for its execution to end.
	if err := frozen.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if err := frozen.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := frozen.Wait(); err != nil {
		t.Fatalf("the woken process exited with %v, want a clean exit", err)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM effects WHERE pid = $1`, frozen.Process.Pid); n != 0 {
		t.Fatalf("the process that woke up after losing its lease ran the recorded step's body %d time(s)", n)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM effects`); n != 1 {
		t.Fatalf("the step body ran %d times, want once", n)
	}
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil || info.Status != kagzi.StatusCompleted || info.Takeovers != 1 {
		t.Fatalf("run %+v, %v; want COMPLETED after one takeover", info, err)
	}
}

// poisonWorkflow's step kills its process in worker processes (os.Exit), every time,
// as a step that runs out of memory or crashes in cgo would.
func poisonWorkflow(pool *pgxpool.Pool) *kagzi.Workflow[int, int] {
	return kagzi.Define("poison", func(ctx *kagzi.Context, _ int) (int, error) {
		return kagzi.Step(ctx, "crash", func(c context.Context) (int, error) {
			if _, err := pool.Exec(c, `INSERT INTO effects (run_id, step, pid) VALUES ($1, 'crash', $2)`,
				ctx.RunID(), os.Getpid()); err != nil {
				return 0, err
			}
			if os.Getenv(crashWorkerEnv) != "" {
				os.Exit(3)
			}
			return 0, nil
		})
	})
}

// steadyWorkflow is one quick step.
var steadyWorkflow = kagzi.Define("steady", func(ctx *kagzi.Context, n int) (int, error) {
	return kagzi.Step(ctx, "add", func(context.Context) (int, error) { return n + 1, nil })
})

// slowWorkflow is one step of half a second: runs claimed with a poison run die
// with its process before they end.
var slowWorkflow = kagzi.Define("slow", func(ctx *kagzi.Context, n int) (int, error) {
	return kagzi.Step(ctx, "wait", func(c context.Context) (int, error) {
		select {
		case <-time.After(500 * time.Millisecond):
		case <-c.Done():
			return 0, c.Err()
		}
		return n + 1, nil
	})
})

// Found from outside: the runs executing beside a run whose step kills its process
// die with it and are taken over as often; they failed RECOVERY_EXHAUSTED with it. A
// run taken over MaxTakeovers times runs alone in its worker: the healthy ones
// complete there, and the poison run fails once it killed its process alone.
func TestRunsBesideOneThatKillsItsProcessCompleteAndOnlyItFails(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE effects (run_id text, step text, pid int)`); err != nil {
		t.Fatal(err)
	}
	poison, err := kagzi.Start(ctx, e.client, poisonWorkflow(e.pool), 0)
	if err != nil {
		t.Fatal(err)
	}
	var healthy []*kagzi.Run[int]
	for i := range 3 {
		run, err := kagzi.Start(ctx, e.client, slowWorkflow, i)
		if err != nil {
			t.Fatal(err)
		}
		healthy = append(healthy, run)
	}
	const maxTakeovers = 1
	env := fmt.Sprint(crashMaxTakeoverEnv, "=", maxTakeovers)
	restartWorkerUntil(t, e, env, 12, 20*time.Second, "the poison run to fail", func() bool {
		return runStatus(t, e.client, poison.RunID) == kagzi.StatusFailed
	})
	if _, err := poison.Wait(ctx); !errors.Is(err, kagzi.ErrRecoveryExhausted) {
		t.Fatalf("the poison run ended with %v, want RECOVERY_EXHAUSTED", err)
	}
	startWorkerProcessEnv(t, e.url, env)
	for i, run := range healthy {
		if out, err := run.Wait(ctx); err != nil || out != i+1 {
			t.Fatalf("healthy run %d beside the poison run: %d, %v; want %d", i, out, err, i+1)
		}
	}
	// The poison run killed its process with the others (the first time), then alone.
	if n := countRows(t, e.pool, `SELECT count(*) FROM effects WHERE step = 'crash'`); n != maxTakeovers+1 {
		t.Fatalf("the crashing step ran %d times, want %d: once, then once per allowed takeover (the last alone)", n,
			maxTakeovers+1)
	}
}

// restartWorkerUntil starts a worker subprocess (with env) and waits until it dies or
// done, over and over until done: a supervisor restarting a process that keeps
// dying. It fails the test after maxCycles deaths, or a cycle longer than perCycle.
func restartWorkerUntil(t *testing.T, e *env, env string, maxCycles int, perCycle time.Duration, what string,
	done func() bool) {
	t.Helper()
	for cycle := 0; !done(); cycle++ {
		if cycle > maxCycles {
			t.Fatalf("still waiting for %s after %d worker crashes", what, cycle)
		}
		proc := startWorkerProcessEnv(t, e.url, env)
		eventuallyWithin(t, perCycle, "the worker process to die or "+what, func() bool {
			return processState(t, proc.Process.Pid) == "Z" || done()
		})
	}
}

func TestARunThatCrashesItsWorkerEveryTimeFailsAfterMaxTakeoversWhileOthersComplete(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE effects (run_id text, step text, pid int)`); err != nil {
		t.Fatal(err)
	}
	poison, err := kagzi.Start(ctx, e.client, poisonWorkflow(e.pool), 0)
	if err != nil {
		t.Fatal(err)
	}
	const maxTakeovers = 2
	var others []*kagzi.Run[int]
	for cycle := 0; runStatus(t, e.client, poison.RunID) != kagzi.StatusFailed; cycle++ {
		if cycle > 10 {
			t.Fatalf("the poison run is still %s after %d worker crashes", runStatus(t, e.client, poison.RunID), cycle)
		}
		proc := startWorkerProcessEnv(t, e.url, fmt.Sprint(crashMaxTakeoverEnv, "=", maxTakeovers))
		eventually(t, "the worker process to die or the poison run to fail", func() bool {
			return processState(t, proc.Process.Pid) == "Z" || runStatus(t, e.client, poison.RunID) == kagzi.StatusFailed
		})
		// Another run, started while the poison run waits for its lease to pass: the
		// next process claims it at once and finishes it, whatever the poison run does.
		// (One claimed together with the poison run would die with the process, and be
		// taken over as often.)
		run, err := kagzi.Start(ctx, e.client, steadyWorkflow, cycle)
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, run)
	}
	_, err = poison.Wait(ctx)
	if !errors.Is(err, kagzi.ErrRecoveryExhausted) || !errors.Is(err, kagzi.ErrWorkflowFailed) ||
		kagzi.ErrorCode(err) != kagzi.CodeRecoveryExhausted {
		t.Fatalf("the poison run ended with %v, want a failure with code %s", err, kagzi.CodeRecoveryExhausted)
	}
	info, err := e.client.GetRun(ctx, poison.RunID)
	if err != nil || info.Takeovers != maxTakeovers+1 || info.Attempt != 1 {
		t.Fatalf("poison run %+v, %v; want %d takeovers counted (the last one failed it) and attempt 1",
			info, err, maxTakeovers+1)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM effects WHERE step = 'crash'`); n != maxTakeovers+1 {
		t.Fatalf("the crashing step ran %d times, want %d: once, then once per allowed takeover", n, maxTakeovers+1)
	}
	startWorkerProcess(t, e.url, false)
	for i, run := range others {
		if out, err := run.Wait(ctx); err != nil || out != i+1 {
			t.Fatalf("run %d beside the poison run: %d, %v", i, out, err)
		}
	}
}
