// Package kagziotel traces and measures Kagzi with OpenTelemetry. It implements
// kagzi.Hooks, so the kagzi package itself never imports OpenTelemetry.
//
//	hooks, err := kagziotel.New(tracerProvider, meterProvider)
//	client, err := kagzi.NewClient(pool, kagzi.Config{Hooks: hooks})
//	reg, err := hooks.ObserveQueues(client) // queue depth and oldest pending age, per type
//
// # Traces
//
// One trace per run, from the request that started it to its last step: Start opens a
// "kagzi.start <type>" span (a child of the caller's span) and stores its context
// with the run (a W3C traceparent, with the propagator given, in kagzi.runs.trace_carrier).
// Every execution of the run, on any worker, after any sleep, crash or retry, is a
// "kagzi.run <type>" span whose parent is that start span; each step attempt is a
// "kagzi.step <name>" span inside it (the step function's context carries it, so
// spans the step makes are its children), and sleeps and signals are short spans
// ("kagzi.sleep <name>", "kagzi.signal.<action> <name>"). A child run started by
// StartChild joins its parent's trace. A run stored without a trace context (fired
// by a schedule, or started without hooks) gets a trace id derived from its run id,
// so its executions still share one trace.
//
// Attributes name the run (kagzi.namespace, kagzi.workflow.type, kagzi.workflow.id,
// kagzi.run.id), the worker, the step, the attempt and the outcome. Payloads are
// never recorded; error messages are.
//
// # Metrics
//
// Counters: kagzi.runs.started (the runs this process's clients started, counted
// when the insert returns, so a StartTx whose transaction then rolls back counted
// one; and the runs its workers' runs continued as), kagzi.runs.completed,
// kagzi.runs.failed, kagzi.runs.cancelled (by kagzi.workflow.type; the ends of
// executions of this process's workers: a run cancelled while it waits is not one; a
// run that continued as new completed), kagzi.executions (by outcome),
// kagzi.step.attempts (by step name and status), kagzi.runs.claimed,
// kagzi.lease.losses, kagzi.sleeps, kagzi.signals. Histograms, in seconds:
// kagzi.execution.duration, kagzi.step.duration, kagzi.claim.latency (from the time
// a run became claimable to its claim), kagzi.claim.duration (the claim
// statement). kagzi.worker.active_runs counts the runs the workers hold: executing,
// claimed ahead and waiting for a slot, or ending (from ExecutionBegin to
// ExecutionEnd, after the end is written), so it may exceed MaxConcurrent by the
// runs claimed ahead and those ending. ObserveQueues adds
// the gauges kagzi.queue.depth (runs claimable now), kagzi.queue.held (due runs a
// concurrency limit holds back), kagzi.queue.running, kagzi.queue.waiting and
// kagzi.queue.oldest_age (seconds). Export them to
// Prometheus with the OpenTelemetry Prometheus exporter as a reader of the meter
// provider.
package kagziotel

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kagzi/kagzi"
)

// ScopeName is the instrumentation scope of Kagzi's tracer and meter.
const ScopeName = "github.com/kagzi/kagzi"

// Attribute keys.
const (
	AttrNamespace     = attribute.Key("kagzi.namespace")
	AttrWorkflowType  = attribute.Key("kagzi.workflow.type")
	AttrWorkflowID    = attribute.Key("kagzi.workflow.id")
	AttrRunID         = attribute.Key("kagzi.run.id")
	AttrParentRunID   = attribute.Key("kagzi.run.parent_id")
	AttrRunAttempt    = attribute.Key("kagzi.run.attempt")
	AttrAlreadyExists = attribute.Key("kagzi.run.already_exists")
	AttrContinuedAs   = attribute.Key("kagzi.run.continued_as_id")
	AttrWorkerID      = attribute.Key("kagzi.worker.id")
	AttrOutcome       = attribute.Key("kagzi.execution.outcome")
	AttrRecordedSteps = attribute.Key("kagzi.execution.recorded_steps")
	AttrClaimLatency  = attribute.Key("kagzi.execution.claim_latency_ms")
	AttrStepKey       = attribute.Key("kagzi.step.key")
	AttrStepName      = attribute.Key("kagzi.step.name")
	AttrStepAttempt   = attribute.Key("kagzi.step.attempt")
	AttrStepStatus    = attribute.Key("kagzi.step.status")
	AttrSleepWakeAt   = attribute.Key("kagzi.sleep.wake_at")
	AttrSleepDurable  = attribute.Key("kagzi.sleep.durable")
	AttrSignalName    = attribute.Key("kagzi.signal.name")
	AttrSignalAction  = attribute.Key("kagzi.signal.action")
)

