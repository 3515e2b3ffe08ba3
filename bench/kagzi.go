package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

// kagziRunner runs the workloads through Kagzi's public API, embedded as the README
// shows: one client on one traced pool starts runs, waits for them and runs the Worker,
// in this process; runs go through the queue (NOTIFY + claim).
type kagziRunner struct {
	p      params
	logger *slog.Logger
	db     *database
	rt     *counter
	pool   *pgxpool.Pool
	obs    *pgxpool.Pool // untraced: progress polls
	nsSeq  int
	// clients are closed before the database is dropped, so that their LISTEN
	// connections do not find it gone and warn.
	clients []*kagzi.Client
}

func newKagziRunner(ctx context.Context, p params, logger *slog.Logger) (*kagziRunner, error) {
	db, err := createDatabase(ctx, "kagzi")
	if err != nil {
		return nil, err
	}
	r := &kagziRunner{p: p, logger: logger, db: db, rt: newCounter(p)}
	if r.pool, err = db.pool(ctx, p.conns, r.rt); err != nil {
		return r, err
	}
	if r.obs, err = db.pool(ctx, 2, nil); err != nil {
		return r, err
	}
	if err := kagzi.Migrate(ctx, r.obs); err != nil {
		return r, fmt.Errorf("kagzi migrate: %w", err)
	}
	return r, nil
}

func (r *kagziRunner) close() {
	for _, c := range r.clients {
		c.Close()
	}
	for _, p := range []*pgxpool.Pool{r.pool, r.obs} {
		if p != nil {
			p.Close()
		}
	}
	if r.db != nil {
		if err := r.db.drop(); err != nil {
			r.logger.Error("drop database", "db", r.db.name, "error", err)
		}
	}
}

// workerConfig is the WorkerConfig every workload uses: slots as given, the rest at
// Kagzi's defaults (lease 10 s, heartbeat lease/3, PollInterval 5 s as a fallback,
// MaxInProcessSleep 200 ms).
func (r *kagziRunner) workerConfig(slots int) kagzi.WorkerConfig {
	return kagzi.WorkerConfig{MaxConcurrent: slots, Logger: r.logger, PruneInterval: r.p.pruneInterval}
}

// client returns a client on a fresh namespace, so a workload never sees the runs of
// another; it both starts runs and runs the worker.
func (r *kagziRunner) client() (*kagzi.Client, string, error) {
	r.nsSeq++
	ns := fmt.Sprintf("bench-%d", r.nsSeq)
	c, err := kagzi.NewClient(r.pool, kagzi.Config{Namespace: ns, Logger: r.logger, ArchiveAfter: r.p.archiveAfter})
	if err == nil {
		r.clients = append(r.clients, c)
	}
	return c, ns, err
}

// runWorker starts a worker and returns a function that stops it and waits for Run.
func runWorker(ctx context.Context, w *kagzi.Worker) func() {
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	return func() {
		cancel()
		<-done
	}
}

// kagziUnfinished is the burn-downs' poll: is any run unfinished? It reads the newest
// first, where a burn-down's last runs wait; read from the oldest, it walked past the
// index entries of every run finished so far (see README.md, burn-down).
const kagziUnfinished = `SELECT count(*) FROM (SELECT 1 FROM kagzi.runs WHERE namespace = $1 AND status IN ('PENDING', 'RUNNING', 'SLEEPING') ORDER BY workflow_id DESC LIMIT 1) t`
const kagziCompleted = `SELECT count(*) FROM kagzi.runs_all WHERE namespace = $1 AND status = 'COMPLETED'`

func kagziSteps(name string, steps int, onFirst func(int64)) *kagzi.Workflow[int64, int64] {
	return kagzi.Define(name, func(ctx *kagzi.Context, in int64) (int64, error) {
		v := in
		for i := range steps {
			var err error
			v, err = kagzi.Step(ctx, "s", func(context.Context) (int64, error) {
				if i == 0 && onFirst != nil {
					onFirst(in)
				}
				return v + 1, nil
			})
			if err != nil {
				return 0, err
			}
		}
		return v, nil
	})
}

