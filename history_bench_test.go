package kagzi_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/store"
)

// BenchmarkArchivedHistoryScale is BenchmarkHistoryScale with the finished runs in
// the history (partitioned by day, as the archiver leaves them) instead of the live
// tables, plus a read of one archived run. KAGZI_BENCH_HISTORY sets how many.
func BenchmarkArchivedHistoryScale(b *testing.B) {
	for _, finished := range []int{0, envInt("KAGZI_BENCH_HISTORY", 1_000_000)} {
		b.Run(fmt.Sprintf("archived=%d", finished), func(b *testing.B) {
			c, pool, _ := benchEnv(b)
			ctx := context.Background()
			fillArchived(b, pool, finished)
			b.Run("start", func(b *testing.B) { benchStarts(b, c) })
			b.Run("start-IDReuseNever", func(b *testing.B) {
				for i := range b.N {
					if _, err := kagzi.Start(ctx, c, threeSteps, 1, kagzi.WithID(fmt.Sprint("never-", i)),
						kagzi.WithIDReuse(kagzi.IDReuseNever)); err != nil {
						b.Fatal(err)
					}
				}
			})
			// A child's start: IDReuseNever with a derived id, whose runs cannot predate
			// the parent (store.NewRun.IDNotBefore): only recent partitions are read.
			b.Run("start-child-id", func(b *testing.B) {
				parent := time.Now().Add(-time.Hour)
				for i := range b.N {
					if _, _, err := store.InsertRun(ctx, pool, store.NewRun{RunID: uuid.Must(uuid.NewV7()), Namespace: "default",
						WorkflowID: fmt.Sprint("parent/child-", i), WorkflowType: "three-steps", Input: []byte(`1`),
						ReuseNever: true, IDNotBefore: &parent}); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("claim", func(b *testing.B) { benchClaims(b, c, pool) })
			for _, f := range []kagzi.RunFilter{{}, {WorkflowType: "three-steps"}, {WorkflowType: "old-1"}} {
				if finished == 0 && f.WorkflowType == "old-1" {
					continue
				}
				b.Run("list-newest-page-"+map[bool]string{true: f.WorkflowType, false: "all"}[f.WorkflowType != ""], func(b *testing.B) {
					for range b.N {
						if p, err := c.ListRuns(ctx, f); err != nil || len(p.Runs) == 0 {
							b.Fatalf("%v, %v", p, err)
						}
					}
				})
			}
			if finished == 0 {
				return
			}
			var old string
			if err := pool.QueryRow(ctx, `SELECT run_id::text FROM kagzi.runs_history ORDER BY finished_at LIMIT 1 OFFSET $1`,
				finished/2).Scan(&old); err != nil {
				b.Fatal(err)
			}
			b.Run("get-archived-run", func(b *testing.B) {
				for range b.N {
					if _, err := c.GetRun(ctx, old); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// fillArchived puts n finished runs (COMPLETED, finished over the last 30 days, of
// five types; every other one started with IDReuseNever, its workflow id in
// kagzi.history_ids as the archiver records it) into the history, each with its listing
// row and one recorded step, a million at a time, and analyzes the tables.
func fillArchived(b *testing.B, pool *pgxpool.Pool, n int) {
	b.Helper()
	if n == 0 {
		return // an empty database: no partitions either
	}
	ctx := context.Background()
	if err := store.EnsureHistoryPartitions(ctx, pool, time.Now().Add(-31*24*time.Hour), time.Now().Add(24*time.Hour)); err != nil {
		b.Fatal(err)
	}
	for from := 0; from < n; from += 1_000_000 {
		to := min(from+1_000_000, n)
		if _, err := pool.Exec(ctx, `
			WITH ins AS (
				INSERT INTO kagzi.runs_history (run_id, namespace, workflow_id, workflow_type, status, input, output,
					available_at, created_at, started_at, finished_at, version, id_reuse_never)
				SELECT gen_random_uuid(), 'default', 'old-' || g, 'old-' || (g % 5), 'COMPLETED', '1', '2',
					t, t, t, t + interval '3 ms', '', g % 2 = 0
				FROM generate_series($1::bigint, $2::bigint) g,
					LATERAL (SELECT now() - interval '30 days' + (g::float8 / $3) * interval '30 days' - interval '1 hour' AS t) at
				RETURNING run_id, namespace, workflow_id, workflow_type, created_at, finished_at, id_reuse_never
			), ids AS (
				INSERT INTO kagzi.history_ids (namespace, workflow_id, created_at, run_id, run_finished_at)
				SELECT namespace, workflow_id, created_at, run_id, finished_at FROM ins WHERE id_reuse_never
			), listed AS (
				INSERT INTO kagzi.runs_created_history (namespace, created_at, run_id, workflow_type, run_finished_at)
				SELECT namespace, created_at, run_id, workflow_type, finished_at FROM ins
			)
			INSERT INTO kagzi.steps_history (run_id, step_key, name, kind, status, output, attempts, position, run_finished_at)
			SELECT run_id, 'a', 'a', 'STEP', 'COMPLETED', '2', 1, 0, finished_at FROM ins`, from+1, to, n); err != nil {
			b.Fatal(err)
		}
	}
	// A checkpoint flushes what the fill wrote, so that the measurements do not share
	// the disk with it.
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE kagzi.runs_history, kagzi.runs_created_history, kagzi.steps_history, kagzi.history_ids`); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
		b.Fatal(err)
	}
}

var retentionLoad = kagzi.Define("retention-load", func(ctx *kagzi.Context, n int) (int, error) {
	return kagzi.Step(ctx, "one", func(context.Context) (int, error) { return n + 1, nil })
})

// BenchmarkRetentionUnderLoad measures what retention does to live runs: one-step
// runs are started at a steady rate (KAGZI_BENCH_RETENTION_RATE a second, default
// 200) and their start -> result latency is recorded while (1) nothing else happens,
// (2) the history partitions of the oldest full day are dropped (DropHistoryBefore,
// the retention of the history), and (3) finished runs in the live tables are deleted
// row by row for 30 seconds (PruneFinished, batches of 500: the retention before the
// history, and still that of runs not archived). The history holds
// KAGZI_BENCH_HISTORY runs over 30 days (default 3,000,000: 100,000 a day); the live
// tables another 100,000 finished runs of the last 30 days (3,333 a day).
func BenchmarkRetentionUnderLoad(b *testing.B) {
	n := envInt("KAGZI_BENCH_HISTORY", 3_000_000)
	rate := envInt("KAGZI_BENCH_RETENTION_RATE", 200)
	c, pool, _ := benchEnv(b)
	ctx := context.Background()
	fillArchived(b, pool, n)
	fillHistory(b, pool, 100_000)
	_, stop := startWorker(b, c, kagzi.WorkerConfig{MaxConcurrent: 100, PruneInterval: time.Hour}, retentionLoad)
	defer stop()

	// measure starts runs at the rate while during runs (and at least for d), and
	// returns the latencies of the runs started meanwhile.
	measure := func(d time.Duration, during func()) []time.Duration {
		var mu sync.Mutex
		var lat []time.Duration
		var wg sync.WaitGroup
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		finished := make(chan struct{})
		go func() {
			during()
			close(finished)
		}()
		deadline := time.After(d)
		minDone := false
		for {
			select {
			case <-deadline:
				minDone = true
			case <-finished:
				finished = nil
			case <-tick.C:
				wg.Add(1)
				go func() {
					defer wg.Done()
					t0 := time.Now()
					run, err := kagzi.Start(ctx, c, retentionLoad, 1)
					if err == nil {
						_, err = run.Wait(ctx)
					}
					if err != nil {
						b.Error(err)
						return
					}
					mu.Lock()
					lat = append(lat, time.Since(t0))
					mu.Unlock()
				}()
			}
			if minDone && finished == nil {
				break
			}
		}
		wg.Wait()
		slices.Sort(lat)
		return lat
	}
	pct := func(lat []time.Duration, p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[int(float64(len(lat)-1)*p)].Microseconds()) / 1000
	}
	days, err := store.HistoryPartitions(ctx, pool, "runs_history")
	if err != nil || len(days) < 4 {
		b.Fatalf("history partitions %v, %v", days, err)
	}
	var dayRuns int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.`+store.HistoryPartitionName("runs_history", days[2])).Scan(&dayRuns); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	base := measure(10*time.Second, func() {})
	var dropped []string
	var dropTook time.Duration
	drop := measure(10*time.Second, func() {
		t0 := time.Now()
		dropped, err = store.DropHistoryBefore(ctx, pool, days[3])
		dropTook = time.Since(t0)
		if err != nil {
			b.Error(err)
		}
	})
	var deleted int64
	var deleteTook time.Duration
	del := measure(10*time.Second, func() {
		t0 := time.Now()
		for time.Since(t0) < 30*time.Second {
			k, err := store.PruneFinished(ctx, pool, "default", 24*time.Hour, 500)
			if err != nil {
				b.Error(err)
				return
			}
			deleted += k
			if k < 500 {
				break
			}
		}
		deleteTook = time.Since(t0)
	})
	b.StopTimer()
	b.ReportMetric(pct(base, 0.5), "base-p50-ms")
	b.ReportMetric(pct(base, 0.99), "base-p99-ms")
	b.ReportMetric(pct(drop, 0.5), "drop-p50-ms")
	b.ReportMetric(pct(drop, 0.99), "drop-p99-ms")
	b.ReportMetric(float64(dropTook.Milliseconds()), "drop-took-ms")
	b.ReportMetric(pct(del, 0.5), "delete-p50-ms")
	b.ReportMetric(pct(del, 0.99), "delete-p99-ms")
	b.ReportMetric(float64(deleteTook.Milliseconds()), "delete-took-ms")
	b.ReportMetric(float64(deleted), "deleted-runs")
	b.ReportMetric(float64(dayRuns), "dropped-day-runs")
	b.Logf("dropped %d partitions of the days before %s (the last a full day of %d runs); deleted %d live runs row by row; runs measured: %d, %d, %d",
		len(dropped), days[3].Format(time.DateOnly), dayRuns, deleted, len(base), len(drop), len(del))
}
