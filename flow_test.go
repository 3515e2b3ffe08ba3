package kagzi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

func TestSetLimitsRejectsBadLimitsWithInvalidArgumentAndChangesNothing(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	good := kagzi.Limits{WorkflowType: "wf", Concurrency: 2}
	if _, err := e.client.SetLimits(ctx, good); err != nil {
		t.Fatal(err)
	}
	for name, l := range map[string]kagzi.Limits{
		"no limit at all":         {WorkflowType: "wf"},
		"negative concurrency":    {WorkflowType: "wf", Concurrency: -1},
		"negative key limit":      {WorkflowType: "wf", KeyConcurrency: -3},
		"absurd concurrency":      {WorkflowType: "wf", Concurrency: kagzi.MaxLimit + 1},
		"rate without a period":   {WorkflowType: "wf", Rate: 5},
		"period without a rate":   {WorkflowType: "wf", Concurrency: 1, RatePeriod: time.Second},
		"period too short":        {WorkflowType: "wf", Rate: 5, RatePeriod: time.Microsecond},
		"period too long":         {WorkflowType: "wf", Rate: 5, RatePeriod: 48 * time.Hour},
		"negative key rate":       {WorkflowType: "wf", KeyRate: -1, KeyRatePeriod: time.Second},
		"key rate without period": {WorkflowType: "wf", KeyRate: 1},
		"empty workflow type":     {Concurrency: 1},
		"period of 10.5ms":        {WorkflowType: "wf", Rate: 1, RatePeriod: 10500 * time.Microsecond},
		"key period of 1s+1ns":    {WorkflowType: "wf", KeyRate: 1, KeyRatePeriod: time.Second + 1},
	} {
		_, err := e.client.SetLimits(ctx, l)
		if !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("%s: got %v, want ErrInvalidArgument", name, err)
		}
	}
	// A rate without its period says which is missing, not that a zero period is out of range.
	_, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "wf", Rate: 5})
	if err == nil || !strings.Contains(err.Error(), "a Rate without a RatePeriod") {
		t.Errorf("rate without a period: %v, want it to name the missing RatePeriod", err)
	}
	all, err := e.client.ListLimits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 || all[0].WorkflowType != "wf" || all[0].Concurrency != 2 || all[0].Rate != 0 {
		t.Fatalf("limits after the rejected sets: %+v, want only the first", all)
	}
}

func TestAHoldDueWithinTheSecondPrintsItsTimeToTheMillisecond(t *testing.T) {
	until := time.Date(2026, 11, 26, 22, 15, 7, 250_000_000, time.UTC)
	h := kagzi.Hold{Limit: "rate", Until: &until}
	if got, want := h.String(), "held by the rate limit until 2026-11-26T22:15:07.250Z"; got != want {
		t.Errorf("Hold.String() = %q, want %q", got, want)
	}
	if got, want := (&kagzi.Hold{Limit: "key-concurrency"}).String(),
		"held by the key-concurrency limit until a run that holds a place stops"; got != want {
		t.Errorf("Hold.String() = %q, want %q", got, want)
	}
}

func TestLimitsAreStoredReadListedReplacedAndDeleted(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	if _, err := e.client.GetLimits(ctx, "orders"); !errors.Is(err, kagzi.ErrNotFound) {
		t.Fatalf("GetLimits of a type without limits: %v, want ErrNotFound", err)
	}
	set, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "orders", KeyConcurrency: 1, Rate: 100,
		RatePeriod: time.Minute, KeyRate: 5, KeyRatePeriod: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.client.GetLimits(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if *got != *set || got.KeyConcurrency != 1 || got.Rate != 100 || got.RatePeriod != time.Minute ||
		got.KeyRate != 5 || got.KeyRatePeriod != 10*time.Second || got.Concurrency != 0 || got.UpdatedAt.IsZero() {
		t.Fatalf("GetLimits = %+v, want what was set: %+v", got, set)
	}
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "orders", Concurrency: 7}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "emails", Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	// Another namespace's limits are its own.
	other := newClient(t, e.pool, "other")
	if _, err := other.GetLimits(ctx, "orders"); !errors.Is(err, kagzi.ErrNotFound) {
		t.Fatalf("another namespace sees the limits: %v", err)
	}
	all, err := e.client.ListLimits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[0].WorkflowType != "emails" || all[1].WorkflowType != "orders" ||
		all[1].Concurrency != 7 || all[1].KeyConcurrency != 0 || all[1].Rate != 0 {
		t.Fatalf("ListLimits = %+v, want emails then the replaced orders limits", all)
	}
	// The JSON of limits (the CLI's, the console's) writes periods as durations.
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	var back kagzi.Limits
	if err := json.Unmarshal(b, &back); err != nil || !back.UpdatedAt.Equal(set.UpdatedAt) {
		t.Fatalf("limits JSON %s decodes to %+v (%v)", b, back, err)
	}
	back.UpdatedAt = set.UpdatedAt
	if back != *set || !strings.Contains(string(b), `"rate_period":"1m0s"`) || !strings.Contains(string(b), `"key_rate_period":"10s"`) {
		t.Fatalf("limits JSON %s decodes to %+v, want %+v", b, back, set)
	}
	if err := e.client.DeleteLimits(ctx, "orders"); err != nil {
		t.Fatal(err)
	}
	if err := e.client.DeleteLimits(ctx, "orders"); !errors.Is(err, kagzi.ErrNotFound) {
		t.Fatalf("second DeleteLimits: %v, want ErrNotFound", err)
	}
}