func (r *kagziRunner) burnDown(ctx context.Context, steps int) (*burnResult, error) {
	c, ns, err := r.client()
	if err != nil {
		return nil, err
	}
	wf := kagziSteps(fmt.Sprintf("burn-%d", steps), steps, nil)
	lsn0, oid := walMark(ctx, r.obs)
	c0 := time.Now()
	rt0 := r.rt.load()
	const batch = 1000
	for i := 0; i < r.p.n; i += batch {
		in := make([]int64, 0, batch)
		for j := i; j < min(i+batch, r.p.n); j++ {
			in = append(in, int64(j))
		}
		if _, err := kagzi.StartMany(ctx, c, wf, in); err != nil {
			return nil, err
		}
	}
	rt1 := r.rt.load()
	created := time.Since(c0)
	w, err := kagzi.NewWorker(c, r.workerConfig(r.p.slots), wf)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	stop := runWorker(ctx, w)
	finished, err := waitUntil(ctx, r.obs, 10*time.Millisecond, t0.Add(r.p.burnTimeout), kagziUnfinished, ns)
	elapsed := time.Since(t0)
	rt2 := r.rt.load()
	lsn1, _ := walMark(ctx, r.obs)
	if err != nil {
		stop()
		return nil, err
	}
	done, err := count(ctx, r.obs, kagziCompleted, ns)
	stop()
	if err != nil {
		return nil, err
	}
	if finished && int(done) != r.p.n {
		return nil, fmt.Errorf("kagzi burn-down: %d of %d runs COMPLETED", done, r.p.n)
	}
	return &burnResult{n: r.p.n, done: int(done), elapsed: elapsed, created: created, rtInsert: rt1 - rt0, rtRun: rt2 - rt1,
		how: "StartMany, then one worker", lsn0: lsn0, lsn1: lsn1, dbOID: oid}, nil
}

func (r *kagziRunner) steady(ctx context.Context) (*steadyResult, error) {
	c, _, err := r.client()
	if err != nil {
		return nil, err
	}
	wf := kagziSteps("steady", 1, nil)
	w, err := kagzi.NewWorker(c, r.workerConfig(r.p.slots), wf)
	if err != nil {
		return nil, err
	}
	stop := runWorker(ctx, w)
	defer stop()
	time.Sleep(200 * time.Millisecond) // the worker's listener is up
	return closedLoop(ctx, r.p.starters, r.p.steadyFor, func(seq int64) error {
		run, err := kagzi.Start(ctx, c, wf, seq)
		if err != nil {
			return err
		}
		_, err = run.Wait(ctx)
		return err
	})
}

func (r *kagziRunner) open(ctx context.Context) (*openResult, error) {
	c, ns, err := r.client()
	if err != nil {
		return nil, err
	}
	wf := kagziSteps("open", 1, nil)
	w, err := kagzi.NewWorker(c, r.workerConfig(r.p.slots), wf)
	if err != nil {
		return nil, err
	}
	stop := runWorker(ctx, w)
	defer stop()
	time.Sleep(200 * time.Millisecond)
	t0 := time.Now()
	started, err := openLoop(ctx, r.p.starters, r.p.steadyFor, func(seq int64) error {
		_, err := kagzi.Start(ctx, c, wf, seq)
		return err
	})
	elapsed := time.Since(t0)
	if err != nil {
		return nil, err
	}
	done, err := count(ctx, r.obs, kagziCompleted, ns)
	if err != nil {
		return nil, err
	}
	return &openResult{started: started, completed: int(done), elapsed: elapsed}, nil
}

func (r *kagziRunner) latency(ctx context.Context) (*latencyResult, error) {
	c, _, err := r.client()
	if err != nil {
		return nil, err
	}
	var first stamps
	wf := kagziSteps("latency", 3, first.mark)
	w, err := kagzi.NewWorker(c, r.workerConfig(r.p.slots), wf)
	if err != nil {
		return nil, err
	}
	stop := runWorker(ctx, w)
	defer stop()
	time.Sleep(200 * time.Millisecond)
	return sequential(ctx, r.p.latencySamples, r.p.latencyBudget, func(seq int64) (time.Duration, time.Duration, error) {
		t0 := time.Now()
		run, err := kagzi.Start(ctx, c, wf, seq)
		if err != nil {
			return 0, 0, err
		}
		if _, err := run.Wait(ctx); err != nil {
			return 0, 0, err
		}
		res := time.Since(t0)
		f, ok := first.get(seq)
		if !ok {
			return 0, 0, errors.New("kagzi: first step not recorded")
		}
		return f.Sub(t0), res, nil
	})
}