// Option configures New.
type Option func(*options)

type options struct {
	propagator propagation.TextMapPropagator
}

// WithPropagator sets how the trace context is written into a run's carrier at Start
// and read back at each execution. Default: W3C trace context and baggage. A nil
// propagator makes New return an error wrapping kagzi.ErrInvalidArgument.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(o *options) { o.propagator = p }
}

// Hooks implements kagzi.Hooks with OpenTelemetry traces and metrics. Create it with
// New and set it in kagzi.Config.Hooks (combine it with other hooks with
// kagzi.MultiHooks).
type Hooks struct {
	kagzi.NopHooks
	tracer     trace.Tracer
	meter      metric.Meter
	propagator propagation.TextMapPropagator

	runsStarted, runsCompleted, runsFailed, runsCancelled metric.Int64Counter
	executions, stepAttempts, runsClaimed, leaseLosses    metric.Int64Counter
	sleeps, signals                                       metric.Int64Counter
	executionDuration, stepDuration                       metric.Float64Histogram
	claimLatency, claimDuration                           metric.Float64Histogram
	activeRuns                                            metric.Int64UpDownCounter

	queueDepth, queueHeld, queueRunning, queueWaiting metric.Int64ObservableGauge
	queueOldest                                       metric.Float64ObservableGauge
}

var _ kagzi.Hooks = (*Hooks)(nil)

// secondsBuckets are the histogram boundaries, in seconds: 1 ms to 10 minutes.
var secondsBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// New returns hooks that trace with tp and measure with mp; nil for either uses the
// global provider (otel.GetTracerProvider, otel.GetMeterProvider).
func New(tp trace.TracerProvider, mp metric.MeterProvider, opts ...Option) (*Hooks, error) {
	o := options{propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})}
	for _, opt := range opts {
		opt(&o)
	}
	if o.propagator == nil {
		return nil, fmt.Errorf("kagziotel: %w: WithPropagator(nil); for no propagation give an empty "+
			"propagation.NewCompositeTextMapPropagator()", kagzi.ErrInvalidArgument)
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	h := &Hooks{
		tracer:     tp.Tracer(ScopeName, trace.WithInstrumentationVersion(kagzi.Version)),
		meter:      mp.Meter(ScopeName, metric.WithInstrumentationVersion(kagzi.Version)),
		propagator: o.propagator,
	}
	m := h.meter
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	seconds := func(name, desc string) metric.Float64Histogram {
		hist, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(secondsBuckets...))
		errs = append(errs, err)
		return hist
	}
	h.runsStarted = counter("kagzi.runs.started", "{run}", "Runs started: by Start (not counting starts that found the workflow id's run) and by continue-as-new")
	h.runsCompleted = counter("kagzi.runs.completed", "{run}", "Runs that completed")
	h.runsFailed = counter("kagzi.runs.failed", "{run}", "Runs that failed for good")
	h.runsCancelled = counter("kagzi.runs.cancelled", "{run}", "Runs cancelled while executing")
	h.executions = counter("kagzi.executions", "{execution}", "Executions of runs, by outcome")
	h.stepAttempts = counter("kagzi.step.attempts", "{attempt}", "Step attempts, by step name and status")
	h.runsClaimed = counter("kagzi.runs.claimed", "{run}", "Runs claimed by workers")
	h.leaseLosses = counter("kagzi.lease.losses", "{run}", "Executions that lost their lease to another worker")
	h.sleeps = counter("kagzi.sleeps", "{sleep}", "New sleeps, durable or in process")
	h.signals = counter("kagzi.signals", "{signal}", "Signals sent, received, waited for and timed out")
	h.executionDuration = seconds("kagzi.execution.duration", "Duration of an execution of a run on a worker")
	h.stepDuration = seconds("kagzi.step.duration", "Duration of a step attempt's function")
	h.claimLatency = seconds("kagzi.claim.latency", "Time from a run becoming claimable to its claim")
	h.claimDuration = seconds("kagzi.claim.duration", "Duration of a worker's claim statement")
	var err error
	h.activeRuns, err = m.Int64UpDownCounter("kagzi.worker.active_runs", metric.WithUnit("{run}"),
		metric.WithDescription("Runs this process's workers hold: executing, claimed ahead of a free slot, or ending"))
	errs = append(errs, err)
	h.queueDepth, err = m.Int64ObservableGauge("kagzi.queue.depth", metric.WithUnit("{run}"),
		metric.WithDescription("Runs claimable now, by workflow type"))
	errs = append(errs, err)
	h.queueHeld, err = m.Int64ObservableGauge("kagzi.queue.held", metric.WithUnit("{run}"),
		metric.WithDescription("Runs whose time has come that a concurrency limit holds back, by workflow type"))
	errs = append(errs, err)
	h.queueRunning, err = m.Int64ObservableGauge("kagzi.queue.running", metric.WithUnit("{run}"),
		metric.WithDescription("Runs held by a live worker, by workflow type"))
	errs = append(errs, err)
	h.queueWaiting, err = m.Int64ObservableGauge("kagzi.queue.waiting", metric.WithUnit("{run}"),
		metric.WithDescription("Runs waiting for their time (delayed, sleeping, backing off, waiting), by workflow type"))
	errs = append(errs, err)
	h.queueOldest, err = m.Float64ObservableGauge("kagzi.queue.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("How long the oldest claimable run has waited, by workflow type"))
	errs = append(errs, err)
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("kagziotel: %w", err)
		}
	}
	return h, nil
}

