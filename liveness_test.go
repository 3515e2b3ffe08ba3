package kagzi_test

import (
	"context"
	"slices"
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
