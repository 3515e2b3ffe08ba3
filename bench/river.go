package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// riverSettings is one River configuration.
type riverSettings struct {
	label         string
	fetchCooldown time.Duration // 0: River's default (100 ms)
	fetchPoll     time.Duration // 0: River's default (1 s)
	workers       int           // MaxWorkers of the queue
	burnOnly      bool          // run only the burn-down and steady-state workloads
}

// River jobs have no steps: a job is one unit of work, so it is compared with 1-step
// workflows. A job "sleeps" by snoozing (river.JobSnooze), which releases its worker.
type riverArgs struct {
	Seq    int64 `json:"seq"`
	Snooze bool  `json:"snooze,omitempty"`
}

func (riverArgs) Kind() string { return "bench" }

type riverWorker struct {
	river.WorkerDefaults[riverArgs]
	work func(ctx context.Context, job *river.Job[riverArgs]) error
}

func (w *riverWorker) Work(ctx context.Context, job *river.Job[riverArgs]) error {
	if w.work == nil {
		return nil
	}
	return w.work(ctx, job)
}

// riverRunner inserts and works jobs with one client per workload on one traced pool,
// in this process. Completion is observed in the database or through River's
// completed-job events, which River emits after its completer wrote the completion.
type riverRunner struct {
	p      params
	s      riverSettings
	logger *slog.Logger
	db     *database
	rt     *counter
	pool   *pgxpool.Pool
	obs    *pgxpool.Pool
	qSeq   int
}

func newRiverRunner(ctx context.Context, p params, s riverSettings, logger *slog.Logger) (*riverRunner, error) {
	db, err := createDatabase(ctx, "river")
	if err != nil {
		return nil, err
	}
	r := &riverRunner{p: p, s: s, logger: logger, db: db, rt: newCounter(p)}
	if r.pool, err = db.pool(ctx, p.conns, r.rt); err != nil {
		return r, err
	}
	if r.obs, err = db.pool(ctx, 2, nil); err != nil {
		return r, err
	}
	m, err := rivermigrate.New(riverpgxv5.New(r.obs), nil)
	if err != nil {
		return r, err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return r, fmt.Errorf("river migrate: %w", err)
	}
	return r, nil
}

func (r *riverRunner) close() {
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

// client returns a worker client for a fresh queue (not started yet) with the
// variant's settings and workers slots.
func (r *riverRunner) client(slots int, work func(context.Context, *river.Job[riverArgs]) error) (*river.Client[pgx.Tx], string, error) {
	r.qSeq++
	q := fmt.Sprintf("bench_%d", r.qSeq)
	workers := river.NewWorkers()
	river.AddWorker(workers, &riverWorker{work: work})
	c, err := river.NewClient(riverpgxv5.New(r.pool), &river.Config{
		Logger:            r.logger,
		FetchCooldown:     r.s.fetchCooldown,
		FetchPollInterval: r.s.fetchPoll,
		Queues:            map[string]river.QueueConfig{q: {MaxWorkers: slots}},
		Workers:           workers,
	})
	return c, q, err
}

func stopRiver(c *river.Client[pgx.Tx]) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = c.Stop(ctx)
}

const riverUnfinished = `SELECT count(*) FROM (SELECT 1 FROM river_job WHERE queue = $1 AND state IN ('available', 'running', 'retryable', 'scheduled', 'pending') LIMIT 1) t`
const riverCompleted = `SELECT count(*) FROM river_job WHERE queue = $1 AND state = 'completed'`

// completions routes River's completed-job events to the callers waiting for them.
type completions struct {
	mu      sync.Mutex
	waiting map[int64]chan struct{}
	early   map[int64]bool
}

func newCompletions(c *river.Client[pgx.Tx]) (*completions, func()) {
	ch, cancel := c.SubscribeConfig(&river.SubscribeConfig{ChanSize: 1 << 20, Kinds: []river.EventKind{river.EventKindJobCompleted}})
	cs := &completions{waiting: map[int64]chan struct{}{}, early: map[int64]bool{}}
	go func() {
		for ev := range ch {
			cs.mu.Lock()
			if w, ok := cs.waiting[ev.Job.ID]; ok {
				close(w)
				delete(cs.waiting, ev.Job.ID)
			} else {
				cs.early[ev.Job.ID] = true
			}
			cs.mu.Unlock()
		}
	}()
	return cs, cancel
}

