package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

// The crash tests run workers as real processes: this test binary, started again
// with crashWorkerEnv set, runs a worker instead of the tests (see TestMain).
const (
	crashWorkerEnv      = "KAGZI_TEST_CRASH_WORKER"        // the database URL
	crashBlockEnv       = "KAGZI_TEST_CRASH_BLOCK"         // "1": the "block" step hangs
	crashFreezeEnv      = "KAGZI_TEST_CRASH_FREEZE"        // "1": the process stops itself after its first claim (see freezingWorkflow)
	crashMaxTakeoverEnv = "KAGZI_TEST_CRASH_MAX_TAKEOVERS" // WorkerConfig.MaxTakeovers
	crashSlotsEnv       = "KAGZI_TEST_CRASH_SLOTS"         // WorkerConfig.MaxConcurrent (default 20)
	crashDefaultsEnv    = "KAGZI_TEST_CRASH_DEFAULTS"      // "1": the default lease, heartbeat and reap interval
	crashStartEnv       = "KAGZI_TEST_CRASH_START"         // N: the process starts N crashy runs itself (eagerly claimed)
	crashSchedulerEnv   = "KAGZI_TEST_CRASH_SCHEDULER"     // "1": the worker runs the scheduler; "freeze": and stops its process in the first firing (see freezeOnFire)
	crashFlowStartEnv   = "KAGZI_TEST_CRASH_FLOW_START"    // "N:prefix": the process starts N runs of "limited" itself, one at a time (see startLedgeredRuns)
)

// crashy records every execution of every step body in the effects table, so the
// test can count them. Its third step hangs in processes started with crashBlockEnv.
func crashyWorkflow(pool *pgxpool.Pool, block bool) *kagzi.Workflow[int, int] {
	effect := func(ctx context.Context, runID, step string) error {
		_, err := pool.Exec(ctx, `INSERT INTO effects (run_id, step, pid) VALUES ($1, $2, $3)`, runID, step, os.Getpid())
		return err
	}
	return kagzi.Define("crashy", func(ctx *kagzi.Context, n int) (int, error) {
		sum := n
		for _, name := range []string{"one", "two"} {
			v, err := kagzi.Step(ctx, name, func(c context.Context) (int, error) {
				return 1, effect(c, ctx.RunID(), name)
			})
			if err != nil {
				return 0, err
			}
			sum += v
		}
		v, err := kagzi.Step(ctx, "block", func(c context.Context) (int, error) {
			if err := effect(c, ctx.RunID(), "block"); err != nil {
				return 0, err
			}
			if block {
				<-c.Done() // hang until killed
				return 0, c.Err()
			}
			return 10, nil
		})
		if err != nil {
			return 0, err
		}
		v2, err := kagzi.Step(ctx, "after", func(c context.Context) (int, error) {
			return 100, effect(c, ctx.RunID(), "after")
		})
		return sum + v + v2, err
	})
}

// freezeOnFire is a log handler that stops its process (SIGSTOP) when the scheduler
// logs a tick it fired: inside the scheduler's transaction, after the tick's run was
// inserted and before the commit, with the schedule's row locked.
type freezeOnFire struct{}

func (freezeOnFire) Enabled(context.Context, slog.Level) bool { return true }

func (freezeOnFire) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "kagzi: schedule fired" {
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		time.Sleep(100 * time.Millisecond) // the kernel stops every thread soon, not at once
	}
	return nil
}

func (h freezeOnFire) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h freezeOnFire) WithGroup(string) slog.Handler      { return h }

