package kagzi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

// recordingHooks records what the hooks see, in order.
type recordingHooks struct {
	kagzi.NopHooks
	mu       sync.Mutex
	events   []string
	carriers []map[string]string
	claims   int
}

type hookCtxKey string

func (h *recordingHooks) add(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, fmt.Sprintf(format, args...))
}

func (h *recordingHooks) list() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.events)
}

func (h *recordingHooks) StartBegin(ctx context.Context, e *kagzi.StartEvent) context.Context {
	e.Carrier["trace"] = "trace-of-" + e.WorkflowType
	h.add("start %s parent=%t caller=%v", e.WorkflowType, e.ParentRunID != "", ctx.Value(hookCtxKey("exec")) != nil)
	return context.WithValue(ctx, hookCtxKey("start"), e)
}

func (h *recordingHooks) StartEnd(ctx context.Context, e *kagzi.StartEvent) {
	if ctx.Value(hookCtxKey("start")) != e {
		h.add("start-end without the context of StartBegin")
	}
	h.add("start-end %s exists=%t err=%v", e.WorkflowType, e.AlreadyExists, e.Err)
}

func (h *recordingHooks) ExecutionBegin(ctx context.Context, e *kagzi.ExecutionEvent) context.Context {
	h.mu.Lock()
	h.carriers = append(h.carriers, e.Carrier)
	h.mu.Unlock()
	h.add("exec %s recorded=%d", e.WorkflowType, e.RecordedSteps)
	if e.ClaimedAt.Before(e.AvailableAt) || e.WorkerID == "" {
		h.add("exec with a bad claim time or worker: %+v", e)
	}
	return context.WithValue(ctx, hookCtxKey("exec"), e.RunID)
}

func (h *recordingHooks) ExecutionEnd(ctx context.Context, e *kagzi.ExecutionEvent) {
	h.add("exec-end %s %s", e.WorkflowType, e.Outcome)
}

func (h *recordingHooks) StepBegin(ctx context.Context, e *kagzi.StepEvent) context.Context {
	h.add("step %s attempt=%d", e.Key, e.Attempt)
	if e.Name == "stubbed" {
		e.Replace = func(context.Context) ([]byte, error) { return []byte(`"from the hook"`), nil }
	}
	return context.WithValue(ctx, hookCtxKey("step"), e.Key)
}

func (h *recordingHooks) StepEnd(ctx context.Context, e *kagzi.StepEvent) {
	h.add("step-end %s %s", e.Key, e.Status)
}

func (h *recordingHooks) Sleep(ctx context.Context, e *kagzi.SleepEvent) {
	h.add("sleep %s durable=%t", e.Key, e.Durable)
}

func (h *recordingHooks) Signal(ctx context.Context, e *kagzi.SignalEvent) {
	h.add("signal %s %s", e.Name, e.Action)
}

func (h *recordingHooks) Claim(ctx context.Context, e *kagzi.ClaimEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.claims += e.Claimed
}

var hookedChild = kagzi.Define("hooked-child", func(ctx *kagzi.Context, _ int) (int, error) {
	// Sleep, so that the parent waits for the child asleep, not in a race with its end.
	return 7, ctx.Sleep("nap", 300*time.Millisecond)
})

var hooked = kagzi.Define("hooked", func(ctx *kagzi.Context, _ int) (string, error) {
	seen, err := kagzi.Step(ctx, "look", func(c context.Context) (string, error) {
		return fmt.Sprintf("exec=%v step=%v", c.Value(hookCtxKey("exec")) != nil, c.Value(hookCtxKey("step"))), nil
	})
	if err != nil {
		return "", err
	}
	calls := 0
	if _, err := kagzi.Step(ctx, "flaky", func(context.Context) (int, error) {
		if calls++; calls == 1 {
			return 0, errors.New("first attempt fails")
		}
		return calls, nil
	}, kagzi.WithRetry(kagzi.Linear(2, time.Millisecond))); err != nil {
		return "", err
	}
	stub, err := kagzi.Step(ctx, "stubbed", func(context.Context) (string, error) { return "from the function", nil })
	if err != nil {
		return "", err
	}
	if err := ctx.Sleep("short", time.Millisecond); err != nil {
		return "", err
	}
	if err := ctx.Sleep("long", 300*time.Millisecond); err != nil {
		return "", err
	}
	child, err := kagzi.StartChild(ctx, "child", hookedChild, 0)
	if err != nil {
		return "", err
	}
	if _, err := child.Get(); err != nil {
		return "", err
	}
	if _, err := kagzi.WaitSignal[string](ctx, "go", 0); err != nil {
		return "", err
	}
	return seen + " " + stub, nil
})