// ObserveQueues reports the queues of the client's namespace (kagzi.queue.depth,
// .held, .running, .waiting and .oldest_age, by workflow type) each time the meter provider
// collects, with one query (Client.QueueStats). Call it once per client; Unregister
// the result to stop.
func (h *Hooks) ObserveQueues(c *kagzi.Client) (metric.Registration, error) {
	ns := c.Namespace()
	return h.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		stats, err := c.QueueStats(ctx)
		if err != nil {
			return err
		}
		for _, s := range stats {
			attrs := metric.WithAttributes(AttrNamespace.String(ns), AttrWorkflowType.String(s.WorkflowType))
			o.ObserveInt64(h.queueDepth, s.Ready, attrs)
			o.ObserveInt64(h.queueHeld, s.Held, attrs)
			o.ObserveInt64(h.queueRunning, s.Running, attrs)
			o.ObserveInt64(h.queueWaiting, s.Waiting, attrs)
			o.ObserveFloat64(h.queueOldest, s.OldestReady.Seconds(), attrs)
		}
		return nil
	}, h.queueDepth, h.queueHeld, h.queueRunning, h.queueWaiting, h.queueOldest)
}

// spanKey holds this Hooks' span of a start, execution or step in a context, so that
// End finds its own span even when other hooks added theirs.
type spanKey struct {
	h    *Hooks
	kind string
}

func (h *Hooks) span(ctx context.Context, kind string) trace.Span {
	if s, ok := ctx.Value(spanKey{h, kind}).(trace.Span); ok {
		return s
	}
	return trace.SpanFromContext(ctx)
}

func runAttrs(r kagzi.RunRef) []attribute.KeyValue {
	return []attribute.KeyValue{AttrNamespace.String(r.Namespace), AttrWorkflowType.String(r.WorkflowType),
		AttrWorkflowID.String(r.WorkflowID), AttrRunID.String(r.RunID)}
}

func typeAttrs(r kagzi.RunRef, more ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributes(append([]attribute.KeyValue{AttrNamespace.String(r.Namespace),
		AttrWorkflowType.String(r.WorkflowType)}, more...)...)
}

func recordError(s trace.Span, err error) {
	if err != nil {
		s.RecordError(err)
		s.SetStatus(codes.Error, err.Error())
	}
}