func TestFlowStartOptionsRejectBadInputAndStartNothing(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("wf", func(ctx *kagzi.Context, in int) (int, error) { return in, nil })
	for name, opt := range map[string][]kagzi.StartOption{
		"negative priority":          {kagzi.WithPriority(-1)},
		"priority over the maximum":  {kagzi.WithPriority(kagzi.MaxPriority + 1)},
		"empty concurrency key":      {kagzi.WithConcurrencyKey("")},
		"control character in key":   {kagzi.WithConcurrencyKey("a\nb")},
		"empty debounce key":         {kagzi.WithDebounce("", time.Second, time.Second)},
		"zero debounce window":       {kagzi.WithDebounce("k", 0, time.Second)},
		"window under a millisecond": {kagzi.WithDebounce("k", time.Microsecond, time.Microsecond)},
		"window of 1.5ms":            {kagzi.WithDebounce("k", 1500*time.Microsecond, time.Second)},
		"max wait of 1s+1µs":         {kagzi.WithDebounce("k", time.Second, time.Second+time.Microsecond)},
		"max wait below the window":  {kagzi.WithDebounce("k", time.Minute, time.Second)},
		"debounce with a workflowid": {kagzi.WithDebounce("k", time.Second, time.Minute), kagzi.WithID("x")},
		"debounce with a delay":      {kagzi.WithDebounce("k", time.Second, time.Minute), kagzi.WithDelay(time.Second)},
	} {
		if _, err := kagzi.Start(ctx, e.client, wf, 1, opt...); !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("%s: Start got %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, err := kagzi.StartMany(ctx, e.client, wf, []int{1, 2}, kagzi.WithDebounce("k", time.Second, time.Minute)); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("StartMany with a debounce: %v, want ErrInvalidArgument", err)
	}
	if _, err := kagzi.StartMany(ctx, e.client, wf, []int{1, 2}, kagzi.WithPriority(-5)); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("StartMany with a negative priority: %v, want ErrInvalidArgument", err)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs`); n != 0 {
		t.Fatalf("%d runs exist after rejected starts", n)
	}
}

// orderRecorder records the inputs of a workflow's runs in the order they execute.
type orderRecorder struct {
	mu    sync.Mutex
	order []string
}

func (o *orderRecorder) workflow(name string) *kagzi.Workflow[string, string] {
	return kagzi.Define(name, func(ctx *kagzi.Context, in string) (string, error) {
		o.mu.Lock()
		o.order = append(o.order, in)
		o.mu.Unlock()
		return in, nil
	})
}

func (o *orderRecorder) seen() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.order)
}

func TestHigherPriorityRunsAreClaimedFirst(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	rec := &orderRecorder{}
	wf := rec.workflow("prio")
	var runs []*kagzi.Run[string]
	for i := range 8 { // started low, high, low, high...: the highs must all come first
		p := 0
		if i%2 == 1 {
			p = 60
		}
		run, err := kagzi.Start(ctx, e.client, wf, fmt.Sprintf("p%d-%d", p, i), kagzi.WithPriority(p))
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, run)
	}
	// Keyed runs order by priority within their key too.
	for i := range 4 {
		p := i % 2 * 60
		if _, err := kagzi.Start(ctx, e.client, wf, fmt.Sprintf("k-p%d-%d", p, i), kagzi.WithPriority(p),
			kagzi.WithConcurrencyKey("k")); err != nil {
			t.Fatal(err)
		}
	}
	info, err := e.client.GetRun(ctx, runs[1].RunID)
	if err != nil || info.Priority != 60 {
		t.Fatalf("RunInfo.Priority = %v (%v), want 60", info.Priority, err)
	}
	cfg := fastWorker()
	cfg.MaxConcurrent = 1
	runWorker(t, e.client, cfg, wf)
	eventually(t, "every run to execute", func() bool { return len(rec.seen()) == 12 })
	var plain, keyed []string
	for _, in := range rec.seen() {
		if in[0] == 'k' {
			keyed = append(keyed, in)
		} else {
			plain = append(plain, in)
		}
	}
	want := []string{"p60-1", "p60-3", "p60-5", "p60-7", "p0-0", "p0-2", "p0-4", "p0-6"}
	if !slices.Equal(plain, want) {
		t.Errorf("runs executed in order %v, want %v", plain, want)
	}
	if want := []string{"k-p60-1", "k-p60-3", "k-p0-0", "k-p0-2"}; !slices.Equal(keyed, want) {
		t.Errorf("runs of a key executed in order %v, want %v", keyed, want)
	}
}

func TestKeysTakeTurnsSoABacklogDoesNotStarveAnotherKey(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	rec := &orderRecorder{}
	wf := rec.workflow("fair")
	big := make([]string, 400)
	for i := range big {
		big[i] = "a"
	}
	// Key A's backlog is started first, in one statement; then key B's ten runs.
	if _, err := kagzi.StartMany(ctx, e.client, wf, big, kagzi.WithConcurrencyKey("tenant-a")); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if _, err := kagzi.Start(ctx, e.client, wf, "b", kagzi.WithConcurrencyKey("tenant-b")); err != nil {
			t.Fatal(err)
		}
	}
	cfg := fastWorker()
	cfg.MaxConcurrent = 4
	runWorker(t, e.client, cfg, wf)
	eventually(t, "every run to execute", func() bool { return len(rec.seen()) == 410 })
	order := rec.seen()
	lastB := slices.Index(order, "b")
	for i, in := range order {
		if in == "b" {
			lastB = i
		}
	}
	// In start order B would wait for all 400 of A; taking turns, B's runs are done
	// after about as many of A's.
	if lastB >= 100 {
		t.Errorf("key B's last run executed %dth of 410, behind %d of key A's backlog", lastB+1, lastB-9)
	}
	t.Logf("key B's 10 runs done by position %d of 410", lastB+1)
}

func TestDebounceCollapsesStartsIntoOneRunWithTheLastInput(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	rec := &orderRecorder{}
	wf := rec.workflow("reindex")
	runWorker(t, e.client, fastWorker(), wf)
	var first *kagzi.Run[string]
	for i := range 5 {
		run, err := kagzi.Start(ctx, e.client, wf, fmt.Sprint("input-", i), kagzi.WithDebounce("doc-7", 400*time.Millisecond, time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = run
			if run.AlreadyExists {
				t.Fatal("the first start of a debounce key reports AlreadyExists")
			}
			continue
		}
		if run.RunID != first.RunID || !run.AlreadyExists {
			t.Fatalf("start %d of the key: run %s (AlreadyExists %v), want the first's %s", i, run.RunID, run.AlreadyExists, first.RunID)
		}
	}
	out, err := first.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if out != "input-4" {
		t.Fatalf("the debounced run got %q, want the last start's input", out)
	}
	info, err := e.client.GetRun(ctx, first.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if info.DebounceKey != "doc-7" || info.StartedAt.Sub(info.CreatedAt) < 400*time.Millisecond {
		t.Fatalf("run %+v: want debounce key doc-7, begun at least a window after its first start", info)
	}
	if got := rec.seen(); len(got) != 1 {
		t.Fatalf("%d executions, want one: %v", len(got), got)
	}
	// A start after the run began makes the next run.
	next, err := kagzi.Start(ctx, e.client, wf, "later", kagzi.WithDebounce("doc-7", 10*time.Millisecond, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if next.RunID == first.RunID || next.AlreadyExists {
		t.Fatalf("a start after the debounced run began returned it again")
	}
	if out, err := next.Wait(ctx); err != nil || out != "later" {
		t.Fatalf("next run: %q, %v", out, err)
	}
}

func TestALaterDebouncedStartChangesOnlyTheInputAndKeepsTheFirstStartsOptions(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("debounce-options", func(ctx *kagzi.Context, in string) (string, error) { return in, nil })
	first, err := kagzi.Start(ctx, e.client, wf, "a", kagzi.WithDebounce("k", time.Minute, time.Hour),
		kagzi.WithPriority(3), kagzi.WithConcurrencyKey("tenant-1"), kagzi.WithAttributes(map[string]any{"from": "first"}))
	if err != nil {
		t.Fatal(err)
	}
	later, err := kagzi.Start(ctx, e.client, wf, "b", kagzi.WithDebounce("k", time.Minute, time.Hour),
		kagzi.WithPriority(7), kagzi.WithConcurrencyKey("tenant-2"), kagzi.WithAttributes(map[string]any{"from": "later"}))
	if err != nil {
		t.Fatal(err)
	}
	if later.RunID != first.RunID || !later.AlreadyExists {
		t.Fatalf("the later start made run %s, want the first's %s", later.RunID, first.RunID)
	}
	info, err := e.client.GetRun(ctx, first.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if info.Priority != 3 || info.ConcurrencyKey != "tenant-1" || info.Attributes["from"] != "first" || string(info.Input) != `"b"` {
		t.Fatalf("run: priority %d, key %q, attributes %v, input %s; want the first start's 3, tenant-1, first, with the later input \"b\"",
			info.Priority, info.ConcurrencyKey, info.Attributes, info.Input)
	}
}

func TestDebouncedRunIsNeverPushedPastItsMaximumWait(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("digest", func(ctx *kagzi.Context, in int) (int, error) { return in, nil })
	// No worker: every start of the key lands on the same PENDING run, each pushing
	// its start further, until the maximum wait caps it.
	const window, maxWait = 200 * time.Millisecond, 600 * time.Millisecond
	var runID string
	for i := range 12 {
		run, err := kagzi.Start(ctx, e.client, wf, i, kagzi.WithDebounce("user-1", window, maxWait))
		if err != nil {
			t.Fatal(err)
		}
		if runID == "" {
			runID = run.RunID
		} else if run.RunID != runID {
			t.Fatalf("start %d made run %s, want %s", i, run.RunID, runID)
		}
		time.Sleep(100 * time.Millisecond)
	}
	info, err := e.client.GetRun(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	if got := info.AvailableAt.Sub(info.CreatedAt); got > maxWait || got < window {
		t.Fatalf("the run begins %v after its first start; want within [window %v, maximum wait %v]", got, window, maxWait)
	}
	if string(info.Input) != "11" {
		t.Fatalf("input %s, want the last start's (11)", info.Input)
	}
	runWorker(t, e.client, fastWorker(), wf)
	eventually(t, "the debounced run to complete", func() bool { return runStatus(t, e.client, runID) == kagzi.StatusCompleted })
}

// blockingWorkflow runs one step that blocks until release is closed (the run stays
// RUNNING, holding its slot), or waits for a signal (SLEEPING) when the input says so.
func blockingWorkflow(name string, release <-chan struct{}) *kagzi.Workflow[string, string] {
	return kagzi.Define(name, func(ctx *kagzi.Context, in string) (string, error) {
		if in == "signal" {
			return kagzi.WaitSignal[string](ctx, "go", time.Hour)
		}
		return kagzi.Step(ctx, "block", func(c context.Context) (string, error) {
			select {
			case <-release:
			case <-c.Done():
				return "", c.Err()
			}
			return in, nil
		})
	})
}

func countStatus(t *testing.T, e *env, typ string, status kagzi.RunStatus) int {
	return countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE workflow_type = $1 AND status = $2`, typ, string(status))
}

