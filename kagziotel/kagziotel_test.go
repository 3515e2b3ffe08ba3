package kagziotel_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/testdb"
	"github.com/kagzi/kagzi/kagziotel"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// runWorker runs a worker until stop is called or the test ends.
func runWorker(t *testing.T, c *kagzi.Client, cfg kagzi.WorkerConfig, wfs ...kagzi.Definition) (stop func()) {
	t.Helper()
	w, err := kagzi.NewWorker(c, cfg, wfs...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("worker: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	return stop
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func newClient(t *testing.T, pool *pgxpool.Pool, hooks kagzi.Hooks) *kagzi.Client {
	t.Helper()
	c, err := kagzi.NewClient(pool, kagzi.Config{Logger: quietLogger(), Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var order = kagzi.Define("traced-order", func(ctx *kagzi.Context, id string) (string, error) {
	if _, err := kagzi.Step(ctx, "reserve", func(context.Context) (string, error) { return "reserved " + id, nil }); err != nil {
		return "", err
	}
	// Longer than MaxInProcessSleep: the run is released, and resumed by whichever worker runs then.
	if err := ctx.Sleep("cool-off", 400*time.Millisecond); err != nil {
		return "", err
	}
	return kagzi.Step(ctx, "charge", func(c context.Context) (string, error) {
		// A span the step makes is a child of the step's span.
		_, s := trace.SpanFromContext(c).TracerProvider().Tracer("payments").Start(c, "payments.charge")
		s.End()
		return "charged " + id, nil
	})
})

func TestOneTraceFromStartThroughASleepAndAWorkerRestartToCompletion(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	hooks, err := kagziotel.New(tp, noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, pool, hooks)
	stopFirst := runWorker(t, c, kagzi.WorkerConfig{ID: "worker-1"}, order)

	// The HTTP handler's span.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hctx, handler := tp.Tracer("http").Start(ctx, "POST /orders")
	run, err := kagzi.Start(hctx, c, order, "o-1")
	handler.End()
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the run to sleep", func() bool {
		info, err := c.GetRun(ctx, run.RunID)
		return err == nil && info.Status == kagzi.StatusSleeping
	})
	stopFirst() // the worker that started the run is gone; another finishes it
	runWorker(t, c, kagzi.WorkerConfig{ID: "worker-2"}, order)
	if out, err := run.Wait(ctx); err != nil || out != "charged o-1" {
		t.Fatalf("got %q, %v", out, err)
	}
	eventually(t, "the second execution's span to end", func() bool {
		return len(spansNamed(exporter.GetSpans(), "kagzi.run traced-order")) == 2
	})

	spans := exporter.GetSpans()
	traceID := handler.SpanContext().TraceID()
	var names []string
	for _, s := range spans {
		names = append(names, s.Name)
		if s.SpanContext.TraceID() != traceID {
			t.Errorf("span %q is in trace %s, not the handler's %s", s.Name, s.SpanContext.TraceID(), traceID)
		}
	}
	for _, want := range []string{"POST /orders", "kagzi.start traced-order", "kagzi.step reserve",
		"kagzi.sleep cool-off", "kagzi.step charge", "payments.charge"} {
		if len(spansNamed(spans, want)) != 1 {
			t.Errorf("want one span %q; spans: %q", want, names)
		}
	}
	start := spansNamed(spans, "kagzi.start traced-order")[0]
	if start.Parent.SpanID() != handler.SpanContext().SpanID() {
		t.Errorf("the start span's parent is not the handler's span")
	}
	executions := spansNamed(spans, "kagzi.run traced-order")
	var workers, outcomes []string
	for _, x := range executions {
		if x.Parent.SpanID() != start.SpanContext.SpanID() {
			t.Errorf("execution span's parent is %s, not the start span", x.Parent.SpanID())
		}
		workers = append(workers, attr(x.Attributes, kagziotel.AttrWorkerID))
		outcomes = append(outcomes, attr(x.Attributes, kagziotel.AttrOutcome))
	}
	slices.Sort(workers)
	slices.Sort(outcomes)
	if !slices.Equal(workers, []string{"worker-1", "worker-2"}) || !slices.Equal(outcomes, []string{"COMPLETED", "SUSPENDED"}) {
		t.Errorf("executions on workers %q with outcomes %q", workers, outcomes)
	}
	charge := spansNamed(spans, "kagzi.step charge")[0]
	if inner := spansNamed(spans, "payments.charge")[0]; inner.Parent.SpanID() != charge.SpanContext.SpanID() {
		t.Errorf("the step's own span is not a child of the step span")
	}
	if attr(charge.Attributes, kagziotel.AttrStepStatus) != "COMPLETED" || attr(charge.Attributes, kagziotel.AttrStepKey) != "charge#1" {
		t.Errorf("step span attributes %v", charge.Attributes)
	}
	// The carrier is stored with the run, and only the trace context is.
	var carrier string
	if err := pool.QueryRow(ctx, `SELECT trace_carrier::text FROM kagzi.runs WHERE run_id = $1`, run.RunID).Scan(&carrier); err != nil ||
		!strings.Contains(carrier, "traceparent") || !strings.Contains(carrier, traceID.String()) {
		t.Errorf("stored carrier %s, %v", carrier, err)
	}
}

func TestARunWithoutAStoredTraceKeepsOneTraceAcrossExecutions(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	hooks, err := kagziotel.New(tp, noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Started by a client without hooks (as a schedule's tick is): nothing is stored.
	run, err := kagzi.Start(ctx, newClient(t, pool, nil), order, "o-2")
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, newClient(t, pool, hooks), kagzi.WorkerConfig{}, order)
	if _, err := run.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "both executions' spans", func() bool {
		return len(spansNamed(exporter.GetSpans(), "kagzi.run traced-order")) == 2
	})
	traces := map[trace.TraceID]bool{}
	for _, s := range exporter.GetSpans() {
		traces[s.SpanContext.TraceID()] = true
	}
	if len(traces) != 1 {
		t.Fatalf("spans in %d traces, want 1", len(traces))
	}
}

func spansNamed(spans tracetest.SpanStubs, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(attrs []attribute.KeyValue, key attribute.Key) string {
	for _, a := range attrs {
		if a.Key == key {
			return a.Value.Emit()
		}
	}
	return ""
}

var flaky = kagzi.Define("metered", func(ctx *kagzi.Context, fail bool) (string, error) {
	calls := 0
	if _, err := kagzi.Step(ctx, "call-api", func(context.Context) (int, error) {
		if calls++; calls == 1 {
			return 0, errors.New("the API is down")
		}
		return calls, nil
	}, kagzi.WithRetry(kagzi.Linear(2, time.Millisecond))); err != nil {
		return "", err
	}
	if fail {
		return "", kagzi.NonRetryable(errors.New("refused"))
	}
	return "ok", nil
})

func TestMetricsCountRunsStepAttemptsClaimsAndReportTheQueues(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	hooks, err := kagziotel.New(sdktrace.NewTracerProvider(), mp)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, pool, hooks)
	reg, err := hooks.ObserveQueues(c)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Unregister()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Two runs of a type no worker runs: the queue's depth, and the age of its oldest.
	for range 2 {
		if _, err := c.StartByName(ctx, "nobody-runs-this", 1); err != nil {
			t.Fatal(err)
		}
	}
	runWorker(t, c, kagzi.WorkerConfig{}, flaky)
	ok, err := kagzi.Start(ctx, c, flaky, false)
	if err != nil {
		t.Fatal(err)
	}
	bad, err := kagzi.Start(ctx, c, flaky, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ok.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Wait(ctx); err == nil {
		t.Fatal("the failing run completed")
	}
	var rm metricdata.ResourceMetrics
	eventually(t, "both executions to be counted", func() bool {
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		return sum(rm, "kagzi.executions", nil) == 2
	})

	metered := map[attribute.Key]string{kagziotel.AttrWorkflowType: "metered"}
	checks := []struct {
		name  string
		attrs map[attribute.Key]string
		want  float64
	}{
		{"kagzi.runs.started", metered, 2},
		{"kagzi.runs.started", map[attribute.Key]string{kagziotel.AttrWorkflowType: "nobody-runs-this"}, 2},
		{"kagzi.runs.completed", metered, 1},
		{"kagzi.runs.failed", metered, 1},
		{"kagzi.step.attempts", map[attribute.Key]string{kagziotel.AttrStepName: "call-api", kagziotel.AttrStepStatus: "FAILED"}, 2},
		{"kagzi.step.attempts", map[attribute.Key]string{kagziotel.AttrStepName: "call-api", kagziotel.AttrStepStatus: "COMPLETED"}, 2},
		{"kagzi.step.duration", map[attribute.Key]string{kagziotel.AttrStepName: "call-api"}, 4}, // a count, for histograms
		{"kagzi.execution.duration", metered, 2},
		{"kagzi.claim.latency", metered, 2},
		{"kagzi.runs.claimed", nil, 2},
		{"kagzi.worker.active_runs", metered, 0},
		{"kagzi.queue.depth", map[attribute.Key]string{kagziotel.AttrWorkflowType: "nobody-runs-this"}, 2},
		{"kagzi.queue.running", map[attribute.Key]string{kagziotel.AttrWorkflowType: "nobody-runs-this"}, 0},
	}
	for _, c := range checks {
		if got := sum(rm, c.name, c.attrs); got != c.want {
			t.Errorf("%s %v = %v, want %v", c.name, c.attrs, got, c.want)
		}
	}
	if age := sum(rm, "kagzi.queue.oldest_age", map[attribute.Key]string{kagziotel.AttrWorkflowType: "nobody-runs-this"}); age <= 0 || age > 60 {
		t.Errorf("oldest pending age %v s", age)
	}
	if sum(rm, "kagzi.claim.duration", nil) < 1 {
		t.Errorf("no claim measured")
	}
}

// sum adds the values (sums and gauges) or counts (histograms) of the data points of
// the metric name whose attributes include attrs.
func sum(rm metricdata.ResourceMetrics, name string, attrs map[attribute.Key]string) float64 {
	match := func(set attribute.Set) bool {
		for k, v := range attrs {
			if got, ok := set.Value(k); !ok || got.Emit() != v {
				return false
			}
		}
		return true
	}
	var total float64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						total += float64(p.Value)
					}
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						total += float64(p.Value)
					}
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						total += p.Value
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						total += float64(p.Count)
					}
				}
			}
		}
	}
	return total
}