func (cs *completions) wait(ctx context.Context, id int64) error {
	cs.mu.Lock()
	if cs.early[id] {
		delete(cs.early, id)
		cs.mu.Unlock()
		return nil
	}
	w := make(chan struct{})
	cs.waiting[id] = w
	cs.mu.Unlock()
	select {
	case <-w:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Minute):
		return fmt.Errorf("river: job %d not completed after a minute", id)
	}
}

func (r *riverRunner) burnDown(ctx context.Context, steps int) (*burnResult, error) {
	if steps != 1 {
		return nil, errNA
	}
	c, q, err := r.client(r.s.workers, nil)
	if err != nil {
		return nil, err
	}
	lsn0, oid := walMark(ctx, r.obs)
	c0 := time.Now()
	rt0 := r.rt.load()
	const batch = 1000
	for i := 0; i < r.p.n; i += batch {
		ps := make([]river.InsertManyParams, 0, batch)
		for j := i; j < min(i+batch, r.p.n); j++ {
			ps = append(ps, river.InsertManyParams{Args: riverArgs{Seq: int64(j)}, InsertOpts: &river.InsertOpts{Queue: q}})
		}
		if _, err := c.InsertMany(ctx, ps); err != nil {
			return nil, err
		}
	}
	rt1 := r.rt.load()
	created := time.Since(c0)
	t0 := time.Now()
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	finished, err := waitUntil(ctx, r.obs, 10*time.Millisecond, t0.Add(r.p.burnTimeout), riverUnfinished, q)
	elapsed := time.Since(t0)
	rt2 := r.rt.load()
	lsn1, _ := walMark(ctx, r.obs)
	stopRiver(c)
	if err != nil {
		return nil, err
	}
	done, err := count(ctx, r.obs, riverCompleted, q)
	if err != nil {
		return nil, err
	}
	if finished && int(done) != r.p.n {
		return nil, fmt.Errorf("river burn-down: %d of %d jobs completed", done, r.p.n)
	}
	return &burnResult{n: r.p.n, done: int(done), elapsed: elapsed, created: created, rtInsert: rt1 - rt0, rtRun: rt2 - rt1,
		how: "InsertMany, then one client", lsn0: lsn0, lsn1: lsn1, dbOID: oid}, nil
}

func (r *riverRunner) steady(ctx context.Context) (*steadyResult, error) {
	c, q, err := r.client(r.s.workers, nil)
	if err != nil {
		return nil, err
	}
	cs, cancel := newCompletions(c)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	defer stopRiver(c)
	time.Sleep(200 * time.Millisecond)
	return closedLoop(ctx, r.p.starters, r.p.steadyFor, func(seq int64) error {
		res, err := c.Insert(ctx, riverArgs{Seq: seq}, &river.InsertOpts{Queue: q})
		if err != nil {
			return err
		}
		return cs.wait(ctx, res.Job.ID)
	})
}

