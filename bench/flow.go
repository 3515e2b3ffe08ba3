package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/kagzi/kagzi"
)

// The flow-control workloads (-workloads flow), Kagzi only: the 1-step burn-down with
// no limit, with a type concurrency limit equal to the worker's slots, with 1,000
// concurrency keys at limit 1 and with a rate limit above the achievable rate, each
// against the unlimited one of the same run; and key fairness: the start → result
// times of key B's runs while key A's backlog drains, against the same without it.

// flowModes are the burn-downs of the flow workload, unlimited first.
var flowModes = []struct{ key, label string }{
	{"flownone", "no limit"},
	{"flowtype", "type concurrency limit = slots"},
	{"flowkeys", "1,000 concurrency keys, key limit 1"},
	{"flowrate", "rate limit 1,000,000/s (above the achievable rate)"},
}

// flowRunner is a system that runs the flow workloads.
type flowRunner interface {
	flowBurn(ctx context.Context, mode string) (*burnResult, error)
	fairness(ctx context.Context, backlog bool) (wait, result []time.Duration, err error)
}

func flowFigures() []figure {
	fs := []figure{}
	for _, m := range flowModes {
		fs = append(fs, figure{m.key, "flow control: 1-step runs/s, " + m.label, true, 0})
		if m.key != "flownone" {
			fs = append(fs, figure{m.key + "x", "  × the unlimited burn-down of the same run", true, 2})
		}
		fs = append(fs, figure{m.key + "rt", "  DB round trips per run (create + execute)", false, 2})
	}
	return append(fs,
		figure{"fair99", "fairness: key B's 100 runs (one per 20 ms), wait (start → first step) p99 alone, ms", false, 2},
		figure{"fairload99", "  the same while key A's backlog of 100,000 drains, ms", false, 2},
		figure{"fairx", "  × alone (target ≤ 2)", false, 2},
		figure{"fairres99", "  start → result p99 alone, ms", false, 2},
		figure{"fairresload99", "  start → result p99 while A's backlog drains (its ends are batched with A's), ms", false, 2},
	)
}

// runFlow runs the flow workloads of a variant.
func runFlow(ctx context.Context, r runner, p params, res *results, col string, say func(string, ...any)) {
	fr, ok := r.(flowRunner)
	if !ok {
		return
	}
	// Rounds alternate the modes (none, type, keys, rate, none, ...), so that a moment of
	// the box weighs on every mode alike; each mode's median is reported.
	reps := map[string][]*burnResult{}
	for round := range p.burnReps {
		for _, m := range flowModes {
			if !p.flowModes[m.key] {
				continue
			}
			say("flow: burn-down of %d 1-step runs, %s (round %d of %d)", p.n, m.label, round+1, p.burnReps)
			b, err := fr.flowBurn(ctx, m.key)
			if err != nil {
				res.fail(col, m.key, err)
				say("  %v", err)
				continue
			}
			say("  %d done in %s: %.0f/s, %.2f round trips per run", b.done, b.elapsed.Round(time.Millisecond),
				float64(b.done)/b.elapsed.Seconds(), float64(b.rtInsert+b.rtRun)/float64(max(b.done, 1)))
			reps[m.key] = append(reps[m.key], b)
		}
	}
	rates := map[string]float64{}
	for _, m := range flowModes {
		rs := reps[m.key]
		if len(rs) == 0 {
			continue
		}
		sort.Slice(rs, func(i, j int) bool {
			return float64(rs[i].done)/rs[i].elapsed.Seconds() < float64(rs[j].done)/rs[j].elapsed.Seconds()
		})
		b := rs[len(rs)/2]
		rates[m.key] = float64(b.done) / b.elapsed.Seconds()
		res.set(col, m.key, rates[m.key], fmt.Sprintf("median of %d (%.0f-%.0f/s)", len(rs),
			float64(rs[0].done)/rs[0].elapsed.Seconds(), float64(rs[len(rs)-1].done)/rs[len(rs)-1].elapsed.Seconds()))
		res.set(col, m.key+"rt", float64(b.rtInsert+b.rtRun)/float64(max(b.done, 1)), "")
		if m.key != "flownone" && rates["flownone"] > 0 {
			res.set(col, m.key+"x", rates[m.key]/rates["flownone"], "")
		}
	}
	if !p.flowModes["fair"] {
		return
	}
	say("fairness: 100 runs of key B alone")
	alone, aloneRes, err := fr.fairness(ctx, false)
	if err != nil {
		res.fail(col, "fair99", err)
		return
	}
	say("fairness: 100 runs of key B while key A's backlog of 100,000 drains")
	loaded, loadedRes, err := fr.fairness(ctx, true)
	if err != nil {
		res.fail(col, "fairload99", err)
		return
	}
	say("  start → first step: alone p50 %s p99 %s; with the backlog p50 %s p99 %s", ms(median(alone)), ms(pct(alone, 99)),
		ms(median(loaded)), ms(pct(loaded, 99)))
	say("  start → result: alone p50 %s p99 %s; with the backlog p50 %s p99 %s", ms(median(aloneRes)), ms(pct(aloneRes, 99)),
		ms(median(loadedRes)), ms(pct(loadedRes, 99)))
	res.set(col, "fair99", msf(pct(alone, 99)), fmt.Sprintf("p50 %.2f ms", msf(median(alone))))
	res.set(col, "fairload99", msf(pct(loaded, 99)), fmt.Sprintf("p50 %.2f ms", msf(median(loaded))))
	res.set(col, "fairx", msf(pct(loaded, 99))/msf(pct(alone, 99)), "")
	res.set(col, "fairres99", msf(pct(aloneRes, 99)), fmt.Sprintf("p50 %.2f ms", msf(median(aloneRes))))
	res.set(col, "fairresload99", msf(pct(loadedRes, 99)), fmt.Sprintf("p50 %.2f ms", msf(median(loadedRes))))
}