func TestHooksSeeStartsExecutionsStepAttemptsSleepsSignalsAndClaims(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	h := &recordingHooks{}
	c, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Hooks: h})
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, c, fastWorker(), hooked, hookedChild)
	run, err := kagzi.Start(ctx, c, hooked, 0, kagzi.WithIDReuse(kagzi.IDReuseNever))
	if err != nil {
		t.Fatal(err)
	}
	// Signal once the run sleeps for it: a signal racing with the wait's suspension is
	// another test's matter.
	eventually(t, "the run to wait for its signal", func() bool {
		return slices.Contains(h.list(), "signal go WAITING") && runStatus(t, c, run.RunID) == kagzi.StatusSleeping
	})
	if err := c.Signal(ctx, run.RunID, "go", "now"); err != nil {
		t.Fatal(err)
	}
	out, err := run.Wait(ctx)
	if err != nil || out != "exec=true step=look#1 from the hook" {
		t.Fatalf("got %q, %v", out, err)
	}
	eventually(t, "the end of the last execution", func() bool {
		return slices.Contains(h.list(), "exec-end hooked COMPLETED")
	})
	if again, err := kagzi.Start(ctx, c, hooked, 0, kagzi.WithID(run.WorkflowID), kagzi.WithIDReuse(kagzi.IDReuseNever)); err != nil || !again.AlreadyExists {
		t.Fatalf("restart: %+v, %v", again, err)
	}

	got := h.list()
	// The order of the first execution is fixed; the child runs beside the parent.
	var parent []string
	for _, ev := range got {
		if !strings.Contains(ev, "hooked-child") && !strings.HasPrefix(ev, "signal go SENT") {
			parent = append(parent, ev)
		}
	}
	want := []string{
		"start hooked parent=false caller=false", "start-end hooked exists=false err=<nil>",
		"exec hooked recorded=0",
		"step look#1 attempt=1", "step-end look#1 COMPLETED",
		"step flaky#1 attempt=1", "step-end flaky#1 FAILED",
		"step flaky#1 attempt=2", "step-end flaky#1 COMPLETED",
		"step stubbed#1 attempt=1", "step-end stubbed#1 COMPLETED",
		"sleep short#1 durable=false", "sleep long#1 durable=true",
	}
	if len(parent) < len(want) || !slices.Equal(parent[:len(want)], want) {
		t.Fatalf("events:\n%s\nwant a start with:\n%s", strings.Join(parent, "\n"), strings.Join(want, "\n"))
	}
	// Then the executions after the sleep, the child's wait and the signal's wait (an
	// execution's end may be reported after the next one began), and the start that
	// found the run.
	index := func(ev string) int { return slices.Index(parent, ev) }
	count := func(ev string) (n int) {
		for _, p := range parent {
			if p == ev {
				n++
			}
		}
		return n
	}
	if i := index("exec hooked recorded=5"); i < len(want) || index("exec hooked recorded=6") < i ||
		index("signal go WAITING") < index("exec hooked recorded=6") ||
		index("signal go RECEIVED") < index("exec hooked recorded=8") || count("exec-end hooked SUSPENDED") != 3 ||
		count("exec-end hooked COMPLETED") != 1 || count("signal go RECEIVED") != 1 {
		t.Fatalf("events:\n%s", strings.Join(parent, "\n"))
	}
	if tail := parent[len(parent)-2:]; !slices.Equal(tail, []string{"start hooked parent=false caller=false",
		"start-end hooked exists=true err=<nil>"}) {
		t.Fatalf("events end with %q", tail)
	}
	for _, ev := range []string{"start hooked-child parent=true caller=true", "exec hooked-child recorded=0",
		"exec-end hooked-child COMPLETED", "signal go SENT"} {
		if !slices.Contains(got, ev) {
			t.Errorf("no %q in %q", ev, got)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, carrier := range h.carriers {
		if !strings.HasPrefix(carrier["trace"], "trace-of-hooked") {
			t.Errorf("an execution got carrier %v, not the one stored at its start", carrier)
		}
	}
	if h.claims < 4 {
		t.Errorf("claims reported %d runs, want at least 4 executions' worth", h.claims)
	}
}

func TestMultiHooksCallEveryHookAndEndInReverseOrder(t *testing.T) {
	t.Parallel()
	var order []string
	mk := func(name string) kagzi.Hooks { return &orderHooks{name: name, order: &order} }
	h := kagzi.MultiHooks(mk("a"), nil, mk("b"))
	e := &kagzi.StepEvent{}
	ctx := h.StepBegin(context.Background(), e)
	h.StepEnd(ctx, e)
	if want := []string{"a begin", "b begin", "b end", "a end"}; !slices.Equal(order, want) {
		t.Fatalf("order %q, want %q", order, want)
	}
	if ctx.Value(hookCtxKey("a")) == nil || ctx.Value(hookCtxKey("b")) == nil {
		t.Fatal("the context does not carry both hooks' values")
	}
	if single := mk("c"); kagzi.MultiHooks(nil, single) != single {
		t.Fatal("MultiHooks of one hook should be that hook")
	}
}

type orderHooks struct {
	kagzi.NopHooks
	name  string
	order *[]string
}

func (o *orderHooks) StepBegin(ctx context.Context, _ *kagzi.StepEvent) context.Context {
	*o.order = append(*o.order, o.name+" begin")
	return context.WithValue(ctx, hookCtxKey(o.name), true)
}

func (o *orderHooks) StepEnd(context.Context, *kagzi.StepEvent) {
	*o.order = append(*o.order, o.name+" end")
}

func TestStartManyCallsTheStartHooksForEachRunAndStoresEachCarrier(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	h := &recordingHooks{}
	c, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Hooks: h})
	if err != nil {
		t.Fatal(err)
	}
	wf := kagzi.Define("bulk-hooked", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
	runs, err := kagzi.StartMany(ctx, c, wf, []int{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"start bulk-hooked parent=false caller=false", "start bulk-hooked parent=false caller=false",
		"start bulk-hooked parent=false caller=false", "start-end bulk-hooked exists=false err=<nil>",
		"start-end bulk-hooked exists=false err=<nil>", "start-end bulk-hooked exists=false err=<nil>"}
	if got := h.list(); !slices.Equal(got, want) {
		t.Fatalf("hook calls %q, want %q", got, want)
	}
	for _, r := range runs {
		var carrier string
		if err := e.pool.QueryRow(ctx, `SELECT trace_carrier->>'trace' FROM kagzi.runs WHERE run_id = $1`, r.RunID).Scan(&carrier); err != nil || carrier != "trace-of-bulk-hooked" {
			t.Fatalf("run %s stored carrier %q (%v), want its StartBegin's", r.RunID, carrier, err)
		}
	}
	runWorker(t, c, fastWorker(), wf)
	for _, r := range runs {
		if _, err := r.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.carriers) != 3 || h.carriers[0]["trace"] != "trace-of-bulk-hooked" {
		t.Fatalf("executions saw carriers %v, want the 3 stored at the start", h.carriers)
	}
}

// signalHooks records the signal events' actions and errors.
type signalHooks struct {
	kagzi.NopHooks
	mu     sync.Mutex
	events []kagzi.SignalEvent
}

func (h *signalHooks) Signal(ctx context.Context, e *kagzi.SignalEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, *e)
}