func TestRunInfoTellsWhichLimitHoldsARunBack(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	release := make(chan struct{})
	typeLimited := blockingWorkflow("type-limited", release)
	keyLimited := blockingWorkflow("key-limited", release)
	rated := blockingWorkflow("rated-hourly", release)
	for _, l := range []kagzi.Limits{
		{WorkflowType: "type-limited", Concurrency: 1},
		{WorkflowType: "key-limited", KeyConcurrency: 1},
		{WorkflowType: "rated-hourly", Rate: 1, RatePeriod: time.Hour},
	} {
		if _, err := e.client.SetLimits(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	runWorker(t, e.client, fastWorker(), typeLimited, keyLimited, rated)
	start := func(wf *kagzi.Workflow[string, string], in string, opts ...kagzi.StartOption) string {
		run, err := kagzi.Start(ctx, e.client, wf, in, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return run.RunID
	}
	start(typeLimited, "x")
	start(keyLimited, "signal", kagzi.WithConcurrencyKey("c1")) // holds its key's place while it waits
	start(rated, "x")
	eventually(t, "the first runs to be claimed", func() bool {
		return countStatus(t, e, "type-limited", kagzi.StatusRunning) == 1 &&
			countStatus(t, e, "key-limited", kagzi.StatusSleeping) == 1 && countStatus(t, e, "rated-hourly", kagzi.StatusRunning) == 1
	})
	heldType := start(typeLimited, "y")
	heldKey := start(keyLimited, "y", kagzi.WithConcurrencyKey("c1"))
	otherKey := start(keyLimited, "z", kagzi.WithConcurrencyKey("c2"))
	heldRate := start(rated, "y")
	holdOf := func(runID string) *kagzi.Hold {
		info, err := e.client.GetRun(ctx, runID)
		if err != nil {
			t.Fatal(err)
		}
		return info.Hold
	}
	eventually(t, "the held runs to show their holds", func() bool {
		h1, h2, h3 := holdOf(heldType), holdOf(heldKey), holdOf(heldRate)
		return h1 != nil && h2 != nil && h3 != nil
	})
	if h := holdOf(heldType); h.Limit != "concurrency" || h.Until != nil {
		t.Errorf("type-limited run held by %+v, want the concurrency limit", h)
	}
	if h := holdOf(heldKey); h.Limit != "key-concurrency" || h.Until != nil {
		t.Errorf("key-limited run held by %+v, want the key-concurrency limit", h)
	}
	if h := holdOf(heldRate); h.Limit != "rate" || h.Until == nil ||
		h.Until.Before(time.Now().Add(50*time.Minute)) || h.Until.After(time.Now().Add(70*time.Minute)) {
		t.Errorf("rated run held by %+v, want the rate limit until about an hour from now", h)
	} else if h.String() == "" {
		t.Error("Hold.String is empty")
	}
	// The same run read by its workflow id shows the same hold.
	if info, err := e.client.GetRunByWorkflowID(ctx, heldRate); err != nil {
		t.Fatal(err)
	} else if info.Hold == nil || info.Hold.Limit != "rate" {
		t.Errorf("the rated run read by its workflow id shows hold %+v, want the rate limit", info.Hold)
	}
	// Another key is not held by the first key's limit.
	eventually(t, "the run of another key to be claimed", func() bool { return runStatus(t, e.client, otherKey) == kagzi.StatusRunning })
	close(release)
	eventually(t, "the type-limited run to complete once the holder did", func() bool {
		return runStatus(t, e.client, heldType) == kagzi.StatusCompleted
	})
	if h := holdOf(heldType); h != nil {
		t.Errorf("a finished run shows a hold: %+v", h)
	}
}

func TestCancellingARunFreesItsKeyPlaceAtOnce(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := blockingWorkflow("per-customer", nil)
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "per-customer", KeyConcurrency: 1}); err != nil {
		t.Fatal(err)
	}
	// A worker that never polls: only a notification can tell it that the key has
	// room again.
	cfg := fastWorker()
	cfg.PollInterval = time.Hour
	runWorker(t, e.client, cfg, wf)
	first, err := kagzi.Start(ctx, e.client, wf, "signal", kagzi.WithConcurrencyKey("c"))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first run to wait", func() bool { return runStatus(t, e.client, first.RunID) == kagzi.StatusSleeping })
	second, err := kagzi.Start(ctx, e.client, wf, "signal", kagzi.WithConcurrencyKey("c"))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the second run to be held", func() bool {
		info, err := e.client.GetRun(ctx, second.RunID)
		return err == nil && info.Hold != nil && info.Hold.Limit == "key-concurrency"
	})
	if err := e.client.Cancel(ctx, first.RunID); err != nil {
		t.Fatal(err)
	}
	// The cancel frees the key: the second run begins (and waits for its own signal)
	// without waiting for any lease or poll.
	eventually(t, "the second run to begin", func() bool { return runStatus(t, e.client, second.RunID) == kagzi.StatusSleeping })
}