func (r *riverRunner) open(ctx context.Context) (*openResult, error) {
	c, q, err := r.client(r.s.workers, nil)
	if err != nil {
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	defer stopRiver(c)
	time.Sleep(200 * time.Millisecond)
	t0 := time.Now()
	started, err := openLoop(ctx, r.p.starters, r.p.steadyFor, func(seq int64) error {
		_, err := c.Insert(ctx, riverArgs{Seq: seq}, &river.InsertOpts{Queue: q})
		return err
	})
	elapsed := time.Since(t0)
	if err != nil {
		return nil, err
	}
	done, err := count(ctx, r.obs, riverCompleted, q)
	if err != nil {
		return nil, err
	}
	return &openResult{started: started, completed: int(done), elapsed: elapsed}, nil
}

func (r *riverRunner) latency(ctx context.Context) (*latencyResult, error) {
	if r.s.burnOnly {
		return nil, errNA
	}
	var first stamps
	c, q, err := r.client(r.s.workers, func(_ context.Context, job *river.Job[riverArgs]) error {
		first.mark(job.Args.Seq)
		return nil
	})
	if err != nil {
		return nil, err
	}
	cs, cancel := newCompletions(c)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	defer stopRiver(c)
	time.Sleep(200 * time.Millisecond)
	return sequential(ctx, r.p.latencySamples, r.p.latencyBudget, func(seq int64) (time.Duration, time.Duration, error) {
		t0 := time.Now()
		res, err := c.Insert(ctx, riverArgs{Seq: seq}, &river.InsertOpts{Queue: q})
		if err != nil {
			return 0, 0, err
		}
		if err := cs.wait(ctx, res.Job.ID); err != nil {
			return 0, 0, err
		}
		d := time.Since(t0)
		f, ok := first.get(seq)
		if !ok {
			return 0, 0, errors.New("river: job start not recorded")
		}
		return f.Sub(t0), d, nil
	})
}

func (r *riverRunner) sleepers(ctx context.Context) (*sleepResult, error) {
	if r.s.burnOnly {
		return nil, errNA
	}
	var asleep stamps
	var lags durations
	sleep := r.p.sleep
	c, q, err := r.client(r.p.sleepSlots, func(_ context.Context, job *river.Job[riverArgs]) error {
		if _, ok := asleep.get(job.Args.Seq); !ok {
			asleep.mark(job.Args.Seq)
			return river.JobSnooze(sleep)
		}
		t, _ := asleep.get(job.Args.Seq)
		lags.add(time.Since(t.Add(sleep)))
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	defer stopRiver(c)
	time.Sleep(200 * time.Millisecond)
	t0 := time.Now()
	if err := parallel(r.p.sleepers, 8, func(i int) error {
		_, err := c.Insert(ctx, riverArgs{Seq: int64(i), Snooze: true}, &river.InsertOpts{Queue: q})
		return err
	}); err != nil {
		return nil, err
	}
	if _, err := waitUntil(ctx, r.obs, 5*time.Millisecond, t0.Add(r.p.sleepTimeout), riverUnfinished, q); err != nil {
		return nil, err
	}
	all := time.Since(t0)
	done, err := count(ctx, r.obs, riverCompleted, q)
	if err != nil {
		return nil, err
	}
	return &sleepResult{runs: r.p.sleepers, done: int(done), allDone: all, lags: lags.all()}, nil
}

func (r *riverRunner) stepCost(context.Context) (*stepResult, error) { return nil, errNA }

func (r *riverRunner) idle(ctx context.Context) (*idleResult, error) {
	if r.s.burnOnly {
		return nil, errNA
	}
	c, _, err := r.client(r.s.workers, nil)
	if err != nil {
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	defer stopRiver(c)
	return measureIdle(ctx, r.rt, r.p.idleFor)
}

func (r *riverRunner) counter() *counter { return r.rt }

func (r *riverRunner) vacuum(ctx context.Context) (*vacuumResult, error) {
	if r.s.burnOnly {
		return nil, errNA
	}
	vp := r.p.vac
	t0 := time.Now().Add(time.Second)
	tr := newVacTracker(t0, vp.window)
	c, q, err := r.client(r.s.workers, func(_ context.Context, job *river.Job[riverArgs]) error {
		tr.first(strconv.FormatInt(job.ID, 10), time.Now())
		return nil
	})
	if err != nil {
		return nil, err
	}
	ch, cancel := c.SubscribeConfig(&river.SubscribeConfig{ChanSize: 1 << 20, Kinds: []river.EventKind{river.EventKindJobCompleted}})
	defer cancel()
	go func() {
		for ev := range ch {
			tr.done(strconv.FormatInt(ev.Job.ID, 10), time.Now())
		}
	}()
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	defer stopRiver(c)
	var seq atomic.Int64
	tg := &vacuumTarget{
		name: r.s.label, db: r.db, obs: r.obs, schema: "public", table: "river_job", index: "river_job_prioritized_fetching_index",
		start: func(ctx context.Context) (string, error) {
			res, err := c.Insert(ctx, riverArgs{Seq: seq.Add(1)}, &river.InsertOpts{Queue: q})
			if err != nil {
				return "", err
			}
			return strconv.FormatInt(res.Job.ID, 10), nil
		},
		// The scan of River's fetch (JobGetAvailable).
		probe: `SELECT id FROM river_job WHERE state = 'available' AND queue = $1 AND scheduled_at <= now()
			ORDER BY priority, scheduled_at, id LIMIT 100 FOR UPDATE SKIP LOCKED`,
		probeArgs: func(context.Context) []any { return []any{q} },
	}
	time.Sleep(time.Until(t0))
	return runVacuumLoad(ctx, vp, tg, tr, func(f string, a ...any) { fmt.Fprintf(os.Stderr, "["+r.s.label+"] "+f+"\n", a...) })
}
