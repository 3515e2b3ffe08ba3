package kagzi_test

import (
	"context"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/store"
	"github.com/kagzi/kagzi/internal/testdb"
)

func TestANewStepCostsOneWriteAndAReplayedStepNoRoundTrip(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	workerPool, rt := tracedPool(t, e.url)
	wf := kagzi.Define("counted", func(ctx *kagzi.Context, _ int) (int, error) {
		sum := 0
		for range 10 {
			v, err := kagzi.Step(ctx, "before", func(context.Context) (int, error) { return 1, nil })
			if err != nil {
				return 0, err
			}
			sum += v
		}
		if err := ctx.Sleep("nap", 300*time.Millisecond); err != nil { // suspends: the 10 steps replay
			return 0, err
		}
		for range 10 {
			v, err := kagzi.Step(ctx, "after", func(context.Context) (int, error) { return 1, nil })
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	})
	runWorker(t, newClient(t, workerPool, ""), fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != 20 {
		t.Fatalf("got %d, %v", out, err)
	}
	if n := rt.count("INSERT INTO kagzi.steps AS s"); n != 20 {
		t.Fatalf("%d step writes for 20 new steps (10 of them replayed once), want 20", n)
	}
	// The claim of the woken run loads its steps (one query); replays read nothing.
	if n := rt.count("FROM kagzi.steps WHERE run_id = ANY($1)"); n != 1 {
		t.Fatalf("%d loads of recorded steps by claims, want 1 (the woken run's)", n)
	}
	if n := rt.count("FROM kagzi.steps") - rt.count("FROM kagzi.steps WHERE run_id = ANY($1)"); n > 0 {
		t.Fatalf("%d reads of recorded steps outside the claim: replays must not query", n)
	}
}

// benchEnv is a migrated database with a client, for benchmarks.
func benchEnv(b *testing.B) (*kagzi.Client, *pgxpool.Pool, *roundTrips) {
	b.Helper()
	pool, rt := tracedPool(b, testdb.New(b))
	c, err := kagzi.NewClient(pool, kagzi.Config{Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	return c, pool, rt
}

var threeSteps = kagzi.Define("three-steps", func(ctx *kagzi.Context, n int) (int, error) {
	for _, name := range []string{"a", "b", "c"} {
		v, err := kagzi.Step(ctx, name, func(context.Context) (int, error) { return n + 1, nil })
		if err != nil {
			return 0, err
		}
		n = v
	}
	return n, nil
})

// BenchmarkStart measures one Start (one statement) from a single caller.
func BenchmarkStart(b *testing.B) {
	c, _, rt := benchEnv(b)
	ctx := context.Background()
	b.ResetTimer()
	before := rt.n.Load()
	for range b.N {
		if _, err := kagzi.Start(ctx, c, threeSteps, 1); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rt.n.Load()-before)/float64(b.N), "round-trips/start")
}

// BenchmarkBurnDownThreeStepRuns starts b.N runs of a 3-step workflow, then times one
// worker completing them all, with 50 and with 200 slots: ns/op is per run.
func BenchmarkBurnDownThreeStepRuns(b *testing.B) {
	for _, slots := range []int{50, 200} {
		b.Run(fmt.Sprintf("slots=%d", slots), func(b *testing.B) { burnDown(b, slots) })
	}
}

func burnDown(b *testing.B, slots int) {
	c, pool, rt := benchEnv(b)
	ctx := context.Background()
	for range b.N {
		if _, err := kagzi.Start(ctx, c, threeSteps, 1); err != nil {
			b.Fatal(err)
		}
	}
	w, err := kagzi.NewWorker(c, kagzi.WorkerConfig{MaxConcurrent: slots}, threeSteps)
	if err != nil {
		b.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	before := rt.n.Load()
	b.ResetTimer()
	go func() { done <- w.Run(wctx) }()
	for {
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.runs WHERE status <> 'COMPLETED'`).Scan(&left); err != nil {
			b.Fatal(err)
		}
		if left == 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.StopTimer()
	polls := rt.n.Load() - before
	cancel()
	<-done
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "runs/s")
	// The progress polls above go through the same pool; they are a small share.
	b.ReportMetric(float64(polls)/float64(b.N), "round-trips/run")
}

// BenchmarkStartToResult measures the latency of one run of 3 steps, started and
// waited for sequentially, through the queue (NOTIFY wakes the worker).
func BenchmarkStartToResult(b *testing.B) {
	c, _, _ := benchEnv(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := kagzi.NewWorker(c, kagzi.WorkerConfig{}, threeSteps)
	if err != nil {
		b.Fatal(err)
	}
	go w.Run(ctx)
	time.Sleep(100 * time.Millisecond) // the worker's listener is up
	b.ResetTimer()
	for range b.N {
		run, err := kagzi.Start(ctx, c, threeSteps, 1)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := run.Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSequentialSteps runs one workflow of b.N sequential steps: ns/op is the
// per-step overhead (one fenced write each). The retry-policy variant shows that a
// policy costs nothing on a step that succeeds the first time.
func BenchmarkSequentialSteps(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts []kagzi.StepOption
	}{
		{"no-policy", nil},
		{"retry-policy", []kagzi.StepOption{kagzi.WithRetry(kagzi.Exponential(5).Initial(time.Second)), kagzi.WithTimeout(time.Minute)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c, _, rt := benchEnv(b)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			steps := b.N
			wf := kagzi.Define("many-steps", func(ctx *kagzi.Context, _ int) (int, error) {
				for range steps {
					if _, err := kagzi.Step(ctx, "s", func(context.Context) (int, error) { return 1, nil }, bc.opts...); err != nil {
						return 0, err
					}
				}
				return steps, nil
			})
			w, err := kagzi.NewWorker(c, kagzi.WorkerConfig{}, wf)
			if err != nil {
				b.Fatal(err)
			}
			go w.Run(ctx)
			b.ResetTimer()
			run, err := kagzi.Start(ctx, c, wf, 0)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := run.Wait(ctx); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(float64(rt.count("INSERT INTO kagzi.steps AS s"))/float64(b.N), "writes/step")
		})
	}
}

// BenchmarkFanOut runs n steps that each wait 100ms in process, in parallel (Map with
// the default limits) and one after another: compare the ns/op of the pairs.
func BenchmarkFanOut(b *testing.B) {
	for _, n := range []int{3, 100} {
		for _, mode := range []string{"parallel", "sequential"} {
			if mode == "sequential" && n == 100 && testing.Short() {
				continue
			}
			b.Run(fmt.Sprintf("%d-%s", n, mode), func(b *testing.B) {
				c, _, _ := benchEnv(b)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				work := func(context.Context) (int, error) { time.Sleep(100 * time.Millisecond); return 1, nil }
				wf := kagzi.Define("fan", func(ctx *kagzi.Context, n int) (int, error) {
					items := make([]int, n)
					if mode == "parallel" {
						outs, err := kagzi.Map(ctx, "item", items, func(ctx *kagzi.Context, _ int) (int, error) {
							return kagzi.Step(ctx, "work", work)
						})
						return len(outs), err
					}
					for range items {
						if _, err := kagzi.Step(ctx, "work", work); err != nil {
							return 0, err
						}
					}
					return n, nil
				})
				w, err := kagzi.NewWorker(c, kagzi.WorkerConfig{}, wf)
				if err != nil {
					b.Fatal(err)
				}
				go w.Run(ctx)
				b.ResetTimer()
				for range b.N {
					run, err := kagzi.Start(ctx, c, wf, n)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := run.Wait(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkStartMany measures bulk starts: ns/op is per run.
func BenchmarkStartMany(b *testing.B) {
	c, _, rt := benchEnv(b)
	ctx := context.Background()
	inputs := make([]int, 1000)
	b.ResetTimer()
	before := rt.n.Load()
	for done := 0; done < b.N; done += len(inputs) {
		n := min(len(inputs), b.N-done)
		if _, err := kagzi.StartMany(ctx, c, threeSteps, inputs[:n]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rt.n.Load()-before)/float64(b.N), "round-trips/run")
}

// BenchmarkClaimWithFinishedRuns measures one claim (of one ready run) with 0 and
// 1,000,000 finished runs in the table: the partial index keeps them out of its way.
func BenchmarkClaimWithFinishedRuns(b *testing.B) {
	for _, finished := range []int{0, 1_000_000} {
		b.Run(fmt.Sprintf("finished=%d", finished), func(b *testing.B) {
			c, pool, _ := benchEnv(b)
			ctx := context.Background()
			if _, err := pool.Exec(ctx, `
				INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input,
					available_at, finished_at, version)
				SELECT gen_random_uuid(), 'default', 'old-' || g, 'three-steps', 'COMPLETED', '1',
					now() - interval '1 day', now() - interval '1 day', ''
				FROM generate_series(1, $1) g`, finished); err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `VACUUM ANALYZE kagzi.runs`); err != nil {
				b.Fatal(err)
			}
			types, versions := []string{"three-steps"}, []string{""}
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				if _, err := kagzi.Start(ctx, c, threeSteps, 1); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				got, _, err := store.ClaimRuns(ctx, pool, store.Claimer{Namespace: "default", Types: types, Versions: versions, WorkerID: "bench", Lease: time.Minute, Cursors: map[string]string{}}, 1)
				if err != nil || len(got) != 1 {
					b.Fatalf("claimed %d, %v", len(got), err)
				}
			}
		})
	}
}

func TestAStartByNameWithoutAVersionCostsOneRoundTrip(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	pool, rt := tracedPool(t, e.url)
	c := newClient(t, pool, "")
	before := rt.n.Load()
	if _, err := c.StartByName(ctx, "by-name", 1); err != nil {
		t.Fatal(err)
	}
	if n := rt.n.Load() - before; n != 1 {
		t.Fatalf("StartByName took %d round trips, want 1 (the newest version is looked up by the insert)", n)
	}
}

// BenchmarkHistoryDepth measures what a run's history costs as it grows: the overhead
// of a new step after depth steps (the time of 100 steps, less their bodies' nothing,
// over 100) and the resume of a run that slept after depth steps (from the last step
// before the sleep to the first after it, less the sleep: the claim, the load of the
// recorded steps and the replay of the depth steps). Run it with -benchtime 1x:
//
//	go test -run '^$' -bench HistoryDepth -benchtime 1x .
func BenchmarkHistoryDepth(b *testing.B) {
	for _, depth := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) {
			c, _, _ := benchEnv(b)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			const more, sleep = 100, 300 * time.Millisecond
			var marks [4]time.Time // before the 100 steps, after them, before the sleep, after it
			mark := func(i int) func(context.Context) (int, error) {
				return func(context.Context) (int, error) { marks[i] = time.Now(); return 0, nil }
			}
			wf := kagzi.Define("deep", func(ctx *kagzi.Context, _ int) (int, error) {
				for range depth {
					if _, err := kagzi.Step(ctx, "s", func(context.Context) (int, error) { return 1, nil }); err != nil {
						return 0, err
					}
				}
				if _, err := kagzi.Step(ctx, "mark-0", mark(0)); err != nil {
					return 0, err
				}
				for range more {
					if _, err := kagzi.Step(ctx, "t", func(context.Context) (int, error) { return 1, nil }); err != nil {
						return 0, err
					}
				}
				if _, err := kagzi.Step(ctx, "mark-1", mark(1)); err != nil {
					return 0, err
				}
				if _, err := kagzi.Step(ctx, "mark-2", mark(2)); err != nil {
					return 0, err
				}
				if err := ctx.Sleep("nap", sleep); err != nil { // longer than MaxInProcessSleep: the run is released
					return 0, err
				}
				_, err := kagzi.Step(ctx, "mark-3", mark(3))
				return depth, err
			})
			w, err := kagzi.NewWorker(c, kagzi.WorkerConfig{MaxInProcessSleep: 10 * time.Millisecond}, wf)
			if err != nil {
				b.Fatal(err)
			}
			go w.Run(ctx)
			var perStep, resume time.Duration
			b.ResetTimer()
			for range b.N {
				run, err := kagzi.Start(ctx, c, wf, 0)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := run.Wait(ctx); err != nil {
					b.Fatal(err)
				}
				perStep += marks[1].Sub(marks[0]) / (more + 1)
				resume += marks[3].Sub(marks[2]) - sleep
			}
			b.StopTimer()
			b.ReportMetric(float64(perStep.Microseconds())/float64(b.N), "µs/step")
			b.ReportMetric(float64(resume.Microseconds())/1000/float64(b.N), "ms/resume")
		})
	}
}

// BenchmarkHistoryScale measures what a large history of finished runs costs the live
// path and the readers: a Start, a claim of one ready run, the newest page of ListRuns
// (all types, and one type), and one batch of the retention's pruning (500 runs), with
// 0 and N finished runs (spread over the 30 days of the default retention, five other
// types, one recorded step each). N comes from KAGZI_BENCH_HISTORY (default 1,000,000):
//
//	KAGZI_BENCH_HISTORY=10000000 go test -run '^$' -bench HistoryScale -benchtime 2000x -timeout 2h .
func BenchmarkHistoryScale(b *testing.B) {
	for _, finished := range []int{0, envInt("KAGZI_BENCH_HISTORY", 1_000_000)} {
		b.Run(fmt.Sprintf("finished=%d", finished), func(b *testing.B) {
			c, pool, _ := benchEnv(b)
			ctx := context.Background()
			fillHistory(b, pool, finished)
			b.Run("start", func(b *testing.B) { benchStarts(b, c) })
			b.Run("claim", func(b *testing.B) { benchClaims(b, c, pool) })
			for _, f := range []kagzi.RunFilter{{}, {WorkflowType: "three-steps"}} {
				b.Run("list-newest-page"+map[bool]string{true: "-of-a-type"}[f.WorkflowType != ""], func(b *testing.B) {
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
			b.Run("prune-batch-of-500", func(b *testing.B) {
				for range b.N {
					// The oldest 500 finished runs, with their steps and listing rows.
					if n, err := store.PruneFinished(ctx, pool, "default", time.Millisecond, 500); err != nil || n == 0 {
						b.Fatalf("pruned %d, %v", n, err)
					}
				}
			})
		})
	}
}

// benchStarts starts b.N runs of three-steps, one at a time.
func benchStarts(b *testing.B, c *kagzi.Client) {
	for range b.N {
		if _, err := kagzi.Start(context.Background(), c, threeSteps, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// benchClaims times b.N claims of one ready run of three-steps (each started
// untimed first).
func benchClaims(b *testing.B, c *kagzi.Client, pool *pgxpool.Pool) {
	ctx := context.Background()
	claimer := store.Claimer{Namespace: "default", Types: []string{"three-steps"}, Versions: []string{""},
		WorkerID: "bench", Lease: time.Minute, Cursors: map[string]string{}, Floors: store.NewFloors()}
	for range b.N {
		b.StopTimer()
		if _, err := kagzi.Start(ctx, c, threeSteps, 1); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if got, _, err := store.ClaimRuns(ctx, pool, claimer, 1); err != nil || len(got) == 0 {
			b.Fatalf("claimed %d, %v", len(got), err)
		}
	}
}

// fillHistory inserts n finished runs (COMPLETED, created over the last 30 days, of
// five types) with their listing rows and one recorded step each, a million at a time,
// and analyzes the tables.
func fillHistory(b *testing.B, pool *pgxpool.Pool, n int) {
	b.Helper()
	ctx := context.Background()
	for from := 0; from < n; from += 1_000_000 {
		to := min(from+1_000_000, n)
		if _, err := pool.Exec(ctx, `
			WITH ins AS (
				INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input, output,
					available_at, created_at, started_at, finished_at, version)
				SELECT gen_random_uuid(), 'default', 'old-' || g, 'old-' || (g % 5), 'COMPLETED', '1', '2',
					t, t, t, t + interval '3 ms', ''
				FROM generate_series($1::bigint, $2::bigint) g,
					LATERAL (SELECT now() - interval '30 days' + (g::float8 / $3) * interval '30 days' AS t) at
				RETURNING run_id, namespace, workflow_type, created_at
			), listed AS (
				INSERT INTO kagzi.runs_created (namespace, created_at, run_id, workflow_type)
				SELECT namespace, created_at, run_id, workflow_type FROM ins
			)
			INSERT INTO kagzi.steps (run_id, step_key, name, kind, status, output, attempts, position)
			SELECT run_id, 'a', 'a', 'STEP', 'COMPLETED', '2', 1, 0 FROM ins`, from+1, to, n); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE kagzi.runs, kagzi.runs_created, kagzi.steps`); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkBurnDownWithManyTypes burns down 10,000 1-step runs of one workflow type
// with a worker registered for 1, 10 and 50 types (MaxConcurrent 100): runs/s should
// not depend on the types the worker has nothing to claim of (the claim reads every
// type's limits and keyed queues in one statement each, not a statement per type).
// Run it with -benchtime 1x.
func BenchmarkBurnDownWithManyTypes(b *testing.B) {
	for _, types := range []int{1, 10, 50} {
		b.Run(fmt.Sprintf("types=%d", types), func(b *testing.B) {
			c, pool, _ := benchEnv(b)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var defs []kagzi.Definition
			var first *kagzi.Workflow[int, int]
			for i := range types {
				wf := kagzi.Define(fmt.Sprintf("t%02d", i), func(ctx *kagzi.Context, n int) (int, error) {
					return kagzi.Step(ctx, "a", func(context.Context) (int, error) { return n, nil })
				})
				if first == nil {
					first = wf
				}
				defs = append(defs, wf)
			}
			const n = 10000
			in := make([]int, n)
			if _, err := kagzi.StartMany(ctx, c, first, in); err != nil {
				b.Fatal(err)
			}
			w, err := kagzi.NewWorker(c, kagzi.WorkerConfig{MaxConcurrent: 100}, defs...)
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			cpu0, mallocs0 := processCPU(b), mallocs()
			t0 := time.Now()
			go w.Run(ctx)
			for {
				var left int
				if err := pool.QueryRow(ctx, "SELECT count(*) FROM kagzi.runs WHERE status <> 'COMPLETED'").Scan(&left); err != nil {
					b.Fatal(err)
				}
				if left == 0 {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			b.ReportMetric(n/time.Since(t0).Seconds(), "runs/s")
			// The client process's own work per run (the worker's, its pgx
			// connections', the garbage collector's), apart from PostgreSQL's.
			b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/n, "go-cpu-us/run")
			b.ReportMetric(float64(mallocs()-mallocs0)/n, "allocs/run")
		})
	}
}

// processCPU returns the CPU time (user and system) this process has used.
func processCPU(b *testing.B) time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		b.Fatal(err)
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

// mallocs returns the heap allocations this process has made.
func mallocs() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.Mallocs
}