func TestASleepingHolderWhoseDeadlinePassesFreesItsKeyPlaceAtOnce(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := blockingWorkflow("per-account", nil)
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "per-account", KeyConcurrency: 1}); err != nil {
		t.Fatal(err)
	}
	cfg := fastWorker()
	cfg.PollInterval = time.Hour // only a notification tells the worker the key has room
	runWorker(t, e.client, cfg, wf)
	first, err := kagzi.Start(ctx, e.client, wf, "signal", kagzi.WithConcurrencyKey("a"),
		kagzi.WithRunTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first run to wait", func() bool { return runStatus(t, e.client, first.RunID) == kagzi.StatusSleeping })
	second, err := kagzi.Start(ctx, e.client, wf, "signal", kagzi.WithConcurrencyKey("a"))
	if err != nil {
		t.Fatal(err)
	}
	// The first run fails when its deadline passes, asleep: the key's next run begins
	// without waiting for a poll.
	eventually(t, "the second run to begin", func() bool { return runStatus(t, e.client, second.RunID) == kagzi.StatusSleeping })
	if s := runStatus(t, e.client, first.RunID); s != kagzi.StatusFailed {
		t.Fatalf("the first run is %s after its deadline, want FAILED", s)
	}
}

func TestRaisingALimitAtRuntimeAdmitsMoreRunsAndASleepingRunGivesItsSlotBack(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	release := make(chan struct{})
	wf := blockingWorkflow("batch", release)
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "batch", Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	cfg := fastWorker()
	cfg.MaxConcurrent = 10
	runWorker(t, e.client, cfg, wf)
	// A run waiting for a signal is SLEEPING and holds no slot: the others still run.
	waiter, err := kagzi.Start(ctx, e.client, wf, "signal")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the waiter to sleep", func() bool { return runStatus(t, e.client, waiter.RunID) == kagzi.StatusSleeping })
	for i := range 4 {
		if _, err := kagzi.Start(ctx, e.client, wf, fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "one run to hold the slot", func() bool { return countStatus(t, e, "batch", kagzi.StatusRunning) == 1 })
	if n := countStatus(t, e, "batch", kagzi.StatusPending); n != 3 {
		t.Fatalf("%d runs PENDING under a limit of 1, want 3", n)
	}
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "batch", Concurrency: 3}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the raised limit to admit two more runs", func() bool { return countStatus(t, e, "batch", kagzi.StatusRunning) == 3 })
	if err := e.client.DeleteLimits(ctx, "batch"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the removed limit to admit the last run", func() bool { return countStatus(t, e, "batch", kagzi.StatusRunning) == 4 })
	close(release)
	eventually(t, "the runs to complete", func() bool { return countStatus(t, e, "batch", kagzi.StatusCompleted) == 4 })
}

func TestARerunOfAKeyedRunQueuesInItsKeyAgain(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	failing := kagzi.Define("keyed-fails", func(ctx *kagzi.Context, in string) (string, error) {
		if in == "fail" {
			return "", kagzi.NonRetryable(errors.New("no"))
		}
		return kagzi.WaitSignal[string](ctx, "go", time.Hour)
	})
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "keyed-fails", KeyConcurrency: 1}); err != nil {
		t.Fatal(err)
	}
	runWorker(t, e.client, fastWorker(), failing)
	failed, err := kagzi.Start(ctx, e.client, failing, "fail", kagzi.WithConcurrencyKey("k"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := failed.Wait(ctx); err == nil {
		t.Fatal("the failing run completed")
	}
	holder, err := kagzi.Start(ctx, e.client, failing, "wait", kagzi.WithConcurrencyKey("k"))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the key's holder to wait", func() bool { return runStatus(t, e.client, holder.RunID) == kagzi.StatusSleeping })
	if err := e.client.Rerun(ctx, failed.RunID); err != nil {
		t.Fatal(err)
	}
	// The rerun is the key's second run while the holder waits: it is held, not run.
	eventually(t, "the rerun to be held by its key", func() bool {
		info, err := e.client.GetRun(ctx, failed.RunID)
		return err == nil && info.Hold != nil && info.Hold.Limit == "key-concurrency"
	})
	if err := e.client.Signal(ctx, holder.RunID, "go", "x"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the rerun to run once the holder finished", func() bool {
		return runStatus(t, e.client, failed.RunID) == kagzi.StatusFailed && runStatus(t, e.client, holder.RunID) == kagzi.StatusCompleted
	})
}

