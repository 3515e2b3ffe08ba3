package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/jackc/pgx/v5/pgxpool"
)

// dbosSettings is one DBOS configuration.
type dbosSettings struct {
	label      string
	queued     bool          // false: workflows started directly (RunWorkflow without a queue)
	poll       time.Duration // queue polling interval; 0: DBOS's default (1 s)
	handlePoll time.Duration // GetResult polling interval; 0: DBOS's default (1 s)
}

// DBOS registers workflows by function, so they are package-level functions; what a
// workload records goes through these hooks, set before each workload.
var dbosHooks struct {
	first  *stamps
	asleep *stamps
	lags   *durations
	sleep  time.Duration
}

func dbosSteps(ctx dbos.Context, in int64, steps int) (int64, error) {
	v := in
	for i := range steps {
		var err error
		v, err = dbos.RunAsStep(ctx, func(context.Context) (int64, error) {
			if i == 0 && dbosHooks.first != nil {
				dbosHooks.first.mark(in)
			}
			return v + 1, nil
		}, dbos.WithStepName("s"))
		if err != nil {
			return 0, err
		}
	}
	return v, nil
}

func dbosOneStep(ctx dbos.Context, in int64) (int64, error)    { return dbosSteps(ctx, in, 1) }
func dbosThreeSteps(ctx dbos.Context, in int64) (int64, error) { return dbosSteps(ctx, in, 3) }

// dbosManySteps runs k steps.
func dbosManySteps(ctx dbos.Context, k int64) (int64, error) { return dbosSteps(ctx, 0, int(k)) }

func dbosSleeper(ctx dbos.Context, in int64) (int64, error) {
	dbosHooks.asleep.mark(in)
	if _, err := dbos.Sleep(ctx, dbosHooks.sleep); err != nil {
		return 0, err
	}
	t, _ := dbosHooks.asleep.get(in)
	dbosHooks.lags.add(time.Since(t.Add(dbosHooks.sleep)))
	return in, nil
}

// dbosRunner runs the workloads through DBOS Transact with one DBOS context per
// workload (DBOS closes its pool on Shutdown), each on a new traced pool of the
// variant's database. Queued variants register one queue per workload; runs are
// enqueued and executed in this process.
type dbosRunner struct {
	p      params
	s      dbosSettings
	logger *slog.Logger
	db     *database
	rt     *counter
	obs    *pgxpool.Pool
	qSeq   int
	appSeq int
	idSeq  atomic.Int64
}

func newDBOSRunner(ctx context.Context, p params, s dbosSettings, logger *slog.Logger) (*dbosRunner, error) {
	db, err := createDatabase(ctx, "dbos")
	if err != nil {
		return nil, err
	}
	r := &dbosRunner{p: p, s: s, logger: logger, db: db, rt: newCounter(p)}
	if r.obs, err = db.pool(ctx, 2, nil); err != nil {
		return r, err
	}
	return r, nil
}

func (r *dbosRunner) close() {
	if r.obs != nil {
		r.obs.Close()
	}
	if r.db != nil {
		if err := r.db.drop(); err != nil {
			r.logger.Error("drop database", "db", r.db.name, "error", err)
		}
	}
}

// dbosApp is one DBOS context, not launched yet.
type dbosApp struct {
	ctx    dbos.Context
	prefix string     // of the workflow ids of its runs
	queue  dbos.Queue // nil when not queued
	qname  string
}

func (r *dbosRunner) app(ctx context.Context, slots int) (*dbosApp, error) {
	pool, err := r.db.pool(ctx, r.p.conns, r.rt)
	if err != nil {
		return nil, err
	}
	// An executor id of its own, so that Launch does not recover the runs an earlier
	// workload left unfinished (the open loop leaves a backlog behind).
	r.appSeq++
	dctx, err := dbos.NewContext(ctx, dbos.Config{AppName: "kagzi-bench", ExecutorID: fmt.Sprintf("bench-%d", r.appSeq),
		SystemDBPool: pool, Logger: r.logger})
	if err != nil {
		pool.Close()
		return nil, err
	}
	dbos.RegisterWorkflow(dctx, dbosOneStep, dbos.WithWorkflowName("bench-1"))
	dbos.RegisterWorkflow(dctx, dbosThreeSteps, dbos.WithWorkflowName("bench-3"))
	dbos.RegisterWorkflow(dctx, dbosManySteps, dbos.WithWorkflowName("bench-n"))
	dbos.RegisterWorkflow(dctx, dbosSleeper, dbos.WithWorkflowName("bench-sleep"))
	a := &dbosApp{ctx: dctx, prefix: fmt.Sprintf("a%d-", r.appSeq)}
	if r.s.queued {
		r.qSeq++
		a.qname = fmt.Sprintf("bench_%d", r.qSeq)
		opts := []dbos.QueueOption{dbos.WithWorkerConcurrency(slots)}
		if r.s.poll > 0 {
			opts = append(opts, dbos.WithQueueBasePollingInterval(r.s.poll))
		}
		if a.queue, err = dbos.RegisterQueue(dctx, a.qname, opts...); err != nil {
			_ = dbos.Shutdown(dctx, 5*time.Second)
			return nil, err
		}
		dctx.ListenQueues(dctx, a.qname)
	}
	return a, nil
}

