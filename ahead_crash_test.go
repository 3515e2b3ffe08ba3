package kagzi_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

// aheadHelperEnv: the test binary runs as a worker process that holds runs ahead
// (the database URL).
const aheadHelperEnv = "KAGZI_TEST_AHEAD_HELPER"

// aheadChaosWorkflow: input 1 is the run that holds the helper's one slot (its step
// sleeps 3 s in the helper, not in the test's worker); every run's step body records
// an effect with its process's pid.
func aheadChaosWorkflow(pool *pgxpool.Pool, began chan<- struct{}) *kagzi.Workflow[int, int] {
	return kagzi.Define("ahead-chaos", func(ctx *kagzi.Context, n int) (int, error) {
		v, err := kagzi.Step(ctx, "fx", func(c context.Context) (int, error) {
			if _, err := pool.Exec(c, `INSERT INTO effects (run_id, step, pid) VALUES ($1, 'fx', $2)`,
				ctx.RunID(), os.Getpid()); err != nil {
				return 0, err
			}
			if n == 1 && os.Getenv(aheadHelperEnv) != "" {
				if began != nil {
					select {
					case began <- struct{}{}:
					default:
					}
				}
				time.Sleep(3 * time.Second) // ignores its context: survives a SIGSTOP
			}
			return n, nil
		})
		if err != nil {
			return 0, err
		}
		return kagzi.Step(ctx, "after", func(c context.Context) (int, error) {
			_, err := pool.Exec(c, `INSERT INTO effects (run_id, step, pid) VALUES ($1, 'after', $2)`,
				ctx.RunID(), os.Getpid())
			return v, err
		})
	})
}

// runAheadHelper is the main of the helper process: one slot, taken by the run of
// input 1; then it claims the three other queued runs ahead (kept there: its hold is
// an hour) and records that in the table ready.
func runAheadHelper() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(aheadHelperEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	client, err := kagzi.NewClient(pool, kagzi.Config{Logger: quietLogger()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	began := make(chan struct{}, 1)
	cfg := fastWorker()
	cfg.ID, cfg.MaxConcurrent, cfg.DisableScheduler = "ahead-helper", 1, true
	w, err := kagzi.NewWorker(client, cfg, aheadChaosWorkflow(pool, began))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	kagzi.SetAheadHold(w, time.Hour)
	go func() {
		<-began
		ids, err := kagzi.ClaimAhead(ctx, w, 3)
		if err != nil || len(ids) != 3 || kagzi.RunsAhead(w) != 3 {
			fmt.Fprintln(os.Stderr, "helper: claim ahead:", ids, err, kagzi.RunsAhead(w))
			os.Exit(1)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO ready VALUES ($1)`, os.Getpid()); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	if err := w.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// A worker process holding runs ahead (leased to it, never started) is killed, or
// stopped past its lease and then resumed: another worker (MaxTakeovers 1, so every
// run taken over is a suspect) completes every run; no step body of a run that waited
// ahead runs in the helper process, and no run fails RECOVERY_EXHAUSTED.
func TestRunsWaitingAheadInAKilledOrFrozenProcessCompleteOnceElsewhere(t *testing.T) {
	for _, mode := range []string{"kill", "stop"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			ctx := waitCtx(t)
			if _, err := e.pool.Exec(ctx, `CREATE TABLE effects (run_id text, step text, pid int); CREATE TABLE ready (pid int)`); err != nil {
				t.Fatal(err)
			}
			wf := aheadChaosWorkflow(e.pool, nil)
			blocked, err := kagzi.Start(ctx, e.client, wf, 1)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond)
			rest, err := kagzi.StartMany(ctx, e.client, wf, []int{0, 0, 0})
			if err != nil {
				t.Fatal(err)
			}
			helper := exec.Command(os.Args[0], "-test.run=^$")
			helper.Env = append(os.Environ(), aheadHelperEnv+"="+e.url)
			helper.Stdout, helper.Stderr = os.Stderr, os.Stderr
			if err := helper.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = helper.Process.Kill(); _ = helper.Wait() })
			eventually(t, "the helper to hold three runs ahead", func() bool {
				return countRows(t, e.pool, `SELECT count(*) FROM ready`) == 1
			})
			if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE status = 'RUNNING' AND locked_by = 'ahead-helper'`); n != 4 {
				t.Fatalf("%d runs leased to the helper, want 4", n)
			}
			sig := syscall.SIGKILL
			if mode == "stop" {
				sig = syscall.SIGSTOP
			}
			if err := helper.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			cfg := fastWorker()
			cfg.MaxTakeovers, cfg.MaxConcurrent = 1, 4
			runWorker(t, e.client, cfg, wf)
			all := append([]*kagzi.Run[int]{blocked}, rest...)
			for _, r := range all {
				if _, err := r.Wait(ctx); err != nil {
					info, _ := e.client.GetRun(ctx, r.RunID)
					t.Fatalf("run %s: %v (%+v)", r.RunID, err, info)
				}
			}
			if mode == "stop" {
				if err := helper.Process.Signal(syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
				// The helper's blocked step ends (3 s from its start), its slot frees and
				// its runs ahead, whose leases passed, start or are found lost.
				time.Sleep(4 * time.Second)
			}
			for _, r := range rest {
				if n := countRows(t, e.pool, `SELECT count(*) FROM effects WHERE run_id = $1 AND step = 'fx'`, r.RunID); n != 1 {
					t.Errorf("run %s (waited ahead in the helper): its step body ran %d times, want 1", r.RunID, n)
				}
			}
			if n := countRows(t, e.pool, `SELECT count(*) FROM effects WHERE pid = $1 AND run_id <> $2`, helper.Process.Pid, blocked.RunID); n != 0 {
				t.Errorf("%d step bodies of runs that waited ahead ran in the helper process", n)
			}
			if n := countRows(t, e.pool, `SELECT count(*) FROM effects WHERE pid = $1 AND step = 'after'`, helper.Process.Pid); n != 0 {
				t.Errorf("the helper ran %d 'after' step bodies after it lost its leases", n)
			}
			var took []int
			rows, _ := e.pool.Query(ctx, `SELECT takeovers FROM kagzi.runs ORDER BY created_at`)
			for rows.Next() {
				var n int
				_ = rows.Scan(&n)
				took = append(took, n)
			}
			rows.Close()
			t.Logf("takeovers: %v", took)
		})
	}
}
