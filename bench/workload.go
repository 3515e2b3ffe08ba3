package main

import (
	"context"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// params are the sizes of the workloads, the same for every system.
type params struct {
	n           int           // runs per burn-down
	burnTimeout time.Duration // a burn-down still going after this reports its rate so far
	burnReps    int           // burn-downs per figure; the median rate is reported

	starters  int           // concurrent starters in the steady-state workload
	steadyFor time.Duration // length of the steady-state window

	latencySamples int           // sequential single runs
	latencyBudget  time.Duration // at most this long per system (slow peers take fewer samples)

	sleepers     int           // runs that sleep
	sleepSlots   int           // execution slots while they sleep
	sleep        time.Duration // how long each sleeps
	sleepTimeout time.Duration

	steps    int // steps of the long workflow in the per-step workload
	stepReps int // repetitions of the per-step workload (medians are taken)

	idleFor time.Duration // idle window

	slots int // execution slots (Kagzi MaxConcurrent, DBOS worker concurrency, River MaxWorkers)

	archiveAfter  time.Duration // Kagzi's Config.ArchiveAfter (0: its default)
	pruneInterval time.Duration // Kagzi's WorkerConfig.PruneInterval (0: its default)

	conns int32 // connections per pool

	sqlStats bool // keep the count and time of every statement

	flowModes map[string]bool // the flow workload's parts: flownone, flowtype, flowkeys, flowrate, fair

	vac vacuumParams // the vacuum workload
}

func newCounter(p params) *counter {
	c := &counter{}
	if p.sqlStats {
		c.stats = &sqlStats{}
	}
	return c
}

// errNA marks a workload a system variant does not run.
var errNA = errors.New("not applicable")

type burnResult struct {
	n, done  int
	elapsed  time.Duration
	created  time.Duration // time taken to create the runs before the burn-down
	rtInsert int64         // round trips to create the runs
	rtRun    int64         // round trips while executing them
	how      string
	// The WAL positions before the runs were created and after the last one finished,
	// and the database's oid: pg_waldump over that range, keeping the records of that
	// database (and the commits of their transactions), gives the WAL bytes per run
	// whatever else the server did meanwhile (docs/scaling.md).
	lsn0, lsn1 string
	dbOID      uint32
}

type steadyResult struct {
	done    int
	elapsed time.Duration
	lat     []time.Duration
}

// openResult is the open-loop steady state: starters start runs back to back without
// waiting for them while the workers execute.
type openResult struct {
	started, completed int
	elapsed            time.Duration
}

type latencyResult struct {
	first, result []time.Duration
}

type sleepResult struct {
	runs, done int
	allDone    time.Duration
	lags       []time.Duration
}

type stepResult struct {
	perStep   time.Duration
	rtPerStep float64
}

type idleResult struct {
	statements int64
	d          time.Duration
}

// runner runs the workloads on one system variant. A method returns errNA for a
// workload the variant does not run.
type runner interface {
	burnDown(ctx context.Context, steps int) (*burnResult, error)
	steady(ctx context.Context) (*steadyResult, error)
	open(ctx context.Context) (*openResult, error)
	latency(ctx context.Context) (*latencyResult, error)
	sleepers(ctx context.Context) (*sleepResult, error)
	stepCost(ctx context.Context) (*stepResult, error)
	idle(ctx context.Context) (*idleResult, error)
	vacuum(ctx context.Context) (*vacuumResult, error)
	counter() *counter
	close()
}

// stamps records the first time each key was marked.
type stamps struct{ m sync.Map }

func (s *stamps) mark(k int64) { s.m.LoadOrStore(k, time.Now()) }

func (s *stamps) get(k int64) (time.Time, bool) {
	v, ok := s.m.Load(k)
	if !ok {
		return time.Time{}, false
	}
	return v.(time.Time), true
}

// durations is a slice of durations safe for concurrent appends.
type durations struct {
	mu sync.Mutex
	d  []time.Duration
}

func (d *durations) add(x time.Duration) {
	x = max(x, 0) // a sleeper woken before its time (DBOS rounds its deadline to ms) is not late
	d.mu.Lock()
	d.d = append(d.d, x)
	d.mu.Unlock()
}

func (d *durations) all() []time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]time.Duration(nil), d.d...)
}