func (a *dbosApp) shutdown() {
	if a.queue != nil {
		_ = dbos.DeleteQueue(a.ctx, a.qname)
	}
	_ = dbos.Shutdown(a.ctx, 10*time.Second)
}

// run starts wf (through the queue when the variant is queued) and returns a function
// that waits for its result.
func (r *dbosRunner) run(a *dbosApp, wf dbos.Workflow[int64, int64], in int64) (func() error, error) {
	opts := []dbos.WorkflowOption{dbos.WithWorkflowID(fmt.Sprintf("%s%d", a.prefix, r.idSeq.Add(1)))}
	if a.queue != nil {
		opts = append(opts, dbos.WithQueue(a.queue))
	}
	h, err := dbos.RunWorkflow(a.ctx, wf, in, opts...)
	if err != nil {
		return nil, err
	}
	return func() error {
		var gopts []dbos.GetResultOption
		if r.s.handlePoll > 0 {
			gopts = append(gopts, dbos.WithHandlePollingInterval(r.s.handlePoll))
		}
		_, err := h.GetResult(gopts...)
		return err
	}, nil
}

const dbosUnfinished = `SELECT count(*) FROM (SELECT 1 FROM dbos.workflow_status WHERE queue_name = $1 AND status IN ('ENQUEUED', 'PENDING', 'DELAYED') LIMIT 1) t`
const dbosCompleted = `SELECT count(*) FROM dbos.workflow_status WHERE queue_name = $1 AND status = 'SUCCESS'`

func (r *dbosRunner) burnDown(ctx context.Context, steps int) (*burnResult, error) {
	wf, name := dbosOneStep, "bench-1"
	if steps == 3 {
		wf, name = dbosThreeSteps, "bench-3"
	}
	a, err := r.app(ctx, r.p.slots)
	if err != nil {
		return nil, err
	}
	defer a.shutdown()
	if !r.s.queued {
		// No queue, so nothing to pre-insert: p.slots callers start runs directly and
		// wait for each (GetResult), as a DBOS application without a queue does.
		if err := dbos.Launch(a.ctx); err != nil {
			return nil, err
		}
		rt0 := r.rt.load()
		t0 := time.Now()
		end := t0.Add(r.p.burnTimeout)
		var done countDone
		err := parallel(r.p.n, r.p.slots, func(i int) error {
			if time.Now().After(end) {
				return nil
			}
			wait, err := r.run(a, wf, int64(i))
			if err != nil {
				return err
			}
			if err := wait(); err != nil {
				return err
			}
			done.add()
			return nil
		})
		elapsed := time.Since(t0)
		if err != nil {
			return nil, err
		}
		return &burnResult{n: r.p.n, done: done.get(), elapsed: elapsed, rtRun: r.rt.load() - rt0,
			how: fmt.Sprintf("started directly by %d concurrent callers", r.p.slots)}, nil
	}
	c0 := time.Now()
	rt0 := r.rt.load()
	if err := parallel(r.p.n, 8, func(i int) error {
		_, err := dbos.Enqueue[int64](a.ctx, a.qname, name, int64(i),
			dbos.WithEnqueueWorkflowID(fmt.Sprintf("%s%d", a.prefix, r.idSeq.Add(1))))
		return err
	}); err != nil {
		return nil, err
	}
	rt1 := r.rt.load()
	created := time.Since(c0)
	t0 := time.Now()
	if err := dbos.Launch(a.ctx); err != nil {
		return nil, err
	}
	finished, err := waitUntil(ctx, r.obs, 10*time.Millisecond, t0.Add(r.p.burnTimeout), dbosUnfinished, a.qname)
	elapsed := time.Since(t0)
	rt2 := r.rt.load()
	if err != nil {
		return nil, err
	}
	done, err := count(ctx, r.obs, dbosCompleted, a.qname)
	if err != nil {
		return nil, err
	}
	if finished && int(done) != r.p.n {
		return nil, fmt.Errorf("dbos burn-down: %d of %d workflows SUCCESS", done, r.p.n)
	}
	return &burnResult{n: r.p.n, done: int(done), elapsed: elapsed, created: created, rtInsert: rt1 - rt0, rtRun: rt2 - rt1,
		how: "enqueued, then Launch"}, nil
}

