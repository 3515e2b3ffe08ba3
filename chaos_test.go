package kagzi_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/testdb"
)

// The chaos suite runs worker processes (this test binary, see crash_test.go),
// kills them with SIGKILL, stalls them with SIGSTOP, terminates their database
// connections, and then checks what the database holds. Sizes fit CI; set
// KAGZI_CHAOS_RUNS and KAGZI_CHAOS_KILLS for a longer run. Figures are printed with -v.

// chaosSetup creates the effects table, where every step body records each of its
// executions (started: the moment the body began, by the worker's clock); a trigger
// that records when each step's output was recorded (step_recorded, at the record's
// statement); and a trigger that logs every change of a run's lease, status or
// available_at, so that lease overlaps can be checked afterwards.
const chaosSetup = `
CREATE TABLE effects (run_id text, step text, pid int, started timestamptz DEFAULT clock_timestamp(),
	finished timestamptz);
CREATE TABLE step_recorded (run_id uuid, step_key text, at timestamptz);
CREATE FUNCTION log_step() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO step_recorded VALUES (NEW.run_id, NEW.step_key, clock_timestamp());
	RETURN NEW;
END $$;
CREATE TRIGGER log_step AFTER INSERT OR UPDATE ON kagzi.steps FOR EACH ROW
	WHEN (NEW.status = 'COMPLETED' AND NEW.kind = 'STEP') EXECUTE FUNCTION log_step();
CREATE TABLE lease_log (run_id uuid, epoch bigint, locked_by text, status text, available_at timestamptz,
	tx_now timestamptz, at timestamptz);
CREATE FUNCTION log_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.lease_epoch IS DISTINCT FROM OLD.lease_epoch OR NEW.status IS DISTINCT FROM OLD.status
		OR NEW.available_at IS DISTINCT FROM OLD.available_at THEN
		INSERT INTO lease_log VALUES (NEW.run_id, NEW.lease_epoch, NEW.locked_by, NEW.status,
			NEW.available_at, now(), clock_timestamp());
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER log_lease AFTER UPDATE ON kagzi.runs FOR EACH ROW EXECUTE FUNCTION log_lease();`

const chaosSteps = 4 // steps per chaotic run