// parallel calls fn(0..n-1) from workers goroutines and returns the first error.
func parallel(n, workers int, fn func(i int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
					next.Store(int64(n))
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// closedLoop runs starters goroutines that each call one (start a run and wait for its
// durable completion) again and again for d. It counts the calls that finished within
// d and their latencies.
func closedLoop(ctx context.Context, starters int, d time.Duration, one func(seq int64) error) (*steadyResult, error) {
	var seq atomic.Int64
	var done atomic.Int64
	var lat durations
	var first error
	var once sync.Once
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for range starters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && time.Now().Before(end) {
				t := time.Now()
				if err := one(seq.Add(1)); err != nil {
					once.Do(func() { first = err })
					return
				}
				if now := time.Now(); !now.After(end) {
					done.Add(1)
					lat.add(now.Sub(t))
				}
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return nil, first
	}
	return &steadyResult{done: int(done.Load()), elapsed: d, lat: lat.all()}, nil
}

// sequential runs one sample at a time (after warm-up runs that are not kept) until
// it has samples of them or budget has passed.
//
// The warm-up covers PostgreSQL's plan cache, which plans a prepared statement anew
// at each of its first five executions on a connection before it settles on a plan:
// measured for Kagzi's start (2026-11-27, AMD box, log_min_duration_statement = 0),
// its bind took 0.8-2.8 ms at each of its first seven executions on each of the pool's
// two busy connections and 0.03 ms after, so that with 3 warm-up runs the first ~12
// samples of 300 were 1.5-7 ms and made the p99 (the third slowest) a figure of the
// first milliseconds of a process, not of its steady state. Every system gets the
// same warm-up.
func sequential(ctx context.Context, samples int, budget time.Duration, one func(seq int64) (first, result time.Duration, err error)) (*latencyResult, error) {
	const warmup = 20
	res := &latencyResult{}
	end := time.Now().Add(budget)
	for i := range samples + warmup {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if i >= warmup && time.Now().After(end) {
			break
		}
		f, r, err := one(int64(i))
		if err != nil {
			return nil, err
		}
		if i >= warmup {
			res.first = append(res.first, f)
			res.result = append(res.result, r)
		}
	}
	return res, nil
}

// pct returns the p-th percentile (0..100) of ds, nearest rank.
func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p/100*float64(len(s))+0.5) - 1
	i = max(0, min(i, len(s)-1))
	return s[i]
}

func median(ds []time.Duration) time.Duration { return pct(ds, 50) }

func maxOf(ds []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}

// measureSteps runs a workflow of 0 steps and one of p.steps steps, p.stepReps times
// each, alternating; run reports the time from start to result and the round trips of
// one run. The per-step figures are the differences of the medians divided by p.steps,
// so what a run costs whatever its steps (start, claim, finish, wait) cancels out.
func measureSteps(p params, run func(long bool) (time.Duration, int64, error)) (*stepResult, error) {
	var ts, tl []time.Duration
	var rs, rl []time.Duration // round trips, kept as durations to reuse median
	for range p.stepReps {
		for _, long := range []bool{false, true} {
			d, rt, err := run(long)
			if err != nil {
				return nil, err
			}
			if long {
				tl, rl = append(tl, d), append(rl, time.Duration(rt))
			} else {
				ts, rs = append(ts, d), append(rs, time.Duration(rt))
			}
		}
	}
	k := float64(p.steps)
	return &stepResult{
		perStep:   time.Duration(float64(median(tl)-median(ts)) / k),
		rtPerStep: float64(median(rl)-median(rs)) / k,
	}, nil
}

// measureIdle lets a started system settle, then counts the round trips of its traced
// pools over d.
func measureIdle(ctx context.Context, rt *counter, d time.Duration) (*idleResult, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(2 * time.Second):
	}
	n0 := rt.load()
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(d):
	}
	return &idleResult{statements: rt.load() - n0, d: time.Since(t0)}, nil
}

// countDone counts finished calls from many goroutines.
type countDone struct{ n atomic.Int64 }

func (c *countDone) add()     { c.n.Add(1) }
func (c *countDone) get() int { return int(c.n.Load()) }

// openLoop runs starters goroutines that each call start (start a run, do not wait
// for it) again and again for d, and returns how many runs they started.
func openLoop(ctx context.Context, starters int, d time.Duration, start func(seq int64) error) (int, error) {
	var seq atomic.Int64
	var first error
	var once sync.Once
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for range starters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && time.Now().Before(end) {
				if err := start(seq.Add(1)); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return int(seq.Load()), first
}