func (r *dbosRunner) launched(ctx context.Context, slots int) (*dbosApp, error) {
	a, err := r.app(ctx, slots)
	if err != nil {
		return nil, err
	}
	if err := dbos.Launch(a.ctx); err != nil {
		a.shutdown()
		return nil, err
	}
	time.Sleep(200 * time.Millisecond)
	return a, nil
}

func (r *dbosRunner) steady(ctx context.Context) (*steadyResult, error) {
	a, err := r.launched(ctx, r.p.slots)
	if err != nil {
		return nil, err
	}
	defer a.shutdown()
	return closedLoop(ctx, r.p.starters, r.p.steadyFor, func(seq int64) error {
		wait, err := r.run(a, dbosOneStep, seq)
		if err != nil {
			return err
		}
		return wait()
	})
}

const dbosCompletedByPrefix = `SELECT count(*) FROM dbos.workflow_status WHERE workflow_uuid LIKE $1 AND status = 'SUCCESS'`

func (r *dbosRunner) open(ctx context.Context) (*openResult, error) {
	a, err := r.launched(ctx, r.p.slots)
	if err != nil {
		return nil, err
	}
	defer a.shutdown()
	t0 := time.Now()
	started, err := openLoop(ctx, r.p.starters, r.p.steadyFor, func(seq int64) error {
		_, err := r.run(a, dbosOneStep, seq) // directly: the run goes on in its own goroutine
		return err
	})
	elapsed := time.Since(t0)
	if err != nil {
		return nil, err
	}
	done, err := count(ctx, r.obs, dbosCompletedByPrefix, a.prefix+"%")
	if err != nil {
		return nil, err
	}
	return &openResult{started: started, completed: int(done), elapsed: elapsed}, nil
}

func (r *dbosRunner) latency(ctx context.Context) (*latencyResult, error) {
	first := &stamps{}
	dbosHooks.first = first
	defer func() { dbosHooks.first = nil }()
	a, err := r.launched(ctx, r.p.slots)
	if err != nil {
		return nil, err
	}
	defer a.shutdown()
	return sequential(ctx, r.p.latencySamples, r.p.latencyBudget, func(seq int64) (time.Duration, time.Duration, error) {
		t0 := time.Now()
		wait, err := r.run(a, dbosThreeSteps, seq)
		if err != nil {
			return 0, 0, err
		}
		if err := wait(); err != nil {
			return 0, 0, err
		}
		d := time.Since(t0)
		f, ok := first.get(seq)
		if !ok {
			return 0, 0, errors.New("dbos: first step not recorded")
		}
		return f.Sub(t0), d, nil
	})
}

func (r *dbosRunner) sleepers(ctx context.Context) (*sleepResult, error) {
	if !r.s.queued {
		return nil, errNA // without a queue there are no slots to share
	}
	dbosHooks.asleep, dbosHooks.lags, dbosHooks.sleep = &stamps{}, &durations{}, r.p.sleep
	a, err := r.launched(ctx, r.p.sleepSlots)
	if err != nil {
		return nil, err
	}
	defer a.shutdown()
	t0 := time.Now()
	if err := parallel(r.p.sleepers, 8, func(i int) error {
		_, err := r.run(a, dbosSleeper, int64(i))
		return err
	}); err != nil {
		return nil, err
	}
	if _, err := waitUntil(ctx, r.obs, 5*time.Millisecond, t0.Add(r.p.sleepTimeout), dbosUnfinished, a.qname); err != nil {
		return nil, err
	}
	all := time.Since(t0)
	done, err := count(ctx, r.obs, dbosCompleted, a.qname)
	if err != nil {
		return nil, err
	}
	return &sleepResult{runs: r.p.sleepers, done: int(done), allDone: all, lags: dbosHooks.lags.all()}, nil
}

func (r *dbosRunner) stepCost(ctx context.Context) (*stepResult, error) {
	if r.s.queued {
		return nil, errNA // the same code path as direct once the workflow runs
	}
	a, err := r.launched(ctx, r.p.slots)
	if err != nil {
		return nil, err
	}
	defer a.shutdown()
	return measureSteps(r.p, func(long bool) (time.Duration, int64, error) {
		k := int64(0)
		if long {
			k = int64(r.p.steps)
		}
		rt0 := r.rt.load()
		t0 := time.Now()
		wait, err := r.run(a, dbosManySteps, k)
		if err != nil {
			return 0, 0, err
		}
		if err := wait(); err != nil {
			return 0, 0, err
		}
		return time.Since(t0), r.rt.load() - rt0, nil
	})
}

func (r *dbosRunner) idle(ctx context.Context) (*idleResult, error) {
	a, err := r.launched(ctx, r.p.slots)
	if err != nil {
		return nil, err
	}
	defer a.shutdown()
	return measureIdle(ctx, r.rt, r.p.idleFor)
}

func (r *dbosRunner) counter() *counter { return r.rt }

func (r *dbosRunner) vacuum(context.Context) (*vacuumResult, error) { return nil, errNA }
