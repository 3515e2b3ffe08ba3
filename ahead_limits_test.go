package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi"
)

// blockClaimHooks blocks one claim in its Claim hook, when armed: one of the claim
// loop's, or, with eager, one eager start's (between its insert's commit and its run's
// start), until free.
type blockClaimHooks struct {
	kagzi.NopHooks
	eager   bool
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newBlockClaimHooks(eager bool) *blockClaimHooks {
	return &blockClaimHooks{eager: eager, entered: make(chan struct{}), release: make(chan struct{})}
}

func (h *blockClaimHooks) Claim(_ context.Context, e *kagzi.ClaimEvent) {
	if e.Eager != h.eager || !h.armed.CompareAndSwap(true, false) {
		return
	}
	close(h.entered)
	<-h.release
}

func (h *blockClaimHooks) free() { h.once.Do(func() { close(h.release) }) }

// probeWorker runs a worker of a new limitProbe workflow of typ (runAheadWorker) on a
// client of its own with hooks h; the test's end opens the probe's gates, frees h and
// stops the worker.
func probeWorker(t *testing.T, e *env, typ string, cfg kagzi.WorkerConfig, h *blockClaimHooks) (*kagzi.Client,
	*limitProbe, *kagzi.Workflow[int, int], *kagzi.Worker) {
	t.Helper()
	wc, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Hooks: h})
	if err != nil {
		t.Fatal(err)
	}
	p, wf := newLimitProbe(typ)
	w, stop := runAheadWorker(t, wc, cfg, wf)
	t.Cleanup(func() {
		h.free()
		for n := range p.gates {
			p.open(n)
		}
		stop()
	})
	return wc, p, wf, w
}

type limitProbe struct {
	executing, beganAfter, overAfter atomic.Int64
	limitSet                         atomic.Bool
	gates                            map[int]chan struct{}
}