// A worker's end of a run that held a type slot or its key's place notifies the type's
// workers once per end statement (store.FinishRun), not through the run_changed
// trigger: a worker of another client that waits for nothing but a notification
// claims the run the limit held back.
func TestARunsEndThatFreesATypeSlotOrAKeyPlaceWakesAnIdleWorkerOfAnotherClient(t *testing.T) {
	for _, c := range []struct {
		name   string
		limits kagzi.Limits
		opts   []kagzi.StartOption
		hold   string
	}{
		{"type slot", kagzi.Limits{WorkflowType: "one-at-a-time", Concurrency: 1}, nil, "concurrency"},
		{"key place", kagzi.Limits{WorkflowType: "one-at-a-time", KeyConcurrency: 1},
			[]kagzi.StartOption{kagzi.WithConcurrencyKey("customer-7")}, "key-concurrency"},
	} {
		t.Run(c.name, func(t *testing.T) { endFreesPlaceAndWakesOtherClient(t, c.limits, c.opts, c.hold) })
	}
}

// A claim passes over a concurrency key whose lock another claim holds (it does not
// wait: claims visiting keys in different orders would deadlock). The holder may not
// take the key's next run, so the worker whose claim passed the key over looks again
// once the holder is done, instead of waiting for its poll, and backs off while the
// key stays held.
func TestAWorkerWhoseClaimPassedOverAKeyAnotherClaimHeldClaimsTheKeysRunWithoutAPoll(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("per-customer", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "per-customer", KeyConcurrency: 1}); err != nil {
		t.Fatal(err)
	}
	// Another claim holds the key's lock, as one does for its transaction (migration
	// 00003, kagzi.flow_lock_keys).
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('kagzi.flow.key|' || $1 || '|' || $2, 0))`,
		"default|per-customer", "customer-7"); err != nil {
		t.Fatal(err)
	}
	claims := &claimCounter{}
	other, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Hooks: claims})
	if err != nil {
		t.Fatal(err)
	}
	cfg := fastWorker()
	cfg.PollInterval = time.Hour // only a notification, or the worker's own look again, claims
	cfg.LeaseDuration = time.Minute
	runWorker(t, other, cfg, wf)
	eventually(t, "the worker's first claim", func() bool { return claims.n.Load() > 0 })
	before := claims.n.Load()
	h, err := kagzi.Start(ctx, e.client, wf, 7, kagzi.WithConcurrencyKey("customer-7"))
	if err != nil {
		t.Fatal(err)
	}
	// The start woke the worker; its claim passed the held key over, and so do the
	// claims it makes again while the key stays held: each waits twice as long as the
	// one before (20 ms, 40 ms, ...), not a poll of the key every few milliseconds.
	eventually(t, "the worker's claim after the start", func() bool { return claims.n.Load() > before })
	time.Sleep(2 * time.Second)
	if n := claims.n.Load() - before; n > 15 {
		t.Fatalf("the worker claimed %d times in 2 s while the key was held: it should back off", n)
	}
	if info, err := e.client.GetRun(ctx, h.RunID); err != nil || info.Status != kagzi.StatusPending {
		t.Fatalf("the run while its key is held: %+v, %v", info, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if out, err := h.Wait(ctx); err != nil || out != 7 {
		t.Fatalf("the run after its key was let go: %v, %v", out, err)
	}
}

func endFreesPlaceAndWakesOtherClient(t *testing.T, limits kagzi.Limits, opts []kagzi.StartOption, hold string) {
	e := newEnv(t)
	ctx := waitCtx(t)
	inStep := make(chan struct{}, 2)
	release := make(chan struct{})
	fn := func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Step(ctx, "work", func(context.Context) (int, error) {
			inStep <- struct{}{}
			if n == 1 {
				<-release
			}
			return n, nil
		})
	}
	// Two versions of the type: worker A claims only the first run, worker B (of
	// another client, as in another process) only the second, so A's claims after its
	// end cannot take the second run, and nothing of A's but the end can tell B.
	wfA := kagzi.Define("one-at-a-time", fn, kagzi.WithVersion("a"))
	wfB := kagzi.Define("one-at-a-time", fn, kagzi.WithVersion("b"))
	if _, err := e.client.SetLimits(ctx, limits); err != nil {
		t.Fatal(err)
	}
	// Neither worker polls, and B's timer waits for the first run's lease, a minute
	// away: only a notification can wake B sooner.
	cfg := fastWorker()
	cfg.PollInterval = time.Hour
	cfg.LeaseDuration = time.Minute
	runWorker(t, e.client, cfg, wfA)
	first, err := kagzi.Start(ctx, e.client, wfA, 1, opts...)
	if err != nil {
		t.Fatal(err)
	}
	<-inStep
	claims := &claimCounter{}
	other, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Hooks: claims})
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, other, cfg, wfB)
	eventually(t, "worker B's first claim", func() bool { return claims.n.Load() > 0 })
	before := claims.n.Load()
	second, err := kagzi.Start(ctx, e.client, wfB, 2, opts...)
	if err != nil {
		t.Fatal(err)
	}
	// B heard of the start and claimed nothing: the limit holds the run back.
	eventually(t, "worker B's claim after the start", func() bool { return claims.n.Load() > before })
	if info, err := e.client.GetRun(ctx, second.RunID); err != nil || info.Status != kagzi.StatusPending ||
		info.Hold == nil || info.Hold.Limit != hold {
		t.Fatalf("second run before the first ends: %+v, %v", info, err)
	}
	close(release)
	if out, err := first.Wait(ctx); err != nil || out != 1 {
		t.Fatalf("first run: %v, %v", out, err)
	}
	// The end of the first run freed the place and told worker B, which was waiting
	// for nothing but a notification (or the minute).
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if out, err := second.Wait(wctx); err != nil || out != 2 {
		t.Fatalf("second run: %v, %v", out, err)
	}
	if info, err := e.client.GetRun(ctx, second.RunID); err != nil || info.Attempt != 1 {
		t.Fatalf("second run: %+v, %v", info, err)
	}
}

// Nothing announces when a full rate window admits again: a worker idle since its last
// look (its answer: nothing before the next poll) and then woken by a burst of starts
// must ask when the window admits again, not wait for its poll.
func TestABurstHeldBackByARateLimitStartsAsTheWindowAdmitsNotAtTheNextPoll(t *testing.T) {
	for _, c := range []struct {
		name   string
		limits kagzi.Limits
		opts   []kagzi.StartOption
	}{
		{"type rate", kagzi.Limits{WorkflowType: "rated", Rate: 4, RatePeriod: time.Second}, nil},
		{"key rate", kagzi.Limits{WorkflowType: "rated", KeyRate: 4, KeyRatePeriod: time.Second},
			[]kagzi.StartOption{kagzi.WithConcurrencyKey("customer-7")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			ctx := waitCtx(t)
			wf := kagzi.Define("rated", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
			if _, err := e.client.SetLimits(ctx, c.limits); err != nil {
				t.Fatal(err)
			}
			cfg := fastWorker()
			// A run held back waits for the poll unless something else wakes the worker.
			// (An answer stands only when no lease taken since could pass before it: the
			// lease is longer than the poll.)
			cfg.PollInterval = time.Hour
			cfg.LeaseDuration = 2 * time.Hour
			cfg.HeartbeatInterval = time.Hour
			runWorker(t, newClient(t, e.pool, ""), cfg, wf)
			// The worker runs a first run, then finds nothing more to claim: it asks
			// when the next run becomes claimable, and hears "not before the poll".
			first, err := kagzi.Start(ctx, e.client, wf, 0, c.opts...)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := first.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
			burst, err := kagzi.StartMany(ctx, e.client, wf, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, c.opts...)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range burst {
				if out, err := r.Wait(ctx); err != nil || out != i+1 {
					t.Fatalf("run %d of the burst: %v, %v", i+1, out, err)
				}
			}
		})
	}
}

// Found from outside: a concurrency limit set while runs of the type executed did not
// count them, and admitted runs past it.
func TestALimitSetWhileRunsExecuteCountsThemAndAdmitsNoneUntilTheTypeIsUnderIt(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	oldDone, newDone := make(chan struct{}), make(chan struct{})
	wf := kagzi.Define("late-limit", func(ctx *kagzi.Context, in string) (string, error) {
		return kagzi.Step(ctx, "block", func(c context.Context) (string, error) {
			release := oldDone
			if in == "new" {
				release = newDone
			}
			select {
			case <-release:
			case <-c.Done():
				return "", c.Err()
			}
			return in, nil
		})
	})
	cfg := fastWorker()
	cfg.MaxConcurrent = 10
	runWorker(t, e.client, cfg, wf)
	for range 5 {
		if _, err := kagzi.Start(ctx, e.client, wf, "old"); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "five runs to execute", func() bool { return countStatus(t, e, "late-limit", kagzi.StatusRunning) == 5 })
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "late-limit", Concurrency: 2}); err != nil {
		t.Fatal(err)
	}
	var held []string
	for range 3 {
		r, err := kagzi.Start(ctx, e.client, wf, "new")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, r.RunID)
	}
	for _, id := range held {
		eventually(t, "the new run to be held by the type's limit", func() bool {
			info, err := e.client.GetRun(ctx, id)
			return err == nil && info.Hold != nil && info.Hold.Limit == "concurrency"
		})
	}
	time.Sleep(3 * fastWorker().PollInterval) // claims and polls that would admit them
	if n := countStatus(t, e, "late-limit", kagzi.StatusRunning); n != 5 {
		t.Fatalf("%d runs RUNNING after a limit of 2 was set over 5, want the 5 alone", n)
	}
	close(oldDone)
	eventually(t, "two new runs to execute once the old ones ended", func() bool {
		return countStatus(t, e, "late-limit", kagzi.StatusCompleted) == 5 && countStatus(t, e, "late-limit", kagzi.StatusRunning) == 2
	})
	time.Sleep(3 * fastWorker().PollInterval)
	if n := countStatus(t, e, "late-limit", kagzi.StatusRunning); n != 2 {
		t.Fatalf("%d runs RUNNING under a limit of 2", n)
	}
	close(newDone)
	eventually(t, "every run to complete", func() bool { return countStatus(t, e, "late-limit", kagzi.StatusCompleted) == 8 })
}

// Found from outside: a run of a key waiting for its retry counted itself among its
// key's holders, and RunInfo said its own place held it back.
func TestARunWaitingForItsRetryIsNotHeldByItsOwnKeyPlace(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("retried-key", func(ctx *kagzi.Context, in string) (string, error) {
		return kagzi.Step(ctx, "flaky", func(context.Context) (string, error) {
			return "", errors.New("not yet")
		}, kagzi.WithRetry(kagzi.Exponential(5).Initial(300*time.Millisecond).Jitter(0)))
	})
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "retried-key", KeyConcurrency: 1}); err != nil {
		t.Fatal(err)
	}
	stop := runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, "x", kagzi.WithConcurrencyKey("k"))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the run to wait for its retry", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE run_id = $1 AND status = 'PENDING' AND started_at IS NOT NULL`, run.RunID) == 1
	})
	stop() // nothing claims it now
	eventually(t, "the retry to be due", func() bool {
		info, err := e.client.GetRun(ctx, run.RunID)
		return err == nil && info.Status == kagzi.StatusPending && !info.AvailableAt.After(time.Now())
	})
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if info.Hold != nil {
		t.Fatalf("the only run of its key, due for its retry: held by %v, want no hold", info.Hold)
	}
}