// StartBegin opens the start span and writes its context into the run's carrier.
func (h *Hooks) StartBegin(ctx context.Context, e *kagzi.StartEvent) context.Context {
	attrs := runAttrs(e.RunRef)
	if e.ParentRunID != "" {
		attrs = append(attrs, AttrParentRunID.String(e.ParentRunID))
	}
	ctx, s := h.tracer.Start(ctx, "kagzi.start "+e.WorkflowType, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attrs...))
	h.propagator.Inject(ctx, propagation.MapCarrier(e.Carrier))
	return context.WithValue(ctx, spanKey{h, "start"}, s)
}

// StartEnd closes the start span and counts a started run.
func (h *Hooks) StartEnd(ctx context.Context, e *kagzi.StartEvent) {
	s := h.span(ctx, "start")
	s.SetAttributes(AttrRunID.String(e.RunID), AttrAlreadyExists.Bool(e.AlreadyExists))
	recordError(s, e.Err)
	s.End()
	if e.Err == nil && !e.AlreadyExists {
		h.runsStarted.Add(ctx, 1, typeAttrs(e.RunRef))
	}
}

// ExecutionBegin restores the run's trace from its carrier and opens the execution span.
func (h *Hooks) ExecutionBegin(ctx context.Context, e *kagzi.ExecutionEvent) context.Context {
	if len(e.Carrier) > 0 {
		ctx = h.propagator.Extract(ctx, propagation.MapCarrier(e.Carrier))
	}
	if !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, runSpanContext(e.RunID))
	}
	latency := e.ClaimedAt.Sub(e.AvailableAt)
	if e.AvailableAt.IsZero() || latency < 0 {
		latency = 0
	}
	attrs := append(runAttrs(e.RunRef), AttrWorkerID.String(e.WorkerID), AttrRunAttempt.Int(e.Attempt),
		AttrRecordedSteps.Int(e.RecordedSteps), AttrClaimLatency.Int64(latency.Milliseconds()))
	ctx, s := h.tracer.Start(ctx, "kagzi.run "+e.WorkflowType, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attrs...))
	h.claimLatency.Record(ctx, latency.Seconds(), typeAttrs(e.RunRef))
	h.activeRuns.Add(ctx, 1, typeAttrs(e.RunRef))
	return context.WithValue(ctx, spanKey{h, "run"}, s)
}

// runSpanContext is the stand-in parent of a run stored without a trace context: a
// trace id made of the run id's 16 bytes, so every execution of the run shares it.
func runSpanContext(runID string) trace.SpanContext {
	id, err := uuid.Parse(runID)
	if err != nil {
		return trace.SpanContext{}
	}
	sum := sha256.Sum256(id[:])
	var sid trace.SpanID
	copy(sid[:], sum[:8])
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID(id), SpanID: sid,
		TraceFlags: trace.FlagsSampled, Remote: true})
}

// ExecutionEnd closes the execution span and counts its outcome.
func (h *Hooks) ExecutionEnd(ctx context.Context, e *kagzi.ExecutionEvent) {
	s := h.span(ctx, "run")
	s.SetAttributes(AttrOutcome.String(string(e.Outcome)))
	if e.ContinuedAsRunID != "" {
		s.SetAttributes(AttrContinuedAs.String(e.ContinuedAsRunID))
	}
	switch e.Outcome {
	case kagzi.OutcomeFailed, kagzi.OutcomeRetrying, kagzi.OutcomeUnrecorded:
		msg := string(e.Outcome)
		if e.Error != nil {
			msg = e.Error.String()
		}
		s.SetStatus(codes.Error, msg)
	}
	s.End()
	bg := context.WithoutCancel(ctx)
	attrs := typeAttrs(e.RunRef)
	h.activeRuns.Add(bg, -1, attrs)
	h.executions.Add(bg, 1, typeAttrs(e.RunRef, AttrOutcome.String(string(e.Outcome))))
	h.executionDuration.Record(bg, e.Duration.Seconds(), typeAttrs(e.RunRef, AttrOutcome.String(string(e.Outcome))))
	switch e.Outcome {
	case kagzi.OutcomeCompleted:
		h.runsCompleted.Add(bg, 1, attrs)
		if e.ContinuedAsRunID != "" {
			h.runsStarted.Add(bg, 1, attrs) // the run it continued as
		}
	case kagzi.OutcomeFailed:
		h.runsFailed.Add(bg, 1, attrs)
	case kagzi.OutcomeCancelled:
		h.runsCancelled.Add(bg, 1, attrs)
	case kagzi.OutcomeLeaseLost:
		h.leaseLosses.Add(bg, 1, attrs)
	}
}