func newLimitProbe(typ string) (*limitProbe, *kagzi.Workflow[int, int]) {
	p := &limitProbe{gates: map[int]chan struct{}{1: make(chan struct{}), 2: make(chan struct{}), 3: make(chan struct{})}}
	wf := kagzi.Define(typ, func(ctx *kagzi.Context, n int) (int, error) {
		now := p.executing.Add(1)
		defer p.executing.Add(-1)
		if p.limitSet.Load() {
			p.beganAfter.Add(1)
			if now > 1 {
				p.overAfter.Add(1)
			}
		}
		if g := p.gates[n]; g != nil {
			select {
			case <-g:
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
		time.Sleep(20 * time.Millisecond)
		return n, nil
	})
	return p, wf
}

// runAheadWorker runs a worker of wfs with cfg on c whose runs ahead wait for a slot an
// hour (nothing but what a test does sends them back); stop ends it.
func runAheadWorker(t *testing.T, c *kagzi.Client, cfg kagzi.WorkerConfig, wfs ...kagzi.Definition) (w *kagzi.Worker, stop func()) {
	t.Helper()
	cfg.DrainTimeout = time.Hour
	w, err := kagzi.NewWorker(c, cfg, wfs...)
	if err != nil {
		t.Fatal(err)
	}
	kagzi.SetAheadHold(w, time.Hour)
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Run(wctx); close(done) }()
	return w, func() { cancel(); <-done }
}

func (p *limitProbe) open(n int) {
	select {
	case <-p.gates[n]:
	default:
		close(p.gates[n])
	}
}

// TestRunsWaitingAheadGoBackWhenTheLimitsNotificationIsDropped: the worker's
// subscription overflows (Missed) while its loop is in a claim and another process sets
// the type's limits, so the notification that says so is dropped: the loop reads which
// types have limits before its next claim and hands their runs ahead back, which would
// otherwise start under the limit uncounted (found in review: 5 of 5).
func TestRunsWaitingAheadGoBackWhenTheLimitsNotificationIsDropped(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	h := newBlockClaimHooks(false)
	typ := "ahead-limits-missed"
	cfg := fastWorker()
	cfg.MaxConcurrent = 3
	wc, p, wf, w := probeWorker(t, e, typ, cfg, h)
	for _, n := range []int{1, 2} {
		if _, err := kagzi.Start(ctx, wc, wf, n); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "both blocking runs to execute", func() bool { return p.executing.Load() == 2 })
	time.Sleep(100 * time.Millisecond)
	// The loop claims for its free slot, and stays in that claim (a slow claim).
	h.armed.Store(true)
	kagzi.AnnounceRunsInProcess(wc, typ, 1)
	select {
	case <-h.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the claim loop did not claim")
	}
	if _, err := kagzi.Start(ctx, wc, wf, 3); err != nil {
		t.Fatal(err)
	}
	// (started eagerly in the free slot, or by the claim below)
	time.Sleep(5 * time.Millisecond)
	if _, err := kagzi.StartMany(ctx, wc, wf, []int{0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	if ids, err := kagzi.ClaimAhead(ctx, w, 4); err != nil || kagzi.RunsAhead(w) != 3 {
		t.Fatalf("claim ahead: %v %v, %d ahead", ids, err, kagzi.RunsAhead(w))
	}
	eventually(t, "run 3 to execute", func() bool { return p.executing.Load() == 3 })
	// More notifications than the subscription holds arrive while the loop claims.
	kagzi.AnnounceRunsInProcess(wc, typ, 100)
	setter := newClient(t, e.pool, "")
	if _, err := setter.SetLimits(ctx, kagzi.Limits{WorkflowType: typ, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the listener delivers (drops) the notification
	h.free()
	time.Sleep(500 * time.Millisecond) // the loop handles what it got, and Missed
	ahead := kagzi.RunsAhead(w)
	p.limitSet.Store(true)
	p.open(1) // a slot frees; runs 2 and 3 still execute, over the limit of 1
	time.Sleep(500 * time.Millisecond)
	if ahead != 0 || p.beganAfter.Load() > 0 {
		t.Errorf("%d runs still waited ahead after the limits were set (notification dropped); %d began after, %d beside another run",
			ahead, p.beganAfter.Load(), p.overAfter.Load())
	}
}

// stepClaimHooks blocks each claim of the loop, when armed, until released.
type stepClaimHooks struct {
	kagzi.NopHooks
	armed   atomic.Bool
	entered chan kagzi.ClaimEvent
	release chan struct{}
}

func (h *stepClaimHooks) Claim(_ context.Context, e *kagzi.ClaimEvent) {
	if e.Eager || !h.armed.CompareAndSwap(true, false) {
		return
	}
	h.entered <- *e
	<-h.release
}

// TestAClaimOnItsWayWhenItsTypesLimitsAreSetStartsNothingUnderThem, through the
// worker's own claim loop: a claim that takes a run ahead (a slot was freed during the
// claim before) commits; SetLimits(concurrency 1) through the worker's own client
// returns; a slot frees; then the claim's answer is taken. Its runs, claimed without the
// limit, go back instead of starting beside the run executing (found in review: both
// began, 5 of 5).
func TestAClaimOnItsWayWhenItsTypesLimitsAreSetStartsNothingUnderThem(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	h := &stepClaimHooks{entered: make(chan kagzi.ClaimEvent, 1), release: make(chan struct{})}
	wc, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Hooks: h})
	if err != nil {
		t.Fatal(err)
	}
	typ := "ahead-limits-in-flight"
	p, wf := newLimitProbe(typ)
	cfg := fastWorker()
	cfg.MaxConcurrent, cfg.DisableEagerStart = 2, true
	_, stop := runAheadWorker(t, wc, cfg, wf)
	defer func() {
		h.armed.Store(false)
		close(h.release)
		for n := range p.gates {
			p.open(n)
		}
		stop()
	}()
	entered := func(what string) kagzi.ClaimEvent {
		select {
		case ev := <-h.entered:
			return ev
		case <-time.After(10 * time.Second):
			t.Fatalf("no claim: %s", what)
		}
		return kagzi.ClaimEvent{}
	}
	release := func() { h.release <- struct{}{} }
	if _, err := kagzi.Start(ctx, wc, wf, 1); err != nil { // A
		t.Fatal(err)
	}
	eventually(t, "run A to execute", func() bool { return p.executing.Load() == 1 })
	time.Sleep(200 * time.Millisecond)
	h.armed.Store(true)
	if _, err := kagzi.Start(ctx, wc, wf, 2); err != nil { // B
		t.Fatal(err)
	}
	x := entered("X") // the claim of B, in the one free slot: full
	if x.Requested != 1 || x.Claimed != 1 {
		t.Fatalf("claim X: %+v", x)
	}
	p.open(1) // A ends during X: a slot freed during a full claim
	eventually(t, "run A to end", func() bool { return p.executing.Load() == 0 })
	if _, err := kagzi.Start(ctx, wc, wf, 3); err != nil { // C
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if _, err := kagzi.Start(ctx, wc, wf, 0); err != nil { // D
		t.Fatal(err)
	}
	h.armed.Store(true)
	release()
	y := entered("Y") // one free slot, one run ahead
	if y.Requested != 2 || y.Claimed != 2 {
		t.Fatalf("claim Y: %+v (wanted a claim of one run ahead)", y)
	}
	eventually(t, "run B to execute", func() bool { return p.executing.Load() == 1 })
	if _, err := wc.SetLimits(ctx, kagzi.Limits{WorkflowType: typ, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	p.limitSet.Store(true)
	p.open(2) // B ends: a slot frees before Y's answer is taken
	eventually(t, "run B to end", func() bool { return p.executing.Load() == 0 })
	release()
	time.Sleep(500 * time.Millisecond)
	if n := p.beganAfter.Load(); n > 1 {
		t.Errorf("%d runs began after SetLimits(concurrency 1) returned while run C executed (%d beside another)", n, p.overAfter.Load())
	}
}

// TestRunsAheadHandedBackOverAndOverWhileTheyStartAndTheWorkerDrainsBeginOnce hands a
// busy worker's runs ahead back (limitsSet, as a notification does) over and over while
// they start, expire and the worker drains: every run begins once and completes (a
// second worker finishes what the first handed back at its stop).
func TestRunsAheadHandedBackOverAndOverWhileTheyStartAndTheWorkerDrainsBeginOnce(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	typ := "ahead-limits-race"
	var mu sync.Mutex
	began := map[int]int{}
	wf := kagzi.Define(typ, func(ctx *kagzi.Context, n int) (int, error) {
		mu.Lock()
		began[n]++
		mu.Unlock()
		time.Sleep(time.Millisecond)
		return n, nil
	})
	inputs := make([]int, 800)
	for i := range inputs {
		inputs[i] = i
	}
	runs, err := kagzi.StartMany(ctx, e.client, wf, inputs)
	if err != nil {
		t.Fatal(err)
	}
	cfg := fastWorker()
	cfg.MaxConcurrent, cfg.DisableEagerStart = 3, true
	hb := &handedBackHooks{}
	hc, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Hooks: hb})
	if err != nil {
		t.Fatal(err)
	}
	w, err := kagzi.NewWorker(hc, cfg, wf)
	if err != nil {
		t.Fatal(err)
	}
	kagzi.SetAheadHold(w, 5*time.Millisecond)
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Run(wctx); close(done) }()
	stopHammer := make(chan struct{})
	hammered := make(chan struct{})
	go func() {
		defer close(hammered)
		for {
			select {
			case <-stopHammer:
				return
			default:
			}
			kagzi.WorkerLimitsSet(w, typ)
			time.Sleep(200 * time.Microsecond)
		}
	}()
	time.Sleep(1500 * time.Millisecond)
	cancel() // the drain, while limitsSet still runs
	<-done
	close(stopHammer)
	<-hammered
	runWorker(t, e.client, fastWorker(), wf)
	for _, r := range runs {
		if _, err := r.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d executions handed back", hb.n.Load())
	mu.Lock()
	defer mu.Unlock()
	for n, k := range began {
		if k != 1 {
			t.Errorf("run %d began %d times", n, k)
		}
	}
}

type handedBackHooks struct {
	kagzi.NopHooks
	n atomic.Int64
}

func (h *handedBackHooks) ExecutionEnd(_ context.Context, e *kagzi.ExecutionEvent) {
	if e.Outcome == kagzi.OutcomeHandedBack {
		h.n.Add(1)
	}
}

// TestRunsWaitingAheadGoBackWhenTheirTypesLimitsAreSet sets a concurrency limit of 1, or
// a rate of 1 a minute, on a type while its worker holds runs claimed ahead (claimed
// before the limit, not started): they must not start under the limit uncounted once
// a slot frees. SetLimits from the worker's own client hands them back before it
// returns, also those of a claim whose answer was on its way; from another process's
// client, the worker does when it hears of it. (Found in review: they started beside
// the run executing, and outside the rate's window.)
func TestRunsWaitingAheadGoBackWhenTheirTypesLimitsAreSet(t *testing.T) {
	for _, c := range []struct {
		kind  string
		other bool // the limits are set through another client (another process's)
		// inFlight: the limits are set while the claim of the runs ahead is on its way
		// back (after it committed, before its runs are started).
		inFlight bool
	}{{"concurrency", false, false}, {"rate", false, false}, {"concurrency", true, false}, {"rate", false, true}} {
		name := c.kind
		if c.other {
			name += " by another client"
		}
		if c.inFlight {
			name += " while the claim is on its way"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			ctx := waitCtx(t)
			typ := "ahead-limit-" + c.kind
			p, wf := newLimitProbe(typ)
			cfg := fastWorker()
			cfg.MaxConcurrent = 2
			w, stop := runAheadWorker(t, e.client, cfg, wf)
			defer func() {
				for n := range p.gates {
					p.open(n)
				}
				stop()
			}()
			for _, n := range []int{1, 2} {
				if _, err := kagzi.Start(ctx, e.client, wf, n); err != nil {
					t.Fatal(err)
				}
			}
			eventually(t, "both blocking runs to execute", func() bool { return p.executing.Load() == 2 })
			if _, err := kagzi.StartMany(ctx, e.client, wf, []int{0, 0, 0}); err != nil {
				t.Fatal(err)
			}
			l := kagzi.Limits{WorkflowType: typ, Concurrency: 1}
			if c.kind == "rate" {
				l = kagzi.Limits{WorkflowType: typ, Rate: 1, RatePeriod: time.Minute}
			}
			setter := e.client
			if c.other {
				setter = newClient(t, e.pool, "")
			}
			set := func() {
				if _, err := setter.SetLimits(ctx, l); err != nil {
					t.Fatal(err)
				}
			}
			if c.inFlight {
				if ids, err := kagzi.ClaimAheadThen(ctx, w, 3, set); err != nil || len(ids) != 3 {
					t.Fatalf("claim ahead: %v %v", ids, err)
				}
			} else {
				if ids, err := kagzi.ClaimAhead(ctx, w, 3); err != nil || len(ids) != 3 || kagzi.RunsAhead(w) != 3 {
					t.Fatalf("claim ahead: %v %v, %d ahead", ids, err, kagzi.RunsAhead(w))
				}
				set()
			}
			if c.other {
				eventually(t, "the worker to hand its runs ahead back", func() bool { return kagzi.RunsAhead(w) == 0 })
			} else if n := kagzi.RunsAhead(w); n != 0 {
				t.Fatalf("%d runs still wait ahead after SetLimits returned", n)
			}
			p.limitSet.Store(true)
			// The blocking runs end, one then the other: what the limit lets start
			// after it, starts (the concurrency limit one run once both ended, the
			// rate one run).
			p.open(1)
			p.open(2)
			eventually(t, "a run to begin under the limit", func() bool { return p.beganAfter.Load() >= 1 })
			time.Sleep(300 * time.Millisecond)
			if n := p.overAfter.Load(); c.kind == "concurrency" && n > 0 {
				t.Errorf("%d runs began beside another run of the type after its concurrency limit of 1 was set", n)
			}
			if n := p.beganAfter.Load(); c.kind == "rate" && n > 1 {
				t.Errorf("%d runs began after a rate of 1 a minute was set", n)
			}
		})
	}
}

// heldSuspect runs a worker (MaxTakeovers 1) whose one run of a busy type executes
// until release is closed, and starts a suspect (input 1) of a type named typ, whose
// runs count began, that the worker holds meanwhile; set, when not nil, runs before
// the worker starts (limits the suspect's claim is to see).
func heldSuspect(t *testing.T, e *env, typ string, set func()) (s *kagzi.Run[int], rated *kagzi.Workflow[int, int],
	began *atomic.Int64, release chan struct{}) {
	t.Helper()
	ctx := waitCtx(t)
	release, began = make(chan struct{}), new(atomic.Int64)
	entered := make(chan struct{}, 1)
	busy := kagzi.Define(typ+"-busy", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Step(ctx, "wait", func(c context.Context) (int, error) {
			entered <- struct{}{}
			select {
			case <-release:
			case <-c.Done():
				return 0, c.Err()
			}
			return n, nil
		})
	})
	rated = kagzi.Define(typ, func(ctx *kagzi.Context, n int) (int, error) {
		began.Add(1)
		return n, nil
	})
	if set != nil {
		set()
	}
	cfg := fastWorker()
	cfg.MaxTakeovers, cfg.DisableEagerStart = 1, true
	runWorker(t, e.client, cfg, busy, rated)
	if _, err := kagzi.Start(ctx, e.client, busy, 1); err != nil {
		t.Fatal(err)
	}
	<-entered
	s = startSuspect(t, e, rated, 1, 1)
	eventually(t, "the worker to hold the suspect", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE run_id = $1 AND lease_epoch > 0
			AND status = 'RUNNING'`, s.RunID) == 1
	})
	return s, rated, began, release
}

// onlyOneBegins waits for the suspect, starts a second run of its type, and checks that
// the type's rate of 1 a minute let only one of them begin.
func onlyOneBegins(t *testing.T, e *env, s *kagzi.Run[int], rated *kagzi.Workflow[int, int], began *atomic.Int64) {
	t.Helper()
	ctx := waitCtx(t)
	if _, err := s.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := kagzi.Start(ctx, e.client, rated, 2)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if n := began.Load(); n != 1 {
		t.Errorf("%d runs of the type began within the minute of its rate of 1 (the held suspect and the second, %s)",
			n, runStatus(t, e.client, second.RunID))
	}
}

// TestAHeldSuspectGoesBackWhenItsTypesLimitsAreSet: a worker holds a suspect (a run at
// MaxTakeovers, to run alone once nothing else executes) claimed before its type had a
// rate of 1 a minute. When the rate is set, the suspect goes back and is claimed again
// under it: it starts alone once the busy run ends, and is the one start the window
// admits; a second run of its type waits. (Found in review: the held suspect started
// uncounted, and the second run started too.)
func TestAHeldSuspectGoesBackWhenItsTypesLimitsAreSet(t *testing.T) {
	e := newEnv(t)
	s, rated, began, release := heldSuspect(t, e, "held-limits", nil)
	if _, err := e.client.SetLimits(waitCtx(t), kagzi.Limits{WorkflowType: "held-limits", Rate: 1, RatePeriod: time.Minute}); err != nil {
		t.Fatal(err)
	}
	close(release)
	onlyOneBegins(t, e, s, rated, began)
}

// TestAHeldSuspectGoesBackWhenTheLimitsNotificationIsLost: as above, but the rate is set
// by another process while the worker's listener is disconnected (its backend ended,
// the database refusing connections), so the notification is lost: on reconnecting,
// the claim loop reads which types of what it holds have limits and hands the suspect
// back. (Found in review: only the runs waiting ahead were read, 3 of 3.)
func TestAHeldSuspectGoesBackWhenTheLimitsNotificationIsLost(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	s, rated, began, release := heldSuspect(t, e, "held-limits-lost", nil)
	setter := newClient(t, e.pool, "")
	// A connection of the pool's for SetLimits while the database refuses new ones.
	if _, err := setter.GetLimits(ctx, "held-limits-lost"); !errors.Is(err, kagzi.ErrNotFound) {
		t.Fatalf("limits before any were set: %v", err)
	}
	var db string
	if err := e.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	pc, err := pgx.ParseConfig(e.url)
	if err != nil {
		t.Fatal(err)
	}
	pc.Database = "postgres"
	admin, err := pgx.ConnectConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	allow := func(yes bool) {
		if _, err := admin.Exec(context.Background(), fmt.Sprintf(`ALTER DATABASE %q ALLOW_CONNECTIONS %v`, db, yes)); err != nil {
			t.Fatal(err)
		}
	}
	allow(false)
	defer allow(true)
	const listener = `datname = current_database() AND (query ILIKE 'LISTEN%' OR query ILIKE '%advisory_lock%')
		AND pid <> pg_backend_pid()`
	if n := countRows(t, e.pool, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE `+listener); n == 0 {
		t.Fatal("no listener's backend to end")
	}
	time.Sleep(50 * time.Millisecond)
	if _, err := setter.SetLimits(ctx, kagzi.Limits{WorkflowType: "held-limits-lost", Rate: 1, RatePeriod: time.Minute}); err != nil {
		t.Fatal(err)
	}
	allow(true)
	eventually(t, "the listener to reconnect", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM pg_stat_activity WHERE `+listener) > 0
	})
	time.Sleep(500 * time.Millisecond) // the loop handles the reconnect
	close(release)
	onlyOneBegins(t, e, s, rated, began)
}

// TestAHeldSuspectClaimedUnderItsLimitsKeepsItsPlaceWhenTheyAreSetAgain: a suspect
// claimed under its type's rate (counted in its window) and held is not handed back
// when the type's limits are set again, by this client or another process: it would
// have spent its window's place, and waited the rest of the minute. (Found in review:
// it did, 3 of 3.)
func TestAHeldSuspectClaimedUnderItsLimitsKeepsItsPlaceWhenTheyAreSetAgain(t *testing.T) {
	for _, other := range []bool{false, true} {
		name := "same client"
		if other {
			name = "another client"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			ctx := waitCtx(t)
			l := kagzi.Limits{WorkflowType: "held-limits-again", Rate: 1, RatePeriod: time.Minute}
			set := func(c *kagzi.Client) {
				if _, err := c.SetLimits(ctx, l); err != nil {
					t.Fatal(err)
				}
			}
			s, _, began, release := heldSuspect(t, e, l.WorkflowType, func() { set(e.client) })
			setter := e.client
			if other {
				setter = newClient(t, e.pool, "")
			}
			set(setter) // the same limits again
			time.Sleep(300 * time.Millisecond)
			close(release)
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if _, err := s.Wait(wctx); err != nil {
				t.Errorf("the suspect, claimed under its type's rate and held, did not run within 10 s of the busy run's end "+
					"after the same limits were set again (%v; status %s, %d began)", err, runStatus(t, e.client, s.RunID), began.Load())
			}
		})
	}
}

// TestAnEagerStartOnItsWayWhenItsTypesLimitsAreSetStartsNothingUnderThem: an eager start
// whose insert claimed its run without limits (its type had none) is on its way when the
// worker's own client sets a rate of 1 a minute: its run goes back to be claimed under
// the rate, as a claim's would, and one run begins in the minute, not two. (Found in
// review: two began, 3 of 3.)
func TestAnEagerStartOnItsWayWhenItsTypesLimitsAreSetStartsNothingUnderThem(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	h := newBlockClaimHooks(true)
	typ := "ahead-limits-eager"
	cfg := fastWorker()
	cfg.MaxConcurrent = 2
	wc, p, wf, _ := probeWorker(t, e, typ, cfg, h)
	if _, err := kagzi.Start(ctx, wc, wf, 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "run 1 to execute", func() bool { return p.executing.Load() == 1 })
	time.Sleep(100 * time.Millisecond)
	h.armed.Store(true)
	started := make(chan error, 1)
	go func() { _, err := kagzi.Start(ctx, wc, wf, 0); started <- err }()
	select {
	case <-h.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the start did not go eagerly")
	}
	if _, err := wc.SetLimits(ctx, kagzi.Limits{WorkflowType: typ, Rate: 1, RatePeriod: time.Minute}); err != nil {
		t.Fatal(err)
	}
	p.limitSet.Store(true)
	h.free()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := kagzi.Start(ctx, wc, wf, 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if n := p.beganAfter.Load(); n > 1 {
		t.Errorf("%d runs began after SetLimits(rate 1 a minute) returned, the eager start on its way among them", n)
	}
}

// TestAHeldSuspectOfATypeWithoutLimitsClaimedBesideALimitedTypeGoesBack: a held
// suspect of a type without limits, claimed by a claim that went the way of limits
// because another type of the worker has limits, was claimed without limits all the
// same: when its own type's rate is set while it is held, it goes back, and does not
// start alone later outside the rate's window. (Found in review: judged by the claim,
// not by its type, it stayed, 3 of 3.)
func TestAHeldSuspectOfATypeWithoutLimitsClaimedBesideALimitedTypeGoesBack(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	typ := "held-nonshort"
	s, rated, began, release := heldSuspect(t, e, typ, func() {
		// The busy type has a (generous) concurrency limit: every claim of the worker
		// takes the way of limits.
		if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: typ + "-busy", Concurrency: 10}); err != nil {
			t.Fatal(err)
		}
	})
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: typ, Rate: 1, RatePeriod: time.Minute}); err != nil {
		t.Fatal(err)
	}
	close(release)
	onlyOneBegins(t, e, s, rated, began)
}

// TestARunAheadOfATypeWithoutLimitsClaimedBesideALimitedTypeGoesBack: a run of a type
// without limits, claimed by a claim of the loop that went the way of limits (another
// type of the worker has a concurrency limit), lands ahead because an eager start took
// the free slot while the claim was on its way. When the worker's own client sets its
// type's rate, the run goes back, claimed without limits as it was, and one run begins
// in the minute, not two. (Found in review: 3 of 3.)
func TestARunAheadOfATypeWithoutLimitsClaimedBesideALimitedTypeGoesBack(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	h := &stepClaimHooks{entered: make(chan kagzi.ClaimEvent, 1), release: make(chan struct{})}
	wc, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Hooks: h})
	if err != nil {
		t.Fatal(err)
	}
	typ := "ahead-limits-beside"
	p, wf := newLimitProbe(typ)
	other := kagzi.Define(typ+"-other", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
	if _, err := wc.SetLimits(ctx, kagzi.Limits{WorkflowType: typ + "-other", Concurrency: 10}); err != nil {
		t.Fatal(err)
	}
	cfg := fastWorker()
	cfg.MaxConcurrent = 2
	w, stop := runAheadWorker(t, wc, cfg, wf, other)
	defer func() {
		h.armed.Store(false)
		select {
		case h.release <- struct{}{}:
		default:
		}
		for n := range p.gates {
			p.open(n)
		}
		stop()
	}()
	starter := newClient(t, e.pool, "")
	if _, err := kagzi.Start(ctx, wc, wf, 1); err != nil { // run 1 executes (gate 1)
		t.Fatal(err)
	}
	eventually(t, "run 1 to execute", func() bool { return p.executing.Load() == 1 })
	time.Sleep(200 * time.Millisecond)
	h.armed.Store(true)
	if _, err := kagzi.Start(ctx, starter, wf, 2); err != nil { // claimed by the loop
		t.Fatal(err)
	}
	var ev kagzi.ClaimEvent
	select {
	case ev = <-h.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no claim")
	}
	if ev.Claimed != 1 {
		t.Fatalf("claim: %+v", ev)
	}
	if _, err := kagzi.Start(ctx, wc, wf, 3); err != nil { // eager, takes the free slot
		t.Fatal(err)
	}
	eventually(t, "run 3 to execute (eagerly)", func() bool { return p.executing.Load() == 2 })
	h.release <- struct{}{}
	eventually(t, "run 2 to wait ahead", func() bool { return kagzi.RunsAhead(w) == 1 })
	if _, err := wc.SetLimits(ctx, kagzi.Limits{WorkflowType: typ, Rate: 1, RatePeriod: time.Minute}); err != nil {
		t.Fatal(err)
	}
	p.limitSet.Store(true)
	ahead := kagzi.RunsAhead(w)
	p.open(1)
	p.open(2)
	p.open(3)
	time.Sleep(300 * time.Millisecond)
	if _, err := kagzi.Start(ctx, starter, wf, 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if n := p.beganAfter.Load(); n > 1 {
		t.Errorf("%d runs began after SetLimits(rate 1 a minute) returned (runs ahead after it: %d)", n, ahead)
	}
}