// flowBurn is burnDown of 1-step runs under the limits of mode.
func (r *kagziRunner) flowBurn(ctx context.Context, mode string) (*burnResult, error) {
	c, ns, err := r.client()
	if err != nil {
		return nil, err
	}
	wf := kagziSteps("flow", 1, nil)
	switch mode {
	case "flowtype":
		_, err = c.SetLimits(ctx, kagzi.Limits{WorkflowType: "flow", Concurrency: r.p.slots})
	case "flowkeys":
		_, err = c.SetLimits(ctx, kagzi.Limits{WorkflowType: "flow", KeyConcurrency: 1})
	case "flowrate":
		_, err = c.SetLimits(ctx, kagzi.Limits{WorkflowType: "flow", Rate: kagzi.MaxLimit, RatePeriod: time.Second})
	}
	if err != nil {
		return nil, err
	}
	c0 := time.Now()
	rt0 := r.rt.load()
	const keys = 1000
	for i := 0; i < r.p.n; {
		var opts []kagzi.StartOption
		size := 1000
		if mode == "flowkeys" {
			size = max(r.p.n/keys, 1)
			opts = append(opts, kagzi.WithConcurrencyKey(fmt.Sprintf("key-%04d", i/size%keys)))
		}
		in := make([]int64, 0, size)
		for j := i; j < min(i+size, r.p.n); j++ {
			in = append(in, int64(j))
		}
		if _, err := kagzi.StartMany(ctx, c, wf, in, opts...); err != nil {
			return nil, err
		}
		i += len(in)
	}
	rt1 := r.rt.load()
	created := time.Since(c0)
	w, err := kagzi.NewWorker(c, r.workerConfig(r.p.slots), wf)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	stop := runWorker(ctx, w)
	_, err = waitUntil(ctx, r.obs, 10*time.Millisecond, t0.Add(r.p.burnTimeout), kagziUnfinished, ns)
	elapsed := time.Since(t0)
	rt2 := r.rt.load()
	stop()
	if err != nil {
		return nil, err
	}
	done, err := count(ctx, r.obs, kagziCompleted, ns)
	if err != nil {
		return nil, err
	}
	return &burnResult{n: r.p.n, done: int(done), elapsed: elapsed, created: created, rtInsert: rt1 - rt0, rtRun: rt2 - rt1,
		how: "StartMany, then one worker"}, nil
}

// fairness starts 100 runs of key B, one every 20 ms, with the worker running, and
// returns each one's wait (start → its first step begins) and start → result; with
// backlog, key A's 100,000 runs were started first, and are still draining while B's
// run.
func (r *kagziRunner) fairness(ctx context.Context, backlog bool) (wait, result []time.Duration, err error) {
	c, ns, err := r.client()
	if err != nil {
		return nil, nil, err
	}
	var first stamps
	wf := kagziSteps("fair", 1, func(in int64) {
		if in >= 0 {
			first.mark(in)
		}
	})
	const backlogRuns = 100_000
	if backlog {
		for i := 0; i < backlogRuns; i += 1000 {
			in := make([]int64, 1000)
			for j := range in {
				in[j] = -1
			}
			if _, err := kagzi.StartMany(ctx, c, wf, in, kagzi.WithConcurrencyKey("tenant-a")); err != nil {
				return nil, nil, err
			}
		}
	}
	w, err := kagzi.NewWorker(c, r.workerConfig(r.p.slots), wf)
	if err != nil {
		return nil, nil, err
	}
	stop := runWorker(ctx, w)
	defer stop()
	// B's runs are started by a client of their own (same namespace), as by another
	// process: they go through the claim, never claimed by their start (eager start).
	starter, err := kagzi.NewClient(r.pool, kagzi.Config{Namespace: ns, Logger: r.logger})
	if err != nil {
		return nil, nil, err
	}
	r.clients = append(r.clients, starter)
	time.Sleep(500 * time.Millisecond) // the worker is up, and busy with A's backlog
	var waits, results durations
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i := range 100 {
		time.Sleep(20 * time.Millisecond)
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			run, err := kagzi.Start(ctx, starter, wf, int64(i), kagzi.WithConcurrencyKey("tenant-b"))
			if err == nil {
				_, err = run.Wait(ctx)
			}
			if err != nil {
				errs <- err
				return
			}
			results.add(time.Since(t0))
			if f, ok := first.get(int64(i)); ok {
				waits.add(f.Sub(t0))
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, nil, err
	}
	if backlog {
		left, err := count(ctx, r.obs, `SELECT count(*) FROM kagzi.runs WHERE namespace = $1 AND status = 'PENDING'`, ns)
		if err != nil {
			return nil, nil, err
		}
		fmt.Fprintf(os.Stderr, "  key A's backlog still held %d pending runs when B's last run completed\n", left)
		if left == 0 {
			return nil, nil, fmt.Errorf("key A's backlog drained before B's runs were done: no contention measured")
		}
	}
	return waits.all(), results.all(), nil
}