// StepBegin opens the span of a step attempt; the step function runs inside it.
func (h *Hooks) StepBegin(ctx context.Context, e *kagzi.StepEvent) context.Context {
	ctx, s := h.tracer.Start(ctx, "kagzi.step "+e.Name, trace.WithAttributes(AttrRunID.String(e.RunID),
		AttrStepKey.String(e.Key), AttrStepName.String(e.Name), AttrStepAttempt.Int(e.Attempt)))
	return context.WithValue(ctx, spanKey{h, "step"}, s)
}

// StepEnd closes the attempt's span and measures it.
func (h *Hooks) StepEnd(ctx context.Context, e *kagzi.StepEvent) {
	s := h.span(ctx, "step")
	s.SetAttributes(AttrStepStatus.String(string(e.Status)))
	if e.Status != kagzi.StepInterrupted {
		recordError(s, e.Err)
	}
	s.End()
	bg := context.WithoutCancel(ctx)
	attrs := typeAttrs(e.RunRef, AttrStepName.String(e.Name), AttrStepStatus.String(string(e.Status)))
	h.stepAttempts.Add(bg, 1, attrs)
	h.stepDuration.Record(bg, e.Duration.Seconds(), attrs)
}

// Sleep records a short span for a new sleep.
func (h *Hooks) Sleep(ctx context.Context, e *kagzi.SleepEvent) {
	_, s := h.tracer.Start(ctx, "kagzi.sleep "+e.Name, trace.WithAttributes(AttrRunID.String(e.RunID),
		AttrStepKey.String(e.Key), AttrSleepWakeAt.String(e.WakeAt.UTC().Format(time.RFC3339Nano)),
		AttrSleepDurable.Bool(e.Durable)))
	s.End()
	h.sleeps.Add(context.WithoutCancel(ctx), 1, typeAttrs(e.RunRef, AttrSleepDurable.Bool(e.Durable)))
}

// Signal records a span for a signal sent (timed) or received, waited for or timed out.
func (h *Hooks) Signal(ctx context.Context, e *kagzi.SignalEvent) {
	name := "kagzi.signal." + strings.ToLower(string(e.Action)) + " " + e.Name
	attrs := []attribute.KeyValue{AttrNamespace.String(e.Namespace), AttrRunID.String(e.RunID),
		AttrSignalName.String(e.Name), AttrSignalAction.String(string(e.Action))}
	opts := []trace.SpanStartOption{trace.WithAttributes(attrs...)}
	var end []trace.SpanEndOption
	if e.Action == kagzi.SignalSent {
		opts = append(opts, trace.WithSpanKind(trace.SpanKindProducer), trace.WithTimestamp(e.Begin))
		end = append(end, trace.WithTimestamp(e.Begin.Add(e.Duration)))
	} else {
		opts = append(opts, trace.WithAttributes(AttrStepKey.String(e.Key)))
	}
	_, s := h.tracer.Start(ctx, name, opts...)
	recordError(s, e.Err)
	s.End(end...)
	h.signals.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(AttrNamespace.String(e.Namespace),
		AttrSignalAction.String(string(e.Action))))
}

// Claim measures a worker's claim statement and counts the runs it claimed (an
// eager start's claim counts its run; no statement ran to measure).
func (h *Hooks) Claim(ctx context.Context, e *kagzi.ClaimEvent) {
	bg := context.WithoutCancel(ctx)
	attrs := metric.WithAttributes(AttrNamespace.String(e.Namespace))
	if !e.Eager {
		h.claimDuration.Record(bg, e.Duration.Seconds(), attrs)
	}
	if e.Claimed > 0 {
		h.runsClaimed.Add(bg, int64(e.Claimed), attrs)
	}
}
