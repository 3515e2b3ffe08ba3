package kagzi_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

func TestAKilledWorkerProcessRunsAreTakenOverLongBeforeTheirDefaultLeasePasses(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE effects (run_id text, step text, pid int)`); err != nil {
		t.Fatal(err)
	}
	// Workers with the default lease (10 s), heartbeat and reap interval.
	defaults := crashDefaultsEnv + "=1"
	dying := startWorkerProcessEnv(t, e.url, defaults, crashBlockEnv+"=1")
	wf := crashyWorkflow(e.pool, false)
	const runs = 5
	var started []*kagzi.Run[int]
	for i := range runs {
		run, err := kagzi.Start(ctx, e.client, wf, i)
		if err != nil {
			t.Fatal(err)
		}
		started = append(started, run)
	}
	eventually(t, "every run to hang in the dying process", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM effects WHERE step = 'block'`) == runs
	})
	startWorkerProcessEnv(t, e.url, defaults)
	// The survivor reaps once its own liveness lock is a few intervals old.
	time.Sleep(3 * time.Second)
	var leaseEnds time.Time // the latest lease of the dying process's runs
	if err := e.pool.QueryRow(ctx, `SELECT max(available_at) FROM kagzi.runs WHERE status = 'RUNNING'`).Scan(&leaseEnds); err != nil {
		t.Fatal(err)
	}
	_ = dying.Process.Signal(syscall.SIGKILL)
	_ = dying.Wait()
	var killedAt time.Time
	if err := e.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&killedAt); err != nil {
		t.Fatal(err)
	}
	for _, run := range started {
		if _, err := run.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Each run was taken over (a claim of the next epoch) before its lease would have
	// passed: the dead process was seen dead, not waited out.
	var takeovers []time.Duration
	for _, run := range started {
		info, err := e.client.GetRun(ctx, run.RunID)
		if err != nil {
			t.Fatal(err)
		}
		if info.Takeovers != 1 {
			t.Fatalf("run %s: %d takeovers, want 1", run.RunID, info.Takeovers)
		}
		// The step the kill interrupted ran again in the survivor, and was recorded
		// there: when it finished is (just after) when the run resumed.
		var claimed time.Time
		if err := e.pool.QueryRow(ctx, `SELECT finished_at FROM kagzi.steps WHERE run_id = $1 AND step_key = 'block#1'`,
			run.RunID).Scan(&claimed); err != nil {
			t.Fatal(err)
		}
		if !claimed.Before(leaseEnds) {
			t.Errorf("run %s resumed at %v, not before its dead process's lease ended at %v", run.RunID, claimed, leaseEnds)
		}
		takeovers = append(takeovers, claimed.Sub(killedAt))
	}
	slices.Sort(takeovers)
	t.Logf("runs resumed %v after the kill (lease 10s, leases ended %v after it)", takeovers,
		leaseEnds.Sub(killedAt).Round(time.Millisecond))
	var offline string
	if err := e.pool.QueryRow(context.Background(), `SELECT status FROM kagzi.workers WHERE pid = $1`, dying.Process.Pid).
		Scan(&offline); err != nil || offline != string(kagzi.WorkerOffline) {
		t.Fatalf("the dead worker is %q (%v), want OFFLINE", offline, err)
	}
}

// Found from outside: a process restarted with the id of one that died (a
// StatefulSet's pod name) took its predecessor's runs only when their leases passed.
func TestAWorkerRestartedWithItsDeadPredecessorsIDTakesItsRunsAtOnce(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	run, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: "restarted"})
	if err != nil {
		t.Fatal(err)
	}
	leaseTo(t, e, run.RunID, "pod-0") // claimed by the process "pod-0" that then died
	cfg := fastWorker()
	cfg.ID = "pod-0"
	cfg.LeaseDuration = time.Hour
	runWorker(t, e.client, cfg, greet)
	if _, err := run.Wait(ctx); err != nil {
		t.Fatalf("the predecessor's run: %v, want it completed by the restarted worker", err)
	}
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if info.Takeovers != 1 {
		t.Fatalf("the run's takeovers: %d, want 1 (taken over from the dead process)", info.Takeovers)
	}
}

// Found from outside: a worker restarted under its fixed id (a StatefulSet's pod) was
// taken for dead by another process's look for dead workers in the moment before it
// recorded its own liveness key: the runs it had just claimed were freed, their
// bodies ran twice and a takeover counted against MaxTakeovers.
func TestAWorkerRestartedUnderItsFixedIDIsNotTakenForDeadWhileItRuns(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var bodies atomic.Int32
	wf := kagzi.Define("pod-runs", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Step(ctx, "work", func(c context.Context) (int, error) {
			bodies.Add(1)
			select {
			case <-time.After(300 * time.Millisecond):
			case <-c.Done():
				return 0, c.Err()
			}
			return n, nil
		})
	})
	other := kagzi.Define("pod-other", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
	// Another process's worker, looking for dead workers every 10 ms (as a fleet of
	// them would, between them), of another type: it claims none of the runs.
	runWorker(t, newClient(t, e.pool, ""), kagzi.WorkerConfig{ReapInterval: 10 * time.Millisecond, DisableScheduler: true}, other)
	var runs []*kagzi.Run[int]
	for restart := range 8 {
		c := newClient(t, e.pool, "") // a new process: its own client and direct connection
		batch := make([]*kagzi.Run[int], 4)
		for i := range batch {
			r, err := kagzi.Start(ctx, e.client, wf, restart*4+i)
			if err != nil {
				t.Fatal(err)
			}
			batch[i] = r
		}
		stop := runWorker(t, c, kagzi.WorkerConfig{ID: "pod-0", DisableScheduler: true, DrainTimeout: 5 * time.Second}, wf)
		for _, r := range batch {
			if _, err := r.Wait(ctx); err != nil {
				t.Fatalf("restart %d: %v", restart, err)
			}
		}
		stop()
		c.Close()
		runs = append(runs, batch...)
	}
	var taken []string
	for _, r := range runs {
		info, err := e.client.GetRun(ctx, r.RunID)
		if err != nil {
			t.Fatal(err)
		}
		if info.Takeovers != 0 {
			taken = append(taken, fmt.Sprintf("%s (%d)", r.RunID, info.Takeovers))
		}
	}
	if len(taken) > 0 || int(bodies.Load()) != len(runs) {
		t.Fatalf("%d bodies ran for %d runs; runs taken over from the live worker: %v", bodies.Load(), len(runs), taken)
	}
}