// Found from outside: the Signal hook reported a send to a finished run, which Signal
// refused with ErrRunFinished and stored nothing for, as a SENT signal with no error.
func TestTheSignalHookSeesASendToAFinishedRunRefused(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	h := &signalHooks{}
	c, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Hooks: h})
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, c, fastWorker(), greet)
	run, err := kagzi.Start(ctx, c, greet, greetIn{Name: "ada"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Signal(ctx, run.RunID, "late", 1); !errors.Is(err, kagzi.ErrRunFinished) {
		t.Fatalf("Signal to a finished run: %v, want ErrRunFinished", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.events) != 1 || h.events[0].Action != kagzi.SignalSent || !errors.Is(h.events[0].Err, kagzi.ErrRunFinished) {
		t.Fatalf("signal hook events %+v, want one send whose Err is ErrRunFinished", h.events)
	}
}

// Found from outside (in the console, which reads the same way): the oldest ready run's
// age was read from available_at, which a priority moves up to an hour before the start.
func TestQueueStatsAgeOfTheOldestReadyRunCountsFromItsStartNotFromItsPriority(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	if _, err := e.client.StartByName(ctx, "urgent", 1, kagzi.WithPriority(kagzi.MaxPriority)); err != nil {
		t.Fatal(err)
	}
	stats, err := e.client.QueueStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(stats) != 1 || stats[0].Ready != 1 || stats[0].OldestReady > time.Minute {
		t.Fatalf("queue stats %+v, want one ready run claimable for under a minute (it was just started)", stats)
	}
}

// Found from outside: runs a concurrency limit holds back were counted Ready (claimable
// now), so queue-depth and oldest-age alerts fired for work waiting its turn.
func TestQueueStatsCountsRunsAConcurrencyLimitHoldsBackAsHeldNotReady(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	for _, l := range []kagzi.Limits{{WorkflowType: "by-key", KeyConcurrency: 1}, {WorkflowType: "by-type", Concurrency: 2},
		{WorkflowType: "both", Concurrency: 3, KeyConcurrency: 1}} {
		if _, err := e.client.SetLimits(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	start := func(typ, key string, n int) {
		for range n {
			opts := []kagzi.StartOption{}
			if key != "" {
				opts = append(opts, kagzi.WithConcurrencyKey(key))
			}
			if _, err := e.client.StartByName(ctx, typ, 1, opts...); err != nil {
				t.Fatal(err)
			}
		}
	}
	start("by-key", "a", 3)
	start("by-key", "b", 1)
	start("by-type", "", 5)
	start("both", "a", 2)
	start("both", "b", 2)
	start("both", "c", 2)
	start("both", "", 1)
	// A worker that claims one run of each and keeps them.
	hold := make(chan struct{})
	defer close(hold)
	wf := func(name string) kagzi.Definition {
		return kagzi.Define(name, func(ctx *kagzi.Context, _ int) (int, error) {
			select {
			case <-hold:
			case <-ctx.Done():
			}
			return 0, ctx.Err()
		})
	}
	cfg := fastWorker()
	cfg.MaxConcurrent = 1
	for _, name := range []string{"by-key", "by-type", "both"} {
		cfg.ID = "holder-" + name
		runWorker(t, e.client, cfg, wf(name))
	}
	want := map[string][2]int64{ // type: ready, held
		"by-key":  {1, 2}, // a holds its place (2 of a's held); b is ready
		"by-type": {1, 3}, // 1 of 2 slots held: 1 ready, 3 held
		"both":    {2, 4}, // 1 of 3 slots held (a key's run): 2 ready of the keys b, c and no key; 4 held
	}
	// (Looked at until it holds: a heartbeat late past a lease on a loaded box makes a
	// held run claimable for a moment.)
	var stats []kagzi.QueueStat
	eventually(t, "each worker to hold a run and the rest held or ready", func() bool {
		var err error
		if stats, err = e.client.QueueStats(ctx); err != nil {
			t.Fatal(err)
		}
		for _, s := range stats {
			w := want[s.WorkflowType]
			if s.Ready != w[0] || s.Held != w[1] || s.Running != 1 || (s.Ready > 0) != (s.OldestReady > 0) {
				return false
			}
		}
		return len(stats) == 3
	})
}

// panickyHooks panics in every method.
type panickyHooks struct{ kagzi.NopHooks }

func (panickyHooks) ExecutionBegin(context.Context, *kagzi.ExecutionEvent) context.Context {
	panic("telemetry bug")
}
func (panickyHooks) StepBegin(context.Context, *kagzi.StepEvent) context.Context {
	panic("telemetry bug")
}
func (panickyHooks) StepEnd(context.Context, *kagzi.StepEvent) { panic("telemetry bug") }
func (panickyHooks) StartBegin(context.Context, *kagzi.StartEvent) context.Context {
	panic("telemetry bug")
}
func (panickyHooks) Claim(context.Context, *kagzi.ClaimEvent) { panic("telemetry bug") }

// Found from outside: a panic in StepBegin failed the run as the workflow's own panic,
// and one in ExecutionBegin ended the process. A hook is telemetry: its bug is logged
// and the run goes on.
func TestAPanickingHookIsLoggedAndNeitherFailsTheRunNorEndsTheProcess(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var logs syncBuffer
	c, err := kagzi.NewClient(e.pool, kagzi.Config{Hooks: panickyHooks{},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, c, fastWorker(), greet)
	run, err := kagzi.Start(ctx, c, greet, greetIn{Name: "ada"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.Wait(ctx); err != nil {
		t.Fatalf("the run failed under a panicking hook: %v", err)
	}
	if !strings.Contains(logs.String(), "a hook panicked") || !strings.Contains(logs.String(), "hook=StepBegin") {
		t.Fatalf("the hook's panics were not logged:\n%s", logs.String())
	}
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// countingSteps counts StepBegin and StepEnd calls; with panics set, its StepBegin
// panics.
type countingSteps struct {
	kagzi.NopHooks
	panics       bool
	begins, ends atomic.Int64
}

func (c *countingSteps) StepBegin(ctx context.Context, _ *kagzi.StepEvent) context.Context {
	c.begins.Add(1)
	if c.panics {
		panic("telemetry bug")
	}
	return ctx
}

func (c *countingSteps) StepEnd(context.Context, *kagzi.StepEvent) { c.ends.Add(1) }

// Found in review: the guard wrapped a MultiHooks as one, so a later hook's panicking
// StepBegin cut the earlier hooks' context (a tracer's span) and skipped the hooks
// after it (kagzitest's stubs). Each hook is guarded on its own, and the End of a hook
// whose Begin panicked is not called.
func TestAPanickingHookLeavesTheOtherHooksOfAMultiHooksWhole(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	before, bad, after := &countingSteps{}, &countingSteps{panics: true}, &countingSteps{}
	c, err := kagzi.NewClient(e.pool, kagzi.Config{Hooks: kagzi.MultiHooks(before, bad, after), Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, c, fastWorker(), greet)
	run, err := kagzi.Start(ctx, c, greet, greetIn{Name: "ada"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	for name, h := range map[string]*countingSteps{"before": before, "after": after} {
		if b, en := h.begins.Load(), h.ends.Load(); b == 0 || b != en {
			t.Errorf("the hook %s the panicking one: %d StepBegin, %d StepEnd; want them paired", name, b, en)
		}
	}
	if b, en := bad.begins.Load(), bad.ends.Load(); b == 0 || en != 0 {
		t.Errorf("the panicking hook: %d StepBegin, %d StepEnd; want no End after a Begin that panicked", b, en)
	}
}

// executionPanics panics in ExecutionBegin and counts the other Begins and Ends.
type executionPanics struct {
	kagzi.NopHooks
	executionEnds, stepBegins, stepEnds, startBegins, startEnds atomic.Int64
}

func (h *executionPanics) ExecutionBegin(context.Context, *kagzi.ExecutionEvent) context.Context {
	panic("telemetry bug in ExecutionBegin")
}
func (h *executionPanics) ExecutionEnd(context.Context, *kagzi.ExecutionEvent) {
	h.executionEnds.Add(1)
}
func (h *executionPanics) StepBegin(ctx context.Context, _ *kagzi.StepEvent) context.Context {
	h.stepBegins.Add(1)
	return ctx
}
func (h *executionPanics) StepEnd(context.Context, *kagzi.StepEvent) { h.stepEnds.Add(1) }
func (h *executionPanics) StartBegin(ctx context.Context, _ *kagzi.StartEvent) context.Context {
	h.startBegins.Add(1)
	return ctx
}
func (h *executionPanics) StartEnd(context.Context, *kagzi.StartEvent) { h.startEnds.Add(1) }

var hookedKid = kagzi.Define("hooked-kid", func(ctx *kagzi.Context, n int) (int, error) {
	return kagzi.Step(ctx, "double", func(context.Context) (int, error) { return 2 * n, nil })
})

var hookedParent = kagzi.Define("hooked-parent", func(ctx *kagzi.Context, n int) (int, error) {
	n, err := kagzi.Step(ctx, "inc", func(context.Context) (int, error) { return n + 1, nil })
	if err != nil {
		return 0, err
	}
	kid, err := kagzi.StartChild(ctx, "kid", hookedKid, n)
	if err != nil {
		return 0, err
	}
	return kid.Get()
})

// Found from outside: a panicking ExecutionBegin marked the run's context, and the
// mark skipped every End under it: the StepEnd of its steps and the StartEnd of its
// children's starts, whose Begins had returned (a tracer's spans never ended). Only
// the End of the Begin that panicked is skipped.
func TestAPanickingExecutionBeginSkipsItsOwnEndOnlyNotThoseOfItsStepsAndChildStarts(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	h := &executionPanics{}
	c, err := kagzi.NewClient(e.pool, kagzi.Config{Hooks: h, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, c, fastWorker(), hookedParent, hookedKid)
	run, err := kagzi.Start(ctx, c, hookedParent, 4)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run.Wait(ctx); err != nil || out != 10 {
		t.Fatalf("the run: %d, %v; want 10", out, err)
	}
	if n := h.executionEnds.Load(); n != 0 {
		t.Errorf("%d ExecutionEnd after ExecutionBegins that panicked; want none", n)
	}
	if b, en := h.stepBegins.Load(), h.stepEnds.Load(); b < 2 || b != en {
		t.Errorf("%d StepBegin returned, %d StepEnd called; want them paired (the parent's step and the child's)", b, en)
	}
	if b, en := h.startBegins.Load(), h.startEnds.Load(); b != 2 || en != b {
		t.Errorf("%d StartBegin returned (the Start and the child's), %d StartEnd called; want them paired", b, en)
	}
}

type pointerHooks struct{ kagzi.NopHooks }

// A nil pointer given as Hooks (a constructor's result whose error was ignored) is
// refused by NewClient instead of panicking in every hook call.
func TestNewClientRefusesANilPointerAsHooks(t *testing.T) {
	e := newEnv(t)
	var h *pointerHooks
	if _, err := kagzi.NewClient(e.pool, kagzi.Config{Hooks: h, Logger: quietLogger()}); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Fatalf("NewClient with a nil *pointerHooks: %v, want ErrInvalidArgument", err)
	}
}

// Found from outside: with synchronous_commit off for the database, a crash of
// PostgreSQL lost run ends that Wait had returned. Kagzi leaves the setting to the
// operator, and a worker says so when it starts.
func TestAWorkerWarnsWhenItsDatabaseCommitsWithoutWaitingForTheFlush(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var name string
	if err := e.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	warned := func(off bool) bool {
		t.Helper()
		setting := "on"
		if off {
			setting = "off"
		}
		if _, err := e.pool.Exec(ctx, `ALTER DATABASE "`+name+`" SET synchronous_commit = `+setting); err != nil {
			t.Fatal(err)
		}
		pool, err := pgxpool.New(ctx, e.url) // new sessions take the database's setting
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		var logs syncBuffer
		c, err := kagzi.NewClient(pool, kagzi.Config{
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		stop := runWorker(t, c, fastWorker(), greet)
		defer stop()
		// The worker looks before it registers: once it is registered, it has looked.
		eventually(t, "the worker to register", func() bool {
			return countRows(t, pool, `SELECT count(*) FROM kagzi.workers WHERE status = 'ONLINE'`) > 0
		})
		return strings.Contains(logs.String(), "synchronous_commit is off")
	}
	if !warned(true) {
		t.Fatal("a worker on a database with synchronous_commit off did not warn")
	}
	if warned(false) {
		t.Fatal("a worker on a database with synchronous_commit on warned")
	}
}