// runCrashWorker is the main of a worker subprocess.
func runCrashWorker() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv(crashWorkerEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	logger := quietLogger()
	if os.Getenv(crashSchedulerEnv) == "freeze" {
		logger = slog.New(freezeOnFire{})
	}
	client, err := kagzi.NewClient(pool, kagzi.Config{Logger: logger})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg := fastWorker()
	cfg.MaxConcurrent = 20
	cfg.DisableScheduler = os.Getenv(crashSchedulerEnv) == ""
	if n, err := strconv.Atoi(os.Getenv(crashMaxTakeoverEnv)); err == nil {
		cfg.MaxTakeovers = n
	}
	if n, err := strconv.Atoi(os.Getenv(crashSlotsEnv)); err == nil {
		cfg.MaxConcurrent = n
	}
	if os.Getenv(crashDefaultsEnv) == "1" {
		cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.PollInterval = 0, 0, 0
	}
	block := os.Getenv(crashBlockEnv) == "1"
	w, err := kagzi.NewWorker(client, cfg, crashyWorkflow(pool, block),
		chaoticWorkflow(pool), stallingWorkflow(pool), fanOutWorkflow(pool, block),
		freezingWorkflow(pool), poisonWorkflow(pool), steadyWorkflow, slowWorkflow, longWorkflow, timebombWorkflow,
		ledgeredWorkflow(pool, "limited"), ledgeredWorkflow(pool, "rated"), sagaCrashWorkflow(pool, block))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if n, err := strconv.Atoi(os.Getenv(crashStartEnv)); err == nil {
		go func() {
			time.Sleep(300 * time.Millisecond) // the worker claims, and takes eager starts
			for i := range n {
				if _, err := kagzi.Start(ctx, client, crashyWorkflow(pool, block), i); err != nil {
					fmt.Fprintln(os.Stderr, err)
				}
			}
		}()
	}
	if spec := os.Getenv(crashFlowStartEnv); spec != "" {
		go startLedgeredRuns(ctx, client, pool, spec)
	}
	if err := w.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// startLedgeredRuns starts N runs of the ledgered type "limited" (spec "N:prefix"),
// one at a time: four in five, the first among them, with one of four concurrency keys
// named after prefix;
// then it records its pid in the table starters_done.
func startLedgeredRuns(ctx context.Context, client *kagzi.Client, pool *pgxpool.Pool, spec string) {
	n, prefix, _ := strings.Cut(spec, ":")
	count, err := strconv.Atoi(n)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad", crashFlowStartEnv, spec)
		return
	}
	time.Sleep(300 * time.Millisecond) // the worker claims, and takes eager starts
	wf := ledgeredWorkflow(pool, "limited")
	for i := range count {
		in := flowInput{MS: 100 + i%4*10, Sleep: i%2 == 0}
		var opts []kagzi.StartOption
		if i%5 != 4 { // the first keyed: it knows the type's limits, a start of no key may not
			in.Key = fmt.Sprintf("%s-customer-%d", prefix, i%4)
			opts = append(opts, kagzi.WithConcurrencyKey(in.Key))
		}
		if _, err := kagzi.Start(ctx, client, wf, in, opts...); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO starters_done (pid) VALUES ($1)`, os.Getpid()); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
}

func startWorkerProcess(t *testing.T, dbURL string, block bool) *exec.Cmd {
	t.Helper()
	if block {
		return startWorkerProcessEnv(t, dbURL, crashBlockEnv+"=1")
	}
	return startWorkerProcessEnv(t, dbURL)
}

// startWorkerProcessEnv starts a worker process with extra environment variables.
func startWorkerProcessEnv(t *testing.T, dbURL string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), crashWorkerEnv+"="+dbURL), env...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

func TestKilledWorkerProcessRunsAreFinishedByAnotherWithoutRerunningCompletedSteps(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE effects (run_id text, step text, pid int)`); err != nil {
		t.Fatal(err)
	}
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

	first := startWorkerProcess(t, e.url, true)
	eventually(t, "every run to reach its hanging step in the first process", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM effects WHERE step = 'block'`) == runs
	})
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	for _, run := range started {
		if s := runStatus(t, e.client, run.RunID); s != kagzi.StatusRunning {
			t.Fatalf("run %s is %s right after the kill, want RUNNING (held by the dead process)", run.RunID, s)
		}
	}

	startWorkerProcess(t, e.url, false)
	for i, run := range started {
		out, err := run.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if out != i+112 {
			t.Fatalf("run %d output %d, want %d", i, out, i+112)
		}
	}
	// Steps recorded before the kill ran exactly once; the step the kill interrupted
	// ran twice (once per process); the step after it once.
	want := map[string]int{"one": runs, "two": runs, "block": 2 * runs, "after": runs}
	for step, n := range want {
		if got := countRows(t, e.pool, `SELECT count(*) FROM effects WHERE step = $1`, step); got != n {
			t.Errorf("step %q body ran %d times across %d runs, want %d", step, got, runs, n)
		}
	}
	if got := countRows(t, e.pool, `SELECT count(DISTINCT pid) FROM effects WHERE step = 'after'`); got != 1 {
		t.Errorf("the last steps ran in %d processes, want 1 (the second)", got)
	}
	if got := countRows(t, e.pool, `SELECT count(*) FROM kagzi.steps WHERE status = 'COMPLETED'`); got != 4*runs {
		t.Errorf("%d recorded steps, want %d: one per step key", got, 4*runs)
	}
}

func TestGracefulShutdownOfAWorkerProcessHandsItsRunsBackAtOnce(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE effects (run_id text, step text, pid int)`); err != nil {
		t.Fatal(err)
	}
	wf := crashyWorkflow(e.pool, false)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	proc := startWorkerProcess(t, e.url, true)
	eventually(t, "the run to reach its hanging step", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM effects WHERE step = 'block'`) == 1
	})
	// SIGTERM: the worker drains; the hanging step sees its context cancelled after
	// the drain timeout, and the run is handed back.
	if err := proc.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := proc.Wait(); err != nil {
		t.Fatalf("worker process exited with %v, want a clean exit after draining", err)
	}
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if info.Status != kagzi.StatusPending || info.LockedBy != "" || info.AvailableAt.After(time.Now().Add(time.Second)) {
		t.Fatalf("after a graceful stop the run is %+v, want PENDING, unlocked and claimable now", info)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.step_attempts WHERE step_key = 'block#1'`); n != 0 {
		t.Fatalf("the interrupted step has %d recorded attempts, want 0: a shutdown is not an attempt", n)
	}
	runWorker(t, e.client, fastWorker(), wf)
	if out, err := run.Wait(ctx); err != nil || out != 112 {
		t.Fatalf("got %d, %v", out, err)
	}
}