// Found from outside: a sleeper whose wake time came while its type's slots were all
// taken showed no reason for its wait.
func TestRunInfoTellsWhatHoldsBackASleeperWhoseWakeTimeCame(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	release := make(chan struct{})
	defer close(release)
	wf := kagzi.Define("woken-held", func(ctx *kagzi.Context, in string) (string, error) {
		if in == "sleeper" {
			if err := ctx.Sleep("nap", time.Second); err != nil {
				return "", err
			}
			return in, nil
		}
		return kagzi.Step(ctx, "block", func(c context.Context) (string, error) {
			select {
			case <-release:
			case <-c.Done():
			}
			return in, nil
		})
	})
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "woken-held", Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	runWorker(t, e.client, fastWorker(), wf)
	sleeper, err := kagzi.Start(ctx, e.client, wf, "sleeper")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the sleeper to sleep", func() bool { return runStatus(t, e.client, sleeper.RunID) == kagzi.StatusSleeping })
	if _, err := kagzi.Start(ctx, e.client, wf, "blocker"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the sleeper, due, to be held by the type's limit", func() bool {
		info, err := e.client.GetRun(ctx, sleeper.RunID)
		return err == nil && info.Status == kagzi.StatusSleeping && info.Hold != nil && info.Hold.Limit == "concurrency"
	})
}

