package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/store"
)

// A claim commits without waiting for its WAL to reach disk. In a crash of PostgreSQL
// right after it, the claim is lost: the run is PENDING again with the epoch it had,
// and the next claim takes it with the epoch the lost claim had. The lost claim's
// execution (its worker knows nothing of the crash until it writes) must record
// nothing under the new claim: the claim's token tells the two apart. The cluster's
// WAL writer waits 10 s between rounds (and no other commit flushes the WAL), so the
// claim is lost unless the writer happened to run in the few milliseconds before the
// crash; the test tries again in that case.
func TestAClaimLostInADatabaseCrashIsClaimedAgainAndItsExecutionWritesNothingUnderTheNewClaim(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := newCrashCluster(t, ctx)
	claimer := c.claimer(false)
	for attempt := 1; ; attempt++ {
		run := c.newRun()
		lost := c.claim(claimer, run)
		if lost.Epoch != 1 || lost.Token == uuid.Nil {
			t.Fatalf("first claim's fence %+v, want epoch 1 and a token", lost)
		}
		pool := c.crash()

		var status string
		var epoch int64
		if err := pool.QueryRow(ctx, `SELECT status, lease_epoch FROM kagzi.runs WHERE run_id = $1`, run).Scan(&status,
			&epoch); err != nil {
			t.Fatal(err)
		}
		if status == "RUNNING" {
			// The WAL writer ran before the crash: the claim survived. Finish the run
			// (its fence holds) and lose the next one.
			if _, err := store.FinishRun(ctx, store.Direct(pool), store.FinishWrite{Fence: lost, Status: "COMPLETED",
				Output: []byte(`1`)}); err != nil {
				t.Fatalf("end under a claim that survived the crash: %v", err)
			}
			if attempt == 5 {
				t.Fatal("five claims survived a crash right after them: the test cannot lose one")
			}
			t.Logf("attempt %d: the claim reached disk before the crash; again", attempt)
			continue
		}
		if status != "PENDING" || epoch != 0 {
			t.Fatalf("after the crash the run is %s with epoch %d, want PENDING with epoch 0 (the claim lost)", status, epoch)
		}

		again := c.claim(claimer, run)
		if again.Epoch != lost.Epoch || again.Token == lost.Token {
			t.Fatalf("the claim after the crash has fence %+v, the lost one had %+v: want the same epoch, another token",
				again, lost)
		}
		// The lost claim's execution writes: each fenced write is refused.
		step := store.StepWrite{Fence: lost, Key: "s#1", Name: "s", Status: "COMPLETED", StepStatus: "COMPLETED",
			Output: []byte(`"zombie"`), StartedAt: time.Now(), FinishedAt: time.Now()}
		if _, err := store.RecordStep(ctx, store.Direct(pool), step); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("step recorded under the lost claim: %v, want ErrLeaseLost", err)
		}
		if _, err := store.RenewLease(ctx, pool, lost, time.Minute); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("lease renewed under the lost claim: %v, want ErrLeaseLost", err)
		}
		beat, err := store.Heartbeat(ctx, pool, store.WorkerBeat{Namespace: "default", WorkerID: "w"}, []store.Fence{lost},
			time.Minute)
		if err != nil || len(beat) != 0 {
			t.Fatalf("heartbeat under the lost claim: %+v, %v; want no run held", beat, err)
		}
		if err := store.ReleaseRuns(ctx, pool, []store.Fence{lost}); err != nil {
			t.Fatal(err)
		}
		if _, err := store.FinishRun(ctx, store.Direct(pool), store.FinishWrite{Fence: lost, Status: "COMPLETED",
			Output: []byte(`"zombie"`)}); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("end under the lost claim: %v, want ErrLeaseLost", err)
		}
		if n := countRows(t, pool, `SELECT count(*) FROM kagzi.steps WHERE run_id = '`+run.String()+`'`); n != 0 {
			t.Fatalf("%d steps recorded under the lost claim", n)
		}
		// The new claim's execution ends the run.
		final, err := store.FinishRun(ctx, store.Direct(pool), store.FinishWrite{Fence: again, Status: "COMPLETED",
			Output: []byte(`"done"`)})
		if err != nil || final != "COMPLETED" {
			t.Fatalf("end under the new claim: %q, %v", final, err)
		}
		var output string
		if err := pool.QueryRow(ctx, `SELECT output::text FROM kagzi.runs WHERE run_id = $1`, run).Scan(&output); err != nil {
			t.Fatal(err)
		}
		if output != `"done"` {
			t.Fatalf("the run's output is %s, want the new claim's \"done\"", output)
		}
		return
	}
}

// crashCluster is a throwaway cluster, migrated, whose WAL writer waits 10 s between
// rounds (and no autovacuum or background writer flushes the WAL meanwhile): a claim
// that does not wait for its flush is lost in a crash right after it, unless the
// writer happened to run in between.
type crashCluster struct {
	t    *testing.T
	ctx  context.Context
	pg   *cluster
	pool *pgxpool.Pool
}

func newCrashCluster(t *testing.T, ctx context.Context) *crashCluster {
	c := &crashCluster{t: t, ctx: ctx, pg: newCluster(t, "wal_writer_delay=10s", "autovacuum=off", "bgwriter_lru_maxpages=0")}
	c.connect()
	t.Cleanup(func() { c.pool.Close() })
	if err := kagzi.Migrate(ctx, c.pool); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *crashCluster) connect() {
	pool, err := pgxpool.New(c.ctx, c.pg.URL)
	if err != nil {
		c.t.Fatal(err)
	}
	c.pool = pool
}

// crash crashes the cluster, starts it again and returns a new pool.
func (c *crashCluster) crash() *pgxpool.Pool {
	c.pool.Close()
	c.pg.Crash()
	c.pg.Start()
	c.connect()
	return c.pool
}