// fanOutWorkflow maps over 10 items; items 5..9 hang in processes started with
// crashBlockEnv, so a kill lands in the middle of the fan-out.
func fanOutWorkflow(pool *pgxpool.Pool, block bool) *kagzi.Workflow[int, []int] {
	return kagzi.Define("fan-out-crash", func(ctx *kagzi.Context, _ int) ([]int, error) {
		items := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
		return kagzi.Map(ctx, "item", items, func(ctx *kagzi.Context, i int) (int, error) {
			return kagzi.Step(ctx, "work", func(c context.Context) (int, error) {
				if _, err := pool.Exec(c, `INSERT INTO effects (run_id, step, pid) VALUES ($1, $2, $3)`,
					ctx.RunID(), fmt.Sprint(i), os.Getpid()); err != nil {
					return 0, err
				}
				if block && i >= 5 {
					<-c.Done()
					return 0, c.Err()
				}
				return i * 2, nil
			})
		})
	})
}

func TestCrashInTheMiddleOfAFanOutResumesOnlyTheUnfinishedItems(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE effects (run_id text, step text, pid int)`); err != nil {
		t.Fatal(err)
	}
	wf := fanOutWorkflow(e.pool, false)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	first := startWorkerProcess(t, e.url, true)
	eventually(t, "all 10 items to start and the first 5 to be recorded", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM effects`) == 10 &&
			countRows(t, e.pool, `SELECT count(*) FROM kagzi.steps WHERE status = 'COMPLETED'`) == 5
	})
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	startWorkerProcess(t, e.url, false)
	out, err := run.Wait(ctx)
	if err != nil || fmt.Sprint(out) != "[0 2 4 6 8 10 12 14 16 18]" {
		t.Fatalf("got %v, %v", out, err)
	}
	for i := range 10 {
		want := 1
		if i >= 5 {
			want = 2 // interrupted by the kill, run again
		}
		if n := countRows(t, e.pool, `SELECT count(*) FROM effects WHERE step = $1`, fmt.Sprint(i)); n != want {
			t.Errorf("item %d ran %d times, want %d", i, n, want)
		}
	}
}

// Found from outside: only a live worker's heartbeat marked a silent one OFFLINE, so
// when the last worker of a namespace was killed it stayed ONLINE for ever, its types
// were never reported without a worker, and RequireWorker let starts through.
func TestTheLastWorkerKilledIsOfflineAndItsReadyRunsHaveNoWorkerWithNoWorkerLeftToMarkIt(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE effects (run_id text, step text, pid int)`); err != nil {
		t.Fatal(err)
	}
	run, err := kagzi.Start(ctx, e.client, crashyWorkflow(e.pool, true), 1)
	if err != nil {
		t.Fatal(err)
	}
	worker := startWorkerProcess(t, e.url, true)
	eventually(t, "the run to reach its hanging step in the worker process", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM effects WHERE step = 'block'`) == 1
	})
	if h := e.client.Health(ctx); len(h.PendingTypesWithoutWorker) != 0 {
		t.Fatalf("types without a worker %v while the worker lives", h.PendingTypesWithoutWorker)
	}
	if err := worker.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = worker.Wait()

	eventually(t, "the killed worker to read OFFLINE", func() bool {
		ws, err := e.client.ListWorkers(ctx, kagzi.WorkerFilter{})
		return err == nil && len(ws.Workers) == 1 && ws.Workers[0].Status == kagzi.WorkerOffline
	})
	online, err := e.client.ListWorkers(ctx, kagzi.WorkerFilter{Statuses: []kagzi.WorkerStatus{kagzi.WorkerOnline}})
	if err != nil || len(online.Workers) != 0 {
		t.Fatalf("listing ONLINE workers: %v, %d", err, len(online.Workers))
	}
	eventually(t, "health to report the run's type without a worker once its lease passed", func() bool {
		h := e.client.Health(ctx)
		return fmt.Sprint(h.PendingTypesWithoutWorker) == "[crashy]"
	})
	if _, err := e.client.StartByName(ctx, "crashy", 2, kagzi.RequireWorker()); !errors.Is(err, kagzi.ErrNoWorker) {
		t.Fatalf("a start requiring a worker of a type whose only worker was killed: %v, want ErrNoWorker", err)
	}
	if s := runStatus(t, e.client, run.RunID); s != kagzi.StatusRunning {
		t.Fatalf("run %s, want RUNNING (held by the dead process, its lease passed)", s)
	}
}