// A claim that read no limit and commits while SetLimits stores one: SetLimits waits for
// it and marks its runs, so they count against the new limit like the runs executing
// before it did.
func TestSetLimitsCountsTheRunsOfAClaimThatCommitsWhileItStoresTheLimit(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("claimed-meanwhile", func(ctx *kagzi.Context, in string) (string, error) { return in, nil })
	r, err := kagzi.Start(ctx, e.client, wf, "x")
	if err != nil {
		t.Fatal(err)
	}
	// The claim: begun (and its row taken) before the limit exists, committed after.
	claim, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer claim.Rollback(ctx)
	if _, err := claim.Exec(ctx, `UPDATE kagzi.runs SET status = 'RUNNING', locked_by = 'w-1',
		lease_epoch = lease_epoch + 1, available_at = now() + interval '1 hour', started_at = now()
		WHERE run_id = $1`, r.RunID); err != nil {
		t.Fatal(err)
	}
	set := make(chan error, 1)
	go func() {
		_, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "claimed-meanwhile", Concurrency: 1})
		set <- err
	}()
	eventually(t, "the limit to be stored", func() bool {
		_, err := e.client.GetLimits(ctx, "claimed-meanwhile")
		return err == nil
	})
	select {
	case err := <-set:
		t.Fatalf("SetLimits returned (%v) while a claim begun before it was still under way", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := claim.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-set; err != nil {
		t.Fatal(err)
	}
	var holds bool
	if err := e.pool.QueryRow(ctx, `SELECT holds_type_slot FROM kagzi.runs WHERE run_id = $1`, r.RunID).Scan(&holds); err != nil {
		t.Fatal(err)
	}
	if !holds {
		t.Fatal("the run claimed while the limit was stored holds no slot: it would execute beside a full limit's worth")
	}
	r2, err := kagzi.Start(ctx, e.client, wf, "y")
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, e.client, fastWorker(), wf)
	eventually(t, "the second run to be held by the limit", func() bool {
		info, err := e.client.GetRun(ctx, r2.RunID)
		return err == nil && info.Hold != nil && info.Hold.Limit == "concurrency"
	})
}

