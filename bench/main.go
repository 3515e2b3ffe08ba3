// Command bench runs the same workloads through Kagzi, DBOS Transact Go and River on
// one PostgreSQL server, one system after the other, and prints a table of figures and
// of ratios Kagzi / peer. See README.md beside this file.
//
//	cd bench && go run . [flags]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"runtime/pprof"
	"sort"
	"strings"
	"time"
)

func main() {
	var (
		quick     = flag.Bool("quick", false, "small sizes: the whole run in about three minutes")
		n         = flag.Int("n", 5000, "runs per burn-down")
		burnTO    = flag.Duration("burn-timeout", 20*time.Second, "a burn-down still going after this reports its rate so far")
		burnReps  = flag.Int("burn-reps", 3, "burn-downs per figure, the median reported (one that times out is not repeated)")
		starters  = flag.Int("starters", 16, "concurrent starters in the steady-state workload")
		steadyFor = flag.Duration("steady", 5*time.Second, "steady-state window")
		samples   = flag.Int("latency", 300, "sequential single runs in the latency workload")
		budget    = flag.Duration("latency-budget", 12*time.Second, "most time spent on the latency samples of one system variant")
		sleepers  = flag.Int("sleepers", 200, "runs in the sleep workload")
		sleepSl   = flag.Int("sleep-slots", 64, "execution slots in the sleep workload")
		archAfter = flag.Duration("archive-after", 0, "Kagzi: Config.ArchiveAfter, how long finished runs stay live before they move into the history (0: the default, 15m; 1ms archives during the workloads)")
		pruneIvl  = flag.Duration("prune-interval", 0, "Kagzi: WorkerConfig.PruneInterval, how often workers archive (0: the default, 1m)")
		sleep     = flag.Duration("sleep", time.Second, "how long each sleeper sleeps")
		steps     = flag.Int("steps", 200, "steps of the long workflow in the per-step workload")
		stepReps  = flag.Int("step-reps", 5, "repetitions of the per-step workload (medians)")
		idleFor   = flag.Duration("idle", 10*time.Second, "idle window")
		slots     = flag.Int("slots", 100, "execution slots: Kagzi MaxConcurrent, DBOS worker concurrency, River MaxWorkers (the tuned-2000 River variant keeps 2000)")
		conns     = flag.Int("conns", 20, "max connections of each pool")
		systems   = flag.String("systems", "kagzi,dbos,river", "systems to run, comma-separated")
		columns   = flag.String("columns", "", "run only the system variants whose column name matches this regular expression (e.g. \"Kagzi|tuned, 100\")")
		workloads = flag.String("workloads", "burn1,burn3,open,steady,latency,sleep,steps,idle", "workloads to run, comma-separated")
		verbose   = flag.Bool("v", false, "log the systems' warnings")
		sqlTop    = flag.Int("sql", 0, "print the N statements of each system variant that took the most time (to stderr)")
		cpuprof   = flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
		memprof   = flag.String("memprofile", "", "write an allocation profile of the whole run to this file (go tool pprof -sample_index=alloc_space)")
		flowParts = flag.String("flow", "flownone,flowtype,flowkeys,flowrate,fair", "the parts of the flow workload, comma-separated")
		vac       vacuumParams
	)
	flag.IntVar(&vac.rate, "vacuum-rate", 1000, "vacuum workload: runs (jobs) started per second, open loop")
	flag.StringVar(&vac.pin, "vacuum-kind", "idle", "vacuum workload: what pins the xmin horizon: idle (an idle-in-transaction session holding an XID) or rr (four REPEATABLE READ readers scanning the tables)")
	flag.DurationVar(&vac.before, "vacuum-before", time.Minute, "vacuum workload: baseline before the pin")
	flag.DurationVar(&vac.pinFor, "vacuum-pin", 10*time.Minute, "vacuum workload: how long the horizon is pinned")
	flag.DurationVar(&vac.aft, "vacuum-after", 2*time.Minute, "vacuum workload: how long the load runs on after the pin is released")
	flag.DurationVar(&vac.window, "vacuum-window", 10*time.Second, "vacuum workload: window of the live figures and database samples")
	flag.DurationVar(&vac.bucket, "vacuum-bucket", time.Minute, "vacuum workload: the report's rows aggregate the windows of this long")
	flag.DurationVar(&vac.every, "vacuum-every", 15*time.Second, "vacuum workload: VACUUM the system's tables this often, as autovacuum would (0: never)")
	flag.DurationVar(&vac.rrScan, "vacuum-rr-scan", 20*time.Second, "vacuum workload: each REPEATABLE READ reader scans the tables this often")
	flag.BoolVar(&vac.eager, "vacuum-eager", false, "vacuum workload: Kagzi starts from the worker's client (eager starts) instead of a client of its own")
	flag.StringVar(&vac.flow, "vacuum-flow", "", "vacuum workload: Kagzi's runs under a limit: type (a concurrency limit of the type equal to the slots) or keys (each run with one of -vacuum-keys concurrency keys, key limit 1); empty: none")
	flag.IntVar(&vac.keys, "vacuum-keys", 1000, "vacuum workload: concurrency keys with -vacuum-flow keys")
	flag.StringVar(&vac.explain, "vacuum-explain", "", "vacuum workload: append the plans of the claim's nested statements (auto_explain, ANALYZE, BUFFERS) at each row's end to this file")
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	p := params{
		n: *n, burnTimeout: *burnTO, burnReps: max(*burnReps, 1), starters: *starters, steadyFor: *steadyFor,
		latencySamples: *samples, latencyBudget: *budget,
		sleepers: *sleepers, sleepSlots: *sleepSl, sleep: *sleep, sleepTimeout: 60 * time.Second,
		steps: *steps, stepReps: *stepReps, idleFor: *idleFor, slots: *slots, conns: int32(*conns),
		sqlStats: *sqlTop > 0, flowModes: map[string]bool{}, vac: vac,
		archiveAfter: *archAfter, pruneInterval: *pruneIvl,
	}
	for _, m := range strings.Split(*flowParts, ",") {
		p.flowModes[strings.TrimSpace(m)] = true
	}
	if *cpuprof != "" {
		f, err := os.Create(*cpuprof)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if *memprof != "" {
		defer func() {
			f, err := os.Create(*memprof)
			if err == nil {
				err = pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		}()
	}
	if *quick {
		// Quick sizes, unless a flag says otherwise.
		q := map[string]func(){
			"n":              func() { p.n = 1000 },
			"burn-timeout":   func() { p.burnTimeout = 15 * time.Second },
			"burn-reps":      func() { p.burnReps = 1 },
			"steady":         func() { p.steadyFor = 3 * time.Second },
			"latency":        func() { p.latencySamples = 100 },
			"latency-budget": func() { p.latencyBudget = 8 * time.Second },
			"steps":          func() { p.steps = 100 },
			"step-reps":      func() { p.stepReps = 3 },
			"idle":           func() { p.idleFor = 5 * time.Second },
		}
		for name, f := range q {
			if !set[name] {
				f()
			}
		}
	}
	level := slog.LevelError
	if *verbose {
		level = slog.LevelWarn
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	wl := map[string]bool{}
	for _, w := range strings.Split(*workloads, ",") {
		wl[strings.TrimSpace(w)] = true
	}
	sys := map[string]bool{}
	for _, s := range strings.Split(*systems, ",") {
		sys[strings.TrimSpace(s)] = true
	}

	columnRE, err := regexp.Compile(*columns)
	if err != nil {
		fmt.Fprintf(os.Stderr, "-columns: %v\n", err)
		os.Exit(2)
	}
	res := newResults()
	started := time.Now()
	res.loadBefore = loadavg()
	for _, v := range variants(p, logger) {
		if !sys[v.system] || !columnRE.MatchString(v.col) {
			continue
		}
		res.cols = append(res.cols, v.col)
		res.desc = append(res.desc, v.col+": "+v.desc)
		if err := runVariant(ctx, v, p, wl, res, *sqlTop); err != nil {
			fmt.Fprintf(os.Stderr, "[%s] %v\n", v.col, err)
			if ctx.Err() != nil {
				os.Exit(1)
			}
		}
	}
	res.loadAfter = loadavg()
	res.took = time.Since(started)
	fmt.Fprintf(os.Stderr, "all done in %s\n", res.took.Round(time.Second))
	printReport(ctx, os.Stdout, p, res)
}

// variant is one system with one configuration: a column of the table.
type variant struct {
	col    string
	system string
	desc   string // its settings, for the report
	make   func(ctx context.Context) (runner, error)
}

func variants(p params, logger *slog.Logger) []variant {
	river := func(s riverSettings) variant {
		desc := fmt.Sprintf("one client inserts and works one queue with MaxWorkers %d; FetchCooldown %s, FetchPollInterval %s; completed-job events", s.workers,
			orDefault(s.fetchCooldown, "100ms (default)"), orDefault(s.fetchPoll, "1s (default)"))
		return variant{col: s.label, system: "river", desc: desc, make: func(ctx context.Context) (runner, error) {
			return newRiverRunner(ctx, p, s, logger)
		}}
	}
	dbos := func(s dbosSettings) variant {
		desc := "RunWorkflow without a queue; GetResult waits in process"
		if s.queued {
			desc = fmt.Sprintf("RegisterQueue with WithWorkerConcurrency(%d), polling %s; GetResult polls every %s", p.slots,
				orDefault(s.poll, "1s (default)"), orDefault(s.handlePoll, "1s (default)"))
		}
		return variant{col: s.label, system: "dbos", desc: desc, make: func(ctx context.Context) (runner, error) {
			return newDBOSRunner(ctx, p, s, logger)
		}}
	}
	return []variant{
		{col: colKagzi, system: "kagzi", desc: fmt.Sprintf("WorkerConfig{MaxConcurrent: %d}, the rest at defaults "+
			"(LeaseDuration 10s, HeartbeatInterval lease/3, PollInterval 5s, MaxInProcessSleep 200ms); one client starts "+
			"runs (StartMany for the burn-downs), waits with Run.Wait and runs the Worker", p.slots), make: func(ctx context.Context) (runner, error) {
			return newKagziRunner(ctx, p, logger)
		}},
		dbos(dbosSettings{label: "DBOS direct"}),
		dbos(dbosSettings{label: "DBOS queue, defaults", queued: true}),
		dbos(dbosSettings{label: "DBOS queue, 20 ms poll", queued: true, poll: 20 * time.Millisecond, handlePoll: 20 * time.Millisecond}),
		river(riverSettings{label: "River defaults", workers: p.slots}),
		river(riverSettings{label: fmt.Sprintf("River tuned, %d", p.slots), fetchCooldown: 2 * time.Millisecond, fetchPoll: 20 * time.Millisecond, workers: p.slots}),
		river(riverSettings{label: "River tuned, 2000", fetchCooldown: 2 * time.Millisecond, fetchPoll: 20 * time.Millisecond, workers: 2000, burnOnly: true}),
	}
}

const colKagzi = "Kagzi"

func runVariant(ctx context.Context, v variant, p params, wl map[string]bool, res *results, sqlTop int) (err error) {
	say := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "[%s] %s\n", v.col, fmt.Sprintf(format, a...))
	}
	say("setting up")
	t0 := time.Now()
	defer func() { say("done in %s", time.Since(t0).Round(time.Second)) }()
	r, err := v.make(ctx)
	if r != nil {
		defer r.close()
	}
	if err != nil {
		return err
	}
	if sqlTop > 0 {
		defer func() { r.counter().stats.print(os.Stderr, v.col, sqlTop) }()
	}
	skip := func(what string, err error) bool {
		if errors.Is(err, errNA) {
			return true
		}
		if err != nil {
			say("%s: %v", what, err)
			res.fail(v.col, what, err)
			return true
		}
		return false
	}
	for _, steps := range []int{1, 3} {
		key := fmt.Sprintf("burn%d", steps)
		if !wl[key] {
			continue
		}
		var reps []*burnResult
		var err error
		for len(reps) < p.burnReps {
			say("burn-down of %d %d-step runs (%d of %d)", p.n, steps, len(reps)+1, p.burnReps)
			var b *burnResult
			if b, err = r.burnDown(ctx, steps); err != nil {
				break
			}
			rate := float64(b.done) / b.elapsed.Seconds()
			if b.created > 0 {
				say("  created in %s (%.0f/s)", b.created.Round(time.Millisecond), float64(b.n)/b.created.Seconds())
			}
			say("  %d done in %s: %.0f/s, %.2f round trips per run (%d to create, %d to execute) [%s]; WAL %s..%s, database oid %d, load %s",
				b.done, b.elapsed.Round(time.Millisecond), rate, float64(b.rtInsert+b.rtRun)/float64(max(b.done, 1)), b.rtInsert, b.rtRun, b.how,
				b.lsn0, b.lsn1, b.dbOID, loadavg())
			reps = append(reps, b)
			if b.done < b.n {
				break // timed out: another would too, and take as long
			}
		}
		if skip(key, err) {
			continue
		}
		// The median rate of the burn-downs: one figure less exposed to the box's
		// moment than a single run.
		sort.Slice(reps, func(i, j int) bool {
			return float64(reps[i].done)/reps[i].elapsed.Seconds() < float64(reps[j].done)/reps[j].elapsed.Seconds()
		})
		b := reps[len(reps)/2]
		rate := float64(b.done) / b.elapsed.Seconds()
		note := b.how
		if len(reps) > 1 {
			note += fmt.Sprintf("; median of %d burn-downs (%.0f-%.0f/s)", len(reps),
				float64(reps[0].done)/reps[0].elapsed.Seconds(), float64(reps[len(reps)-1].done)/reps[len(reps)-1].elapsed.Seconds())
		}
		if b.done < b.n {
			note += fmt.Sprintf("; stopped after %s with %d of %d done: rate = done / time", b.elapsed.Round(time.Millisecond), b.done, b.n)
		}
		res.set(v.col, key, rate, note)
		res.set(v.col, key+"rt", float64(b.rtInsert+b.rtRun)/float64(max(b.done, 1)), "")
	}
	if wl["steady"] {
		say("closed loop: %d starters each starting a run and waiting for its result, for %s", p.starters, p.steadyFor)
		s, err := r.steady(ctx)
		if !skip("steady", err) {
			rate := float64(s.done) / s.elapsed.Seconds()
			say("  %d completed: %.0f/s, start → result p50 %s p99 %s", s.done, rate, ms(median(s.lat)), ms(pct(s.lat, 99)))
			res.set(v.col, "steady", rate, "")
			res.set(v.col, "steady50", msf(median(s.lat)), "")
			res.set(v.col, "steady99", msf(pct(s.lat, 99)), "")
		}
	}
	if wl["open"] {
		say("open loop: %d starters starting runs back to back for %s", p.starters, p.steadyFor)
		o, err := r.open(ctx)
		if !skip("open", err) {
			say("  %d started (%.0f/s), %d completed (%.0f/s) within the window", o.started, float64(o.started)/o.elapsed.Seconds(),
				o.completed, float64(o.completed)/o.elapsed.Seconds())
			res.set(v.col, "opendone", float64(o.completed)/o.elapsed.Seconds(), "")
			res.set(v.col, "openstart", float64(o.started)/o.elapsed.Seconds(), "")
		}
	}
	if wl["latency"] {
		say("latency: up to %d sequential runs, at most %s", p.latencySamples, p.latencyBudget)
		l, err := r.latency(ctx)
		if !skip("latency", err) {
			note := ""
			if len(l.result) < p.latencySamples {
				note = fmt.Sprintf("%d samples (time budget %s)", len(l.result), p.latencyBudget)
			}
			say("  %d samples: first step p50 %s p99 %s max %s; result p50 %s p99 %s max %s", len(l.result),
				ms(median(l.first)), ms(pct(l.first, 99)), ms(maxOf(l.first)), ms(median(l.result)), ms(pct(l.result, 99)), ms(maxOf(l.result)))
			res.set(v.col, "first50", msf(median(l.first)), note)
			res.set(v.col, "first99", msf(pct(l.first, 99)), "")
			res.set(v.col, "firstmax", msf(maxOf(l.first)), "")
			res.set(v.col, "result50", msf(median(l.result)), note)
			res.set(v.col, "result99", msf(pct(l.result, 99)), "")
			res.set(v.col, "resultmax", msf(maxOf(l.result)), "")
		}
	}
	if wl["sleep"] {
		say("sleep: %d runs sleeping %s with %d slots", p.sleepers, p.sleep, p.sleepSlots)
		s, err := r.sleepers(ctx)
		if !skip("sleep", err) {
			note := ""
			if s.done < s.runs {
				note = fmt.Sprintf("only %d of %d done after %s", s.done, s.runs, s.allDone.Round(time.Millisecond))
			}
			say("  all done after %s; wake lag p50 %s p99 %s (%d lags) %s", s.allDone.Round(time.Millisecond), ms(median(s.lags)), ms(pct(s.lags, 99)), len(s.lags), note)
			res.set(v.col, "sleepall", s.allDone.Seconds(), note)
			res.set(v.col, "lag50", msf(median(s.lags)), "")
			res.set(v.col, "lag99", msf(pct(s.lags, 99)), "")
		}
	}
	if wl["steps"] {
		say("per-step cost: workflows of 0 and %d steps, %d times each", p.steps, p.stepReps)
		s, err := r.stepCost(ctx)
		if !skip("steps", err) {
			say("  %.3f ms and %.2f round trips per step", msf(s.perStep), s.rtPerStep)
			res.set(v.col, "steprt", s.rtPerStep, "")
			res.set(v.col, "stepms", msf(s.perStep), "")
		}
	}
	if wl["flow"] {
		runFlow(ctx, r, p, res, v.col, say)
	}
	if wl["vacuum"] {
		vp := p.vac
		say("vacuum: %d runs/s; %s before, pin %s for %s, %s after", vp.rate, vp.before, vp.pin, vp.pinFor, vp.aft)
		vr, err := r.vacuum(ctx)
		if !skip("vacuum", err) {
			res.sections = append(res.sections, vacuumMarkdown(v.col, vr))
		}
	}
	if wl["idle"] {
		say("idle: counting statements for %s with nothing to do", p.idleFor)
		s, err := r.idle(ctx)
		if !skip("idle", err) {
			rate := float64(s.statements) / s.d.Seconds()
			say("  %d statements in %s: %.2f/s", s.statements, s.d.Round(time.Millisecond), rate)
			res.set(v.col, "idle", rate, "")
		}
	}
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", msf(d)) }

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func orDefault(d time.Duration, def string) string {
	if d == 0 {
		return def
	}
	return d.String()
}
