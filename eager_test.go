package kagzi_test

import (
	"context"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi"
)

var echo = kagzi.Define("echo", func(ctx *kagzi.Context, n int) (int, error) {
	return kagzi.Step(ctx, "echo", func(context.Context) (int, error) { return n, nil })
})

// claimKinds counts the runs a client's workers got from their starts (eager) and
// from claim statements.
type claimKinds struct {
	kagzi.NopHooks
	eager, byStatement, statements atomic.Int64
}

func (c *claimKinds) Claim(_ context.Context, e *kagzi.ClaimEvent) {
	if e.Eager {
		c.eager.Add(int64(e.Claimed))
	} else {
		c.byStatement.Add(int64(e.Claimed))
		c.statements.Add(1)
	}
}

func TestAStartInAProcessWhoseWorkerHasAFreeSlotIsClaimedByTheStartItself(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	pool, rt := tracedPool(t, e.url)
	kinds := &claimKinds{}
	c, err := kagzi.NewClient(pool, kagzi.Config{Logger: quietLogger(), Hooks: kinds})
	if err != nil {
		t.Fatal(err)
	}
	cfg := fastWorker()
	cfg.ID = "eager-worker"
	runWorker(t, c, cfg, echo)
	eventually(t, "the worker to claim nothing at its start", func() bool { return kinds.statements.Load() > 0 })
	claimsBefore := rt.count("kagzi.claim(")
	for i := range 5 {
		run, err := kagzi.Start(ctx, c, echo, i)
		if err != nil {
			t.Fatal(err)
		}
		if out, err := run.Wait(ctx); err != nil || out != i {
			t.Fatalf("run %d: %d, %v", i, out, err)
		}
		info, err := c.GetRun(ctx, run.RunID)
		if err != nil || info.Takeovers != 0 || info.Attempt != 1 || info.StartedAt == nil {
			t.Fatalf("run %+v, %v", info, err)
		}
	}
	// Every run was claimed by its start; a claim statement the worker made meanwhile
	// (its poll or a timer, which a loaded box's slow runs can let through) took none.
	if n, m := kinds.eager.Load(), kinds.byStatement.Load(); n != 5 || m != 0 {
		t.Fatalf("%d of 5 runs claimed by their starts, %d by claim statements; want 5 and 0", n, m)
	}
	t.Logf("claim statements while the five runs started and ran: %d", rt.count("kagzi.claim(")-claimsBefore)
}