// Found from outside: a rerun of a cancelled debounced run, while a later start of its
// debounce key waited in a new run, failed with "another active run holds the workflow
// id" (nothing held it: the debounce key's waiting run did). A rerun leaves the debounce.
func TestARerunOfACancelledDebouncedRunLeavesItsDebounceAndRunsBesideTheKeysWaitingRun(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("debounced-rerun", func(ctx *kagzi.Context, in string) (string, error) { return in, nil })
	first, err := kagzi.Start(ctx, e.client, wf, "one", kagzi.WithDebounce("k", 10*time.Second, 20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.client.Cancel(ctx, first.RunID); err != nil {
		t.Fatal(err)
	}
	second, err := kagzi.Start(ctx, e.client, wf, "two", kagzi.WithDebounce("k", 10*time.Second, 20*time.Second))
	if err != nil || second.RunID == first.RunID {
		t.Fatalf("the start after the cancel: %+v, %v; want a new run", second, err)
	}
	if err := e.client.Rerun(ctx, first.RunID); err != nil {
		t.Fatalf("Rerun of the cancelled debounced run: %v", err)
	}
	runWorker(t, e.client, fastWorker(), wf)
	if out, err := kagzi.RunOf[string](e.client, first.RunID).Wait(ctx); err != nil || out != "one" {
		t.Fatalf("the rerun: %q, %v", out, err)
	}
	info, err := e.client.GetRun(ctx, first.RunID)
	if err != nil || info.DebounceKey != "" {
		t.Fatalf("the rerun's debounce key %q (%v), want none", info.DebounceKey, err)
	}
	third, err := kagzi.Start(ctx, e.client, wf, "three", kagzi.WithDebounce("k", 10*time.Second, 20*time.Second))
	if err != nil || third.RunID != second.RunID {
		t.Fatalf("a later start of the key joined %v (%v), want the key's waiting run %s", third, err, second.RunID)
	}
}

// A rate limit's period changed at runtime keeps counting the starts made under the
// old one (found from outside: a window cut with the old period was read with the
// new one's slots, so a shorter period forgot recent starts, 10 in 0.3 s under 5 a
// second, and a longer one held runs about twice as long as it said).
func TestARatePeriodChangedAtRuntimeKeepsCountingTheStartsMadeUnderTheOldOne(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("re-rated", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "re-rated", Rate: 5, RatePeriod: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	runWorker(t, newClient(t, e.pool, ""), fastWorker(), wf)
	startAll := func(n int) []*kagzi.Run[int] {
		runs, err := kagzi.StartMany(ctx, e.client, wf, make([]int, n))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range runs {
			if _, err := r.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return runs
	}
	startAll(1)                         // the window's first use
	time.Sleep(2500 * time.Millisecond) // the window moves on at its next use
	runs := startAll(4)                 // counted in the window's last slots
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "re-rated", Rate: 5, RatePeriod: time.Second}); err != nil {
		t.Fatal(err)
	}
	runs = append(runs, startAll(6)...)
	var starts []time.Time
	for _, r := range runs {
		info, err := e.client.GetRun(ctx, r.RunID)
		if err != nil || info.StartedAt == nil {
			t.Fatalf("run %s: %+v, %v", r.RunID, info, err)
		}
		starts = append(starts, *info.StartedAt)
	}
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	for i, s := range starts {
		in := 0
		for _, o := range starts[i:] {
			if o.Sub(s) < 500*time.Millisecond {
				in++
			}
		}
		if in > 5 {
			t.Fatalf("%d runs began within 0.5 s of %v under a limit of 5 a second: %v", in, s, starts)
		}
	}
}

// A longer period set at runtime holds the next run for that period from the last
// start, not about twice as long.
func TestALongerRatePeriodSetAtRuntimeHoldsTheNextRunForThatPeriod(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("slowed", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "slowed", Rate: 1, RatePeriod: 200 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	runWorker(t, newClient(t, e.pool, ""), fastWorker(), wf)
	var first *kagzi.Run[int]
	for i := range 2 {
		if i == 1 {
			time.Sleep(500 * time.Millisecond) // the window moves on: the next start counts in its last slot
		}
		run, err := kagzi.Start(ctx, e.client, wf, 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := run.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		first = run
	}
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "slowed", Rate: 1, RatePeriod: time.Hour}); err != nil {
		t.Fatal(err)
	}
	second, err := kagzi.Start(ctx, e.client, wf, 2)
	if err != nil {
		t.Fatal(err)
	}
	info, err := e.client.GetRun(ctx, first.RunID)
	if err != nil || info.StartedAt == nil {
		t.Fatalf("first run: %+v, %v", info, err)
	}
	began := *info.StartedAt
	var hold *kagzi.Hold
	eventually(t, "the second run to be held by the rate limit", func() bool {
		info, err := e.client.GetRun(ctx, second.RunID)
		if err != nil {
			t.Fatal(err)
		}
		if info.Status != kagzi.StatusPending {
			t.Fatalf("the second run began under 1 run an hour: %+v", info)
		}
		hold = info.Hold
		return hold != nil && hold.Until != nil
	})
	if hold.Limit != "rate" || hold.Until.Before(began.Add(time.Hour)) || hold.Until.After(began.Add(80*time.Minute)) {
		t.Fatalf("held by %q until %v, %v after the last start; want the rate, an hour (plus at most a tenth and a slot) after it",
			hold.Limit, hold.Until, hold.Until.Sub(began))
	}
}

// A debounced StartTx times its window (and its maximum wait) from the start, not from
// the beginning of the caller's transaction (found from outside: a start in a
// transaction begun 3 s before, with a 2 s window, began at its commit).
func TestADebouncedStartInsideAnOlderTransactionTimesItsWindowFromTheStart(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("debounced-tx", func(ctx *kagzi.Context, in int) (int, error) { return in, nil })
	const window = time.Second
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil { // the transaction's snapshot and now()
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	var called time.Time
	if err := tx.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&called); err != nil {
		t.Fatal(err)
	}
	run, err := kagzi.StartTx(ctx, tx, e.client, wf, 1, kagzi.WithDebounce("k", window, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if info.AvailableAt.Before(called.Add(window)) {
		t.Fatalf("the debounced run may begin at %v, %v after the StartTx call; want at least the window, %v",
			info.AvailableAt, info.AvailableAt.Sub(called), window)
	}
}