// TestTheCoreDoesNotImportOpenTelemetry checks that only this package depends on
// OpenTelemetry: the kagzi package reaches it through kagzi.Hooks.
func TestTheCoreDoesNotImportOpenTelemetry(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(goTool, "list", "-deps", "github.com/kagzi/kagzi").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed too little: %q", out)
	}
	for _, dep := range deps {
		if strings.Contains(dep, "opentelemetry") || strings.HasPrefix(dep, "github.com/kagzi/kagzi/kagzi") {
			t.Errorf("the core package depends on %s", dep)
		}
	}
}

var countdown = kagzi.Define("countdown", func(ctx *kagzi.Context, n int) (int, error) {
	if n > 0 {
		return 0, kagzi.ContinueAsNew(ctx, n-1)
	}
	return 0, nil
})

// A run that continues as new starts a run: kagzi.runs.started counts it, so that
// started and ended runs balance (found from outside: one Start continued twice
// counted 1 started and 3 completed), and its execution span names the next run.
func TestRunsStartedCountsTheRunsAWorkflowContinuedAs(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewSpanRecorder()
	hooks, err := kagziotel.New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)),
		sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, pool, hooks)
	runWorker(t, c, kagzi.WorkerConfig{}, countdown)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run, err := kagzi.Start(ctx, c, countdown, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	typ := map[attribute.Key]string{kagziotel.AttrWorkflowType: "countdown"}
	// An execution's end is counted in several instruments one after another: a
	// collection can fall between them, so the wait is for all of them.
	eventually(t, "the three executions and their runs to be counted", func() bool {
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		return sum(rm, "kagzi.executions", typ) == 3 && sum(rm, "kagzi.runs.completed", typ) == 3 &&
			sum(rm, "kagzi.runs.started", typ) == 3
	})
	if started, completed := sum(rm, "kagzi.runs.started", typ), sum(rm, "kagzi.runs.completed", typ); started != 3 || completed != 3 {
		t.Fatalf("runs started %v, completed %v; want 3 and 3", started, completed)
	}
	continued := 0
	for _, s := range spansNamed(tracetest.SpanStubsFromReadOnlySpans(spans.Ended()), "kagzi.run countdown") {
		if attr(s.Attributes, kagziotel.AttrContinuedAs) != "" {
			continued++
		}
	}
	if continued != 2 {
		t.Fatalf("%d execution spans name the run they continued as, want 2", continued)
	}
}

// A nil propagator is refused by New (it made every Start's hook panic and leave its
// span open).
func TestNewRefusesANilPropagator(t *testing.T) {
	_, err := kagziotel.New(nil, nil, kagziotel.WithPropagator(nil))
	if !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Fatalf("New with a nil propagator: %v, want ErrInvalidArgument", err)
	}
}