func (r *kagziRunner) sleepers(ctx context.Context) (*sleepResult, error) {
	c, ns, err := r.client()
	if err != nil {
		return nil, err
	}
	var asleep stamps
	var lags durations
	sleep := r.p.sleep
	wf := kagzi.Define("sleeper", func(ctx *kagzi.Context, in int64) (int64, error) {
		asleep.mark(in) // the first execution's time; a resumed run keeps it
		if err := ctx.Sleep("nap", sleep); err != nil {
			return 0, err
		}
		t, _ := asleep.get(in)
		lags.add(time.Since(t.Add(sleep)))
		return in, nil
	})
	w, err := kagzi.NewWorker(c, r.workerConfig(r.p.sleepSlots), wf)
	if err != nil {
		return nil, err
	}
	stop := runWorker(ctx, w)
	defer stop()
	time.Sleep(200 * time.Millisecond)
	t0 := time.Now()
	if err := parallel(r.p.sleepers, 8, func(i int) error {
		_, err := kagzi.Start(ctx, c, wf, int64(i))
		return err
	}); err != nil {
		return nil, err
	}
	if _, err := waitUntil(ctx, r.obs, 5*time.Millisecond, t0.Add(r.p.sleepTimeout), kagziUnfinished, ns); err != nil {
		return nil, err
	}
	all := time.Since(t0)
	done, err := count(ctx, r.obs, kagziCompleted, ns)
	if err != nil {
		return nil, err
	}
	return &sleepResult{runs: r.p.sleepers, done: int(done), allDone: all, lags: lags.all()}, nil
}

func (r *kagziRunner) stepCost(ctx context.Context) (*stepResult, error) {
	c, _, err := r.client()
	if err != nil {
		return nil, err
	}
	short := kagziSteps("steps-0", 0, nil)
	long := kagziSteps("steps-n", r.p.steps, nil)
	w, err := kagzi.NewWorker(c, r.workerConfig(r.p.slots), short, long)
	if err != nil {
		return nil, err
	}
	stop := runWorker(ctx, w)
	defer stop()
	time.Sleep(200 * time.Millisecond)
	one := func(wf *kagzi.Workflow[int64, int64]) (time.Duration, int64, error) {
		rt0 := r.rt.load()
		t0 := time.Now()
		run, err := kagzi.Start(ctx, c, wf, 0)
		if err != nil {
			return 0, 0, err
		}
		if _, err := run.Wait(ctx); err != nil {
			return 0, 0, err
		}
		return time.Since(t0), r.rt.load() - rt0, nil
	}
	return measureSteps(r.p, func(isLong bool) (time.Duration, int64, error) {
		if isLong {
			return one(long)
		}
		return one(short)
	})
}

func (r *kagziRunner) idle(ctx context.Context) (*idleResult, error) {
	c, _, err := r.client()
	if err != nil {
		return nil, err
	}
	wf := kagziSteps("idle", 1, nil)
	w, err := kagzi.NewWorker(c, r.workerConfig(r.p.slots), wf)
	if err != nil {
		return nil, err
	}
	stop := runWorker(ctx, w)
	defer stop()
	return measureIdle(ctx, r.rt, r.p.idleFor)
}

func (r *kagziRunner) counter() *counter { return r.rt }

// vacuumHooks reports the ends of the vacuum workload's runs (ExecutionEnd is called
// after the end was written).
type vacuumHooks struct {
	kagzi.NopHooks
	tr *vacTracker
}

func (h vacuumHooks) ExecutionEnd(_ context.Context, e *kagzi.ExecutionEvent) {
	if e.Outcome == kagzi.OutcomeCompleted {
		h.tr.done(e.RunID, time.Now())
	}
}