// claimer claims runs of the type "wf", durably or not.
func (c *crashCluster) claimer(durable bool) store.Claimer {
	return store.Claimer{Namespace: "default", Types: []string{"wf"}, Versions: []string{"v1"}, WorkerID: "w",
		Lease: time.Minute, Cursors: map[string]string{}, Durable: durable}
}

// newRun starts a run of "wf" and returns its id.
func (c *crashCluster) newRun() uuid.UUID {
	run := uuid.New()
	if err := store.InsertRuns(c.ctx, c.pool, "default", "wf", nil, []uuid.UUID{run}, [][]byte{[]byte(`1`)},
		[][]byte{nil}, time.Time{}, nil); err != nil {
		c.t.Fatal(err)
	}
	return run
}

// claim claims the run for claimer and returns its fence.
func (c *crashCluster) claim(claimer store.Claimer, run uuid.UUID) store.Fence {
	c.t.Helper()
	claimed, _, err := store.ClaimRuns(c.ctx, c.pool, claimer, 10)
	if err != nil {
		c.t.Fatal(err)
	}
	if len(claimed) != 1 || claimed[0].RunID != run {
		c.t.Fatalf("claimed %d runs, want the run %s", len(claimed), run)
	}
	return claimed[0].Fence
}

// A durable claim (WorkerConfig.DurableClaims) waits for its flush: a crash right after
// it, in the same cluster settings that lose a default claim, leaves it in place.
func TestADurableClaimSurvivesADatabaseCrashRightAfterIt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := newCrashCluster(t, ctx)
	claimer := c.claimer(true)
	for range 3 {
		run := c.newRun()
		f := c.claim(claimer, run)
		pool := c.crash()
		var status string
		var epoch int64
		var token uuid.UUID
		if err := pool.QueryRow(ctx, `SELECT status, lease_epoch, lease_token FROM kagzi.runs WHERE run_id = $1`,
			run).Scan(&status, &epoch, &token); err != nil {
			t.Fatal(err)
		}
		if status != "RUNNING" || epoch != f.Epoch || token != f.Token {
			t.Fatalf("after the crash the run is %s, epoch %d, token %s; want the durable claim's RUNNING, %d, %s",
				status, epoch, token, f.Epoch, f.Token)
		}
		if _, err := store.FinishRun(ctx, store.Direct(pool), store.FinishWrite{Fence: f, Status: "COMPLETED",
			Output: []byte(`1`)}); err != nil {
			t.Fatalf("end under the durable claim after the crash: %v", err)
		}
	}
}

// Runs in flight when PostgreSQL crashes (claims lost with it among them, their
// executions going on in the worker) all complete once the server is back, each
// step recorded once, with the output of the execution whose end was recorded: the
// worker and its client stay up through the crash.
func TestRunsInFlightWhenPostgreSQLCrashesAllCompleteOnceTheServerIsBack(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := newCrashCluster(t, ctx)
	pool, err := pgxpool.New(ctx, c.pg.URL) // the client's own pool, kept through the crash
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	client := newClient(t, pool, "")
	defer client.Close()
	var mu sync.Mutex
	bodies := map[string]int{} // step bodies begun, by run input and step
	wf := kagzi.Define("through-crash", func(ctx *kagzi.Context, n int) (int, error) {
		sum := 0
		for _, step := range []string{"a", "b"} {
			v, err := kagzi.Step(ctx, step, func(context.Context) (int, error) {
				mu.Lock()
				bodies[fmt.Sprint(n, step)]++
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
				return n, nil
			})
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	})
	w, err := kagzi.NewWorker(client, kagzi.WorkerConfig{MaxConcurrent: 20, LeaseDuration: 2 * time.Second,
		PollInterval: 200 * time.Millisecond}, wf)
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() {
		stop()
		<-done
	}()
	const n = 300
	in := make([]int, n)
	for i := range in {
		in[i] = i + 1
	}
	if _, err := kagzi.StartMany(ctx, client, wf, in); err != nil {
		t.Fatal(err)
	}
	// Crash while runs are in flight.
	for countRows(t, c.pool, `SELECT count(*) FROM kagzi.runs WHERE status = 'COMPLETED'`) < n/3 {
		time.Sleep(5 * time.Millisecond)
	}
	c.crash()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		left := countRows(t, c.pool, `SELECT count(*) FROM kagzi.runs WHERE status <> 'COMPLETED'`)
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			var detail string
			_ = c.pool.QueryRow(ctx, `SELECT string_agg(format('%s %s takeovers=%s epoch=%s error=%s', run_id, status,
				takeovers, lease_epoch, coalesce(error::text, '-')), '; ') FROM kagzi.runs WHERE status <> 'COMPLETED'`).Scan(&detail)
			t.Fatalf("%d runs not completed two minutes after the crash: %s", left, detail)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := countRows(t, c.pool, `SELECT count(*) FROM kagzi.runs r
		WHERE r.status = 'COMPLETED' AND r.output = to_jsonb(2 * (r.input::text::int))`); got != n {
		t.Fatalf("%d runs completed with the sum of their steps, want %d", got, n)
	}
	if got := countRows(t, c.pool, `SELECT count(*) FROM kagzi.steps WHERE status = 'COMPLETED'`); got != 2*n {
		t.Fatalf("%d step records, want %d (one per step)", got, 2*n)
	}
	mu.Lock()
	again := 0
	for _, k := range bodies {
		if k > 1 {
			again++
		}
	}
	begun := len(bodies)
	mu.Unlock()
	if begun != 2*n {
		t.Fatalf("%d steps begun, want %d", begun, 2*n)
	}
	t.Logf("%d of %d steps ran more than once (the runs in flight at the crash)", again, 2*n)
}