// chaoticWorkflow: two steps, a sleep long enough to release the run, two more steps.
// Each step body records its execution (start and finish) in effects.
func chaoticWorkflow(pool *pgxpool.Pool) *kagzi.Workflow[int, int] {
	step := func(ctx *kagzi.Context, name string, work time.Duration) (int, error) {
		return kagzi.Step(ctx, name, func(c context.Context) (int, error) {
			began := time.Now()
			var id int64
			if err := pool.QueryRow(c, `INSERT INTO effects (run_id, step, pid, started) VALUES ($1, $2, $3, $4) RETURNING 1`,
				ctx.RunID(), name, os.Getpid(), began).Scan(&id); err != nil {
				return 0, err
			}
			time.Sleep(work)
			_, err := pool.Exec(c, `UPDATE effects SET finished = clock_timestamp()
				WHERE run_id = $1 AND step = $2 AND pid = $3 AND finished IS NULL`, ctx.RunID(), name, os.Getpid())
			return 1, err
		})
	}
	return kagzi.Define("chaotic", func(ctx *kagzi.Context, n int) (int, error) {
		sum := 0
		for i, name := range []string{"a", "b", "c", "d"} {
			if i == 2 {
				if err := ctx.Sleep("nap", time.Duration(300+n%500)*time.Millisecond); err != nil {
					return 0, err
				}
			}
			v, err := step(ctx, name, time.Duration(n%7)*time.Millisecond)
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	}, kagzi.WithWorkflowRetry(kagzi.Forever().Initial(10*time.Millisecond).Max(100*time.Millisecond)))
}

type chaosProcs struct {
	t      *testing.T
	url    string
	procs  []*exec.Cmd
	killed map[int]time.Time // pid → when it was killed
}

func (c *chaosProcs) start() {
	cmd := startWorkerProcess(c.t, c.url, false)
	c.procs = append(c.procs, cmd)
}

func (c *chaosProcs) killRandom() {
	i := rand.IntN(len(c.procs))
	p := c.procs[i]
	c.killed[p.Process.Pid] = time.Now()
	_ = p.Process.Signal(syscall.SIGKILL)
	_ = p.Wait()
	c.procs = slices.Delete(c.procs, i, i+1)
}

// chaosCheck verifies what the database holds after a chaos run and prints figures.
func chaosCheck(t *testing.T, pool *pgxpool.Pool, runs int, killed map[int]time.Time, extra string) {
	t.Helper()
	ctx := context.Background()
	if n := countRows(t, pool, `SELECT count(*) FROM kagzi.runs WHERE status = 'COMPLETED' AND output = $1::jsonb`,
		strconv.Itoa(chaosSteps)); n != runs {
		t.Errorf("%d of %d runs COMPLETED with the right output", n, runs)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM kagzi.steps WHERE kind = 'STEP' AND status = 'COMPLETED'`); n != runs*chaosSteps {
		t.Errorf("%d recorded step outputs, want exactly one per step key: %d", n, runs*chaosSteps)
	}
	// Guarantee 2: once a step's output is recorded, its body never begins again. A
	// body may run more than once before that (its process was killed, or lost its
	// lease, before the record): that is allowed, and counted below as re-executions.
	duplicates := countRows(t, pool, `
		SELECT count(*) FROM effects e JOIN step_recorded r ON r.run_id::text = e.run_id AND r.step_key = e.step || '#1'
		WHERE e.started > r.at`)
	if duplicates != 0 {
		t.Errorf("%d step bodies began after their step's output was recorded", duplicates)
	}
	reruns := countRows(t, pool, `SELECT count(*) - count(DISTINCT (run_id, step)) FROM effects`)
	failedAttempts := countRows(t, pool, `SELECT count(*) FROM kagzi.step_attempts WHERE status <> 'COMPLETED'`)
	// No run was held under two live leases: every claim of a new epoch (a row whose
	// own lease is in the future) came after the previous epoch's lease had expired, or
	// after it was given up. (A reap of a dead worker's runs moves their epoch too, and
	// ends the lease there and then: available_at = now().)
	overlaps := countRows(t, pool, `
		WITH l AS (
			SELECT *, lag(epoch) OVER w AS prev_epoch, lag(status) OVER w AS prev_status,
				lag(available_at) OVER w AS prev_available
			FROM lease_log WINDOW w AS (PARTITION BY run_id ORDER BY at)
		)
		SELECT count(*) FROM l
		WHERE epoch <> prev_epoch AND status = 'RUNNING' AND available_at > tx_now
		  AND prev_status = 'RUNNING' AND prev_available > tx_now`)
	if overlaps != 0 {
		t.Errorf("%d claims took a run whose previous lease was still live", overlaps)
	}
	// Recovery: from each kill to the next claim of a run the killed process held.
	var recoveries []time.Duration
	for pid, at := range killed {
		rows, err := pool.Query(ctx, `
			SELECT min(l2.tx_now) FROM lease_log l1
			JOIN lease_log l2 ON l2.run_id = l1.run_id AND l2.epoch > l1.epoch AND l2.status = 'RUNNING'
				AND l2.available_at > l2.tx_now -- a claim, not the reap that freed the run
			WHERE split_part(l1.locked_by, '/', 2) = $1 AND l1.status = 'RUNNING' AND l2.tx_now > $2
			GROUP BY l1.run_id`, strconv.Itoa(pid), at)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var claimed time.Time
			if err := rows.Scan(&claimed); err != nil {
				t.Fatal(err)
			}
			recoveries = append(recoveries, claimed.Sub(at))
		}
		rows.Close()
	}
	slices.Sort(recoveries)
	p50, worst := time.Duration(0), time.Duration(0)
	if len(recoveries) > 0 {
		p50, worst = recoveries[len(recoveries)/2], recoveries[len(recoveries)-1]
	}
	t.Logf("chaos: runs=%d kills=%d %s step re-executions before a record=%d (failed attempts retried=%d) "+
		"bodies begun after their record=%d "+
		"lease overlaps=%d recovered runs=%d recovery after kill p50=%v max=%v (lease 1s)",
		runs, len(killed), extra, reruns, failedAttempts, duplicates, overlaps, len(recoveries),
		p50.Round(time.Millisecond), worst.Round(time.Millisecond))
}

func waitAllCompleted(t *testing.T, pool *pgxpool.Pool, runs int, during func()) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	completed := func() int {
		var n int
		// This pool's connections may be terminated too: a failed count is "not yet".
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM kagzi.runs WHERE status = 'COMPLETED'`).Scan(&n); err != nil {
			return -1
		}
		return n
	}
	for completed() < runs {
		if time.Now().After(deadline) {
			t.Fatalf("runs did not complete in 5 minutes: %d of %d", completed(), runs)
		}
		if during != nil {
			during()
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func startChaoticRuns(t *testing.T, c *kagzi.Client, pool *pgxpool.Pool, runs int) {
	t.Helper()
	wf := chaoticWorkflow(pool)
	for i := range runs {
		if _, err := kagzi.Start(context.Background(), c, wf, i, kagzi.WithID(fmt.Sprint("chaos-", i))); err != nil {
			t.Error(err)
			return
		}
	}
}

func TestChaosKilledWorkerProcessesLoseNothingAndRunNoCompletedStepAgain(t *testing.T) {
	e := newEnv(t)
	if _, err := e.pool.Exec(context.Background(), chaosSetup); err != nil {
		t.Fatal(err)
	}
	runs := envInt("KAGZI_CHAOS_RUNS", 1000)
	kills := envInt("KAGZI_CHAOS_KILLS", 6)
	procs := &chaosProcs{t: t, url: e.url, killed: map[int]time.Time{}}
	for range 3 {
		procs.start()
	}
	// The runs are started while the kills begin, and the kills are spread over the
	// whole burn-down: kill k comes once (k-1)/kills of the runs completed, and at
	// least 200-500 ms after the one before.
	started := make(chan struct{})
	go func() {
		defer close(started)
		startChaoticRuns(t, e.client, e.pool, runs)
	}()
	next := time.Now().Add(200 * time.Millisecond)
	waitAllCompleted(t, e.pool, runs, func() {
		done := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE status = 'COMPLETED'`)
		if k := len(procs.killed); k < kills && time.Now().After(next) && done >= k*runs/kills {
			procs.killRandom()
			procs.start()
			next = time.Now().Add(time.Duration(200+rand.IntN(300)) * time.Millisecond)
		}
	})
	<-started
	if len(procs.killed) < kills {
		t.Errorf("%d of %d kills were made before every run completed", len(procs.killed), kills)
	}
	chaosCheck(t, e.pool, runs, procs.killed, "")
}

func TestChaosRunsCompleteWhenTheDatabaseDropsEveryConnection(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, chaosSetup); err != nil {
		t.Fatal(err)
	}
	runs := envInt("KAGZI_CHAOS_RUNS", 1000) / 2
	procs := &chaosProcs{t: t, url: e.url, killed: map[int]time.Time{}}
	for range 3 {
		procs.start()
	}
	admin, err := pgxpool.New(ctx, testdb.WithDatabase(testdb.ServerURL(), "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var dbName string
	if err := e.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&dbName); err != nil {
		t.Fatal(err)
	}
	startChaoticRuns(t, e.client, e.pool, runs)
	if t.Failed() {
		return
	}
	terminated, rounds := 0, 0
	next := time.Now().Add(300 * time.Millisecond)
	waitAllCompleted(t, e.pool, runs, func() {
		if rounds < 5 && time.Now().After(next) {
			var n int
			if err := admin.QueryRow(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid)
				FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()) t`, dbName).Scan(&n); err != nil {
				t.Fatal(err)
			}
			terminated += n
			rounds++
			next = time.Now().Add(400 * time.Millisecond)
		}
	})
	if terminated == 0 {
		t.Fatal("no connection was terminated: the test tested nothing")
	}
	e.pool.Reset() // drop the connections the terminations broke
	chaosCheck(t, e.pool, runs, procs.killed, fmt.Sprintf("terminated connections=%d in %d rounds", terminated, rounds))
}

// stallingWorkflow's step sleeps (ignoring its context, like a process that froze)
// and returns the pid of the process that ran it.
func stallingWorkflow(pool *pgxpool.Pool) *kagzi.Workflow[int, int] {
	return kagzi.Define("stalling", func(ctx *kagzi.Context, _ int) (int, error) {
		return kagzi.Step(ctx, "slow", func(c context.Context) (int, error) {
			if _, err := pool.Exec(c, `INSERT INTO effects (run_id, step, pid) VALUES ($1, 'slow', $2)`,
				ctx.RunID(), os.Getpid()); err != nil {
				return 0, err
			}
			time.Sleep(1500 * time.Millisecond)
			return os.Getpid(), nil
		})
	})
}

func TestChaosStalledWorkerProcessIsTakenOverAndItsLateWritesAreRejected(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	if _, err := e.pool.Exec(ctx, chaosSetup); err != nil {
		t.Fatal(err)
	}
	wf := stallingWorkflow(e.pool)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	stalled := startWorkerProcess(t, e.url, false)
	eventually(t, "the first process to start the step", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM effects`) == 1
	})
	if err := stalled.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	healthy := startWorkerProcess(t, e.url, false)
	out, err := run.Wait(ctx) // the healthy process takes over after the lease (1s) passes
	if err != nil {
		t.Fatal(err)
	}
	if out != healthy.Process.Pid {
		t.Fatalf("output from pid %d, want the new owner %d", out, healthy.Process.Pid)
	}
	if err := stalled.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond) // the stalled step finishes and tries to record
	var recorded string
	var attempts int
	if err := e.pool.QueryRow(ctx, `SELECT output::text, attempts FROM kagzi.steps WHERE step_key = 'slow#1'`).Scan(&recorded, &attempts); err != nil {
		t.Fatal(err)
	}
	// One attempt, recorded by the new owner (a first attempt that completes keeps
	// its history in the step's row: no step_attempts row).
	if recorded != strconv.Itoa(healthy.Process.Pid) || attempts != 1 ||
		countRows(t, e.pool, `SELECT count(*) FROM kagzi.step_attempts`) != 0 {
		t.Fatalf("recorded output %s after %d attempts: the stalled worker's late write got in", recorded, attempts)
	}
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil || info.Status != kagzi.StatusCompleted || strings.TrimSpace(string(info.Output)) != strconv.Itoa(healthy.Process.Pid) {
		t.Fatalf("run %+v, %v", info, err)
	}
	if n := countRows(t, e.pool, `SELECT count(DISTINCT pid) FROM effects`); n != 2 {
		t.Fatalf("the step body ran in %d processes, want 2 (the stalled one and the new owner)", n)
	}
}

// A scheduler claims due schedules by locking their rows for its transaction, and the
// other processes' schedulers pass locked rows over. A process stopped (SIGSTOP)
// inside that transaction keeps its connection, its transaction and the locks: the
// schedule would not fire anywhere for as long as the stop lasts. The transaction
// sets PostgreSQL's idle_in_transaction_session_timeout to the lease, so the stopped
// process's session is ended and another process fires the schedule.
func TestChaosAScheduleFiresWhileTheProcessThatClaimedItIsStoppedInItsTransaction(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	info, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: "every-second", WorkflowType: steadyWorkflow.Name(),
		Cron: "* * * * * *", Seconds: true, Input: 1, MaxCatchup: 10})
	if err != nil {
		t.Fatal(err)
	}
	stopped := startWorkerProcessEnv(t, e.url, crashSchedulerEnv+"=freeze")
	eventually(t, "the scheduler's process to stop itself while it fires", func() bool {
		return processState(t, stopped.Process.Pid) == "T"
	})
	// Stopped after inserting the tick's run, before its commit: nothing is fired yet,
	// and its session sits idle in its transaction (until PostgreSQL ends it).
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE schedule_id = $1`, info.ID); n != 0 {
		t.Fatalf("%d runs of the schedule visible while its firing is uncommitted", n)
	}
	startWorkerProcessEnv(t, e.url, crashSchedulerEnv+"=1")
	eventually(t, "another process to fire the schedule and run its ticks", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE schedule_id = $1 AND status = 'COMPLETED'`,
			info.ID) >= 2
	})
	if state := processState(t, stopped.Process.Pid); state != "T" {
		t.Fatalf("the first process is %q, want still stopped (T)", state)
	}
	// The stopped process's session was ended by PostgreSQL, not left idle in its
	// transaction.
	if n := countRows(t, e.pool, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND state LIKE 'idle in transaction%'`); n != 0 {
		t.Fatalf("%d sessions still idle in a transaction", n)
	}
}