func (r *kagziRunner) vacuum(ctx context.Context) (*vacuumResult, error) {
	vp := r.p.vac
	t0 := time.Now().Add(time.Second)
	tr := newVacTracker(t0, vp.window)
	r.nsSeq++
	ns := fmt.Sprintf("bench-%d", r.nsSeq)
	wc, err := kagzi.NewClient(r.pool, kagzi.Config{Namespace: ns, Logger: r.logger, Hooks: vacuumHooks{tr: tr}})
	if err != nil {
		return nil, err
	}
	r.clients = append(r.clients, wc)
	wf := kagzi.Define("vacuum", func(ctx *kagzi.Context, in int64) (int64, error) {
		id := ctx.RunID()
		return kagzi.Step(ctx, "s", func(context.Context) (int64, error) {
			tr.first(id, time.Now())
			return in + 1, nil
		})
	})
	w, err := kagzi.NewWorker(wc, r.workerConfig(r.p.slots), wf)
	if err != nil {
		return nil, err
	}
	// The starts come from a client of their own (an API server, say), which runs no
	// worker: every run goes through the claim. -vacuum-eager starts from the worker's
	// client, whose worker may claim a run in its start's insert.
	sc := wc
	if !vp.eager {
		sp, err := r.db.pool(ctx, r.p.conns, r.rt) // traced: -sql shows the starts too
		if err != nil {
			return nil, err
		}
		defer sp.Close()
		if sc, err = kagzi.NewClient(sp, kagzi.Config{Namespace: ns, Logger: r.logger}); err != nil {
			return nil, err
		}
		defer sc.Close()
	}
	var opts func(n int64) []kagzi.StartOption
	switch vp.flow {
	case "":
	case "type":
		if _, err := wc.SetLimits(ctx, kagzi.Limits{WorkflowType: "vacuum", Concurrency: r.p.slots}); err != nil {
			return nil, err
		}
	case "keys":
		if _, err := wc.SetLimits(ctx, kagzi.Limits{WorkflowType: "vacuum", KeyConcurrency: 1}); err != nil {
			return nil, err
		}
		opts = func(n int64) []kagzi.StartOption {
			return []kagzi.StartOption{kagzi.WithConcurrencyKey(fmt.Sprintf("key-%05d", n%int64(max(vp.keys, 1))))}
		}
	default:
		return nil, fmt.Errorf("-vacuum-flow %q: want type, keys or nothing", vp.flow)
	}
	stop := runWorker(ctx, w)
	defer stop()
	var seq atomic.Int64
	tg := &vacuumTarget{
		name: colKagzi, db: r.db, obs: r.obs, schema: "kagzi", table: "kagzi.runs", index: "kagzi.runs_claimable",
		start: func(ctx context.Context) (string, error) {
			n := seq.Add(1)
			var o []kagzi.StartOption
			if opts != nil {
				o = opts(n)
			}
			run, err := kagzi.Start(ctx, sc, wf, n, o...)
			if err != nil {
				return "", err
			}
			return run.RunID, nil
		},
		// The claim's read of a type without limits or keys (kagzi.claim's plain types).
		probe: `SELECT r.run_id FROM kagzi.runs r
			WHERE r.namespace = $1 AND r.workflow_type = 'vacuum'
			  AND r.status IN ('PENDING', 'RUNNING', 'SLEEPING') AND r.available_at <= now()
			  AND (r.flow_key IS NULL OR r.started_at IS NOT NULL)
			ORDER BY r.available_at LIMIT 100 FOR UPDATE SKIP LOCKED`,
		probeArgs: func(context.Context) []any { return []any{ns} },
		nested: func(ctx context.Context, out io.Writer) error {
			var versions []string
			if err := r.obs.QueryRow(ctx, `SELECT workflow_versions FROM kagzi.workers WHERE namespace = $1 AND status = 'ONLINE' LIMIT 1`, ns).Scan(&versions); err != nil {
				return err
			}
			// The claim as store.ClaimRuns sends it (generic plan, no seq/bitmap scans),
			// for at most 10 runs, rolled back, with floors two seconds back (a worker's
			// are a second before its last claim's now() when its queues ran dry).
			floor := time.Now().Add(-2 * time.Second)
			return explainNested(ctx, r.db, out, []string{
				"SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)",
			}, `SELECT * FROM kagzi.claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
				ns, []string{"vacuum"}, versions, []string{""}, "vacuum-probe", int64(10000), 10, []string{},
				[]*time.Time{&floor}, []bool{false}, []*time.Time{&floor}, []bool{false})
		},
	}
	time.Sleep(time.Until(t0))
	return runVacuumLoad(ctx, vp, tg, tr, func(f string, a ...any) { fmt.Fprintf(os.Stderr, "[Kagzi] "+f+"\n", a...) })
}