func TestStartsThatMayNotBeginAtOnceAreNotClaimedByTheStart(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	release := make(chan struct{})
	blocked := blockingWorkflow("eager-blocked", release)
	cfg := fastWorker()
	cfg.MaxConcurrent = 1
	runWorker(t, e.client, cfg, blocked, echo)
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "echo", Rate: 1000, RatePeriod: time.Second}); err != nil {
		t.Fatal(err)
	}
	// The only slot is taken: a start cannot reserve it.
	busy, err := kagzi.Start(ctx, e.client, blocked, "x")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the slot to be taken", func() bool { return runStatus(t, e.client, busy.RunID) == kagzi.StatusRunning })
	second, err := kagzi.Start(ctx, e.client, blocked, "y")
	if err != nil {
		t.Fatal(err)
	}
	if s := runStatus(t, e.client, second.RunID); s != kagzi.StatusPending {
		t.Fatalf("a start with no free slot left its run %s, want PENDING", s)
	}
	close(release)
	if _, err := second.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	// A start in the caller's transaction, a type with limits, a delayed start:
	// PENDING for a claim, which applies flow control and times. (A keyed run of a
	// type without limits may start eagerly: eager_keyed_test.go.)
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inTx, err := kagzi.StartTx(ctx, tx, e.client, blocked, "tx")
	if err != nil {
		t.Fatal(err)
	}
	var status string
	if err := tx.QueryRow(ctx, `SELECT status FROM kagzi.runs WHERE run_id = $1`, inTx.RunID).Scan(&status); err != nil || status != "PENDING" {
		t.Fatalf("a run started in the caller's transaction is %q (%v) before its commit, want PENDING", status, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := inTx.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	limited, err := kagzi.Start(ctx, e.client, echo, 1)
	if err != nil {
		t.Fatal(err)
	}
	beforeDelayed := time.Now()
	delayed, err := kagzi.Start(ctx, e.client, blocked, "later", kagzi.WithDelay(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	keyed, err := kagzi.Start(ctx, e.client, blocked, "keyed", kagzi.WithConcurrencyKey("k"))
	if err != nil {
		t.Fatal(err)
	}
	for name, run := range map[string]string{"limited type": limited.RunID, "delayed": delayed.RunID, "keyed": keyed.RunID} {
		eventually(t, name+" run to complete", func() bool { return runStatus(t, e.client, run) == kagzi.StatusCompleted })
	}
	var early int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.runs WHERE run_id = $1 AND started_at < $2`, delayed.RunID,
		beforeDelayed.Add(200*time.Millisecond)).
		Scan(&early); err != nil || early != 0 {
		t.Fatalf("the delayed run began before its time (%d, %v)", early, err)
	}
	var counted int
	if err := e.pool.QueryRow(ctx, `SELECT coalesce(sum(s), 0) FROM kagzi.flow_rates, unnest(slots) s WHERE workflow_type = 'echo'`).
		Scan(&counted); err != nil || counted != 1 {
		t.Fatalf("the limited type's rate window counted %d starts (%v), want 1: its run went through a claim", counted, err)
	}
}

func TestAnEagerlyClaimedRunOfAProcessKilledBeforeItsFirstStepIsTakenOver(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE effects (run_id text, step text, pid int)`); err != nil {
		t.Fatal(err)
	}
	// The process starts its runs itself (claimed by the start), and hangs in each.
	dying := startWorkerProcessEnv(t, e.url, crashBlockEnv+"=1", crashStartEnv+"=3")
	eventually(t, "the runs to hang in the process that started them", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM effects WHERE step = 'block'`) == 3
	})
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE lease_epoch = 1 AND locked_by IS NOT NULL`); n != 3 {
		t.Fatalf("%d runs held at epoch 1 by the process that started them, want 3", n)
	}
	_ = dying.Process.Signal(syscall.SIGKILL)
	_ = dying.Wait()
	startWorkerProcess(t, e.url, false)
	eventually(t, "the runs to complete in the other process", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE status = 'COMPLETED'`) == 3
	})
	// Each run was taken over from the dead process (at least once: on a loaded box
	// the new process's one-second leases can pass too, and a run be taken over again,
	// or a claim whose steps did not load within its lease hand its runs back).
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE lease_epoch <> takeovers + 1`); n > 0 {
		t.Logf("runs claimed again after their takeover (id, status, epoch, takeovers):\n%s", runsState(e.pool))
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE takeovers >= 1`); n != 3 {
		t.Fatalf("%d runs taken over after the kill, want 3; the runs (id, status, epoch, takeovers):\n%s", n, runsState(e.pool))
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM effects WHERE step = 'one'`); n != 3 {
		t.Fatalf("step one ran %d times for 3 runs: a recorded step ran again", n)
	}
}

func TestAWorkerWithEagerStartsDisabledClaimsTheRunsOfItsProcess(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	pool, rt := tracedPool(t, e.url)
	c := newClient(t, pool, "")
	cfg := fastWorker()
	cfg.DisableEagerStart = true
	runWorker(t, c, cfg, echo)
	eventually(t, "the worker's first claim", func() bool { return rt.count("kagzi.claim(") > 0 })
	time.Sleep(100 * time.Millisecond)
	before := rt.count("kagzi.claim(")
	run, err := kagzi.Start(ctx, c, echo, 7)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != 7 {
		t.Fatalf("%d, %v", out, err)
	}
	if rt.count("kagzi.claim(") == before {
		t.Fatal("no claim: the start claimed its run although the worker declines eager starts")
	}
}

// runsState lists every run's id, status, lease epoch and takeovers, for a failure's message.
func runsState(pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) string {
	var s string
	_ = pool.QueryRow(context.Background(), `SELECT string_agg(concat_ws(', ', run_id, status, lease_epoch, takeovers), E'\n')
		FROM kagzi.runs`).Scan(&s)
	return s
}

var echoLimited = kagzi.Define("echo-limited", func(ctx *kagzi.Context, n int) (int, error) {
	return kagzi.Step(ctx, "echo", func(context.Context) (int, error) { return n, nil })
})

// A start in a worker's process claims its run only when no run of its type waits to
// be claimed before it: with a backlog, such starts jumped it (an outside audit saw
// priority-0 runs of a type limited to 1 run before priority-3600 runs queued earlier).
// The start looks from its worker's claim floor, as the worker's claims do (a worker
// that LISTENs lowers its floor for every run started elsewhere; this one does not
// LISTEN, so the queued runs are started after its first claim, above its floor).
func TestAnEagerStartDoesNotJumpRunsQueuedBeforeIt(t *testing.T) {
	for _, wf := range []*kagzi.Workflow[int, int]{echo, echoLimited} {
		t.Run(wf.Name(), func(t *testing.T) {
			e := newEnv(t)
			ctx := waitCtx(t)
			if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: echoLimited.Name(), Concurrency: 1}); err != nil {
				t.Fatal(err)
			}
			kinds := &claimKinds{}
			// No LISTEN and a poll an hour apart: the worker claims at its start and
			// then only through starts of its own process.
			c, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Hooks: kinds, DisableDirectConn: true})
			if err != nil {
				t.Fatal(err)
			}
			cfg := fastWorker()
			cfg.PollInterval, cfg.MaxConcurrent = time.Hour, 4
			w, _ := startWorker(t, c, cfg, wf)
			// Its first claim, and the next-wake look after it: runs started before
			// that look would be found by it, and claimed at once.
			eventually(t, "the worker's first claim and next-wake look", func() bool {
				return kinds.statements.Load() > 0 && kagzi.WakeAsks(w) > 0
			})
			if wf == echoLimited {
				// The client's first start of a limited type learns that it is: its
				// run waits for a claim (here, first in the queue).
				if _, err := kagzi.Start(ctx, c, wf, -1); err != nil {
					t.Fatal(err)
				}
				if !kagzi.NotedLimited(c, wf.Name()) {
					t.Fatal("the client did not note the limited type")
				}
			}
			// Queued from a process without a worker.
			for i := range 3 {
				if _, err := kagzi.Start(ctx, e.client, wf, i); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 3 {
				run, err := kagzi.Start(ctx, c, wf, 10+i)
				if err != nil {
					t.Fatal(err)
				}
				if info, err := c.GetRun(ctx, run.RunID); err != nil || info.Status != kagzi.StatusPending {
					t.Fatalf("a start behind three queued runs of its priority: %s, %v; want PENDING",
						info.Status, err)
				}
			}
			// Above the queued runs' priority, a start takes the free slot.
			if _, err := kagzi.Start(ctx, c, wf, 20, kagzi.WithPriority(3600)); err != nil {
				t.Fatal(err)
			}
			if n := kinds.eager.Load(); n != 1 {
				t.Fatalf("%d runs claimed by their starts, want 1 (the last)", n)
			}
			// A start held back by the queue alone does not make the client take a
			// type without limits for a limited one.
			if limited := kagzi.NotedLimited(c, wf.Name()); limited != (wf == echoLimited) {
				t.Fatalf("the client notes %s as limited: %v", wf.Name(), limited)
			}
		})
	}
}
