package kagziadmin

import (
	"encoding/json"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/admin/adminpb"
)

var workflowStatuses = map[kagzi.RunStatus]adminpb.WorkflowStatus{
	kagzi.StatusPending:   adminpb.WorkflowStatus_WORKFLOW_STATUS_PENDING,
	kagzi.StatusRunning:   adminpb.WorkflowStatus_WORKFLOW_STATUS_RUNNING,
	kagzi.StatusSleeping:  adminpb.WorkflowStatus_WORKFLOW_STATUS_SLEEPING,
	kagzi.StatusCompleted: adminpb.WorkflowStatus_WORKFLOW_STATUS_COMPLETED,
	kagzi.StatusFailed:    adminpb.WorkflowStatus_WORKFLOW_STATUS_FAILED,
	kagzi.StatusCancelled: adminpb.WorkflowStatus_WORKFLOW_STATUS_CANCELLED,
}

var workerStatuses = map[kagzi.WorkerStatus]adminpb.WorkerStatus{
	kagzi.WorkerOnline:   adminpb.WorkerStatus_WORKER_STATUS_ONLINE,
	kagzi.WorkerDraining: adminpb.WorkerStatus_WORKER_STATUS_DRAINING,
	kagzi.WorkerOffline:  adminpb.WorkerStatus_WORKER_STATUS_OFFLINE,
}

// stepStatuses maps every step and attempt status of the kagzi package; a test
// checks that none is missing.
var stepStatuses = map[kagzi.StepStatus]adminpb.StepStatus{
	kagzi.StepCompleted: adminpb.StepStatus_STEP_STATUS_COMPLETED,
	kagzi.StepRetrying:  adminpb.StepStatus_STEP_STATUS_RETRYING,
	kagzi.StepFailed:    adminpb.StepStatus_STEP_STATUS_FAILED,
	kagzi.StepTimedOut:  adminpb.StepStatus_STEP_STATUS_TIMED_OUT,
	kagzi.StepWaiting:   adminpb.StepStatus_STEP_STATUS_WAITING,
	// Never recorded, so never listed; mapped so that no status is UNSPECIFIED.
	kagzi.StepInterrupted: adminpb.StepStatus_STEP_STATUS_INTERRUPTED,
}

// kindBranch is the kind of a Go or Map call (unexported in the kagzi package): it
// takes a position but records no step, so no listed step has it.
const kindBranch kagzi.StepKind = "BRANCH"

// stepKinds maps every step kind of the kagzi package; a test checks that none is
// missing.
var stepKinds = map[kagzi.StepKind]adminpb.StepKind{
	kagzi.KindStep:       adminpb.StepKind_STEP_KIND_FUNCTION,
	kagzi.KindSleep:      adminpb.StepKind_STEP_KIND_SLEEP,
	kagzi.KindChild:      adminpb.StepKind_STEP_KIND_CHILD,
	kagzi.KindSignal:     adminpb.StepKind_STEP_KIND_SIGNAL,
	kagzi.KindEvent:      adminpb.StepKind_STEP_KIND_EVENT,
	kagzi.KindPatch:      adminpb.StepKind_STEP_KIND_PATCH,
	kagzi.KindAttributes: adminpb.StepKind_STEP_KIND_ATTRIBUTES,
	kindBranch:           adminpb.StepKind_STEP_KIND_BRANCH,
}

var overlapPolicies = map[kagzi.OverlapPolicy]adminpb.OverlapPolicy{
	kagzi.OverlapAllow:     adminpb.OverlapPolicy_OVERLAP_POLICY_ALLOW,
	kagzi.OverlapSkip:      adminpb.OverlapPolicy_OVERLAP_POLICY_SKIP,
	kagzi.OverlapBufferOne: adminpb.OverlapPolicy_OVERLAP_POLICY_BUFFER_ONE,
}

func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func tsp(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return ts(*t)
}

func payload(raw json.RawMessage) *adminpb.Payload {
	if len(raw) == 0 {
		return nil
	}
	return &adminpb.Payload{Data: raw, Metadata: map[string]string{"encoding": "json"}}
}

func errorDetail(d *kagzi.ErrorDetail) *adminpb.ErrorDetail {
	if d == nil {
		return nil
	}
	pd := &adminpb.ErrorDetail{Code: d.Code, Message: d.Message, NonRetryable: d.NonRetryable,
		Subject: d.Subject, Metadata: d.Metadata}
	if d.RetryAfter > 0 {
		pd.RetryAfter = durationpb.New(d.RetryAfter)
	}
	return pd
}

func optString(s string) *string {
	if s == "" {
		return nil
	}
	return proto.String(s)
}

func workflowPB(r *kagzi.RunInfo) *adminpb.Workflow {
	return &adminpb.Workflow{
		RunId: r.RunID, WorkflowId: r.WorkflowID, Namespace: r.Namespace, WorkflowType: r.WorkflowType,
		Status: workflowStatuses[r.Status], Input: payload(r.Input), Output: payload(r.Output),
		Error: errorDetail(r.Error), Attempt: int32(r.Attempt), CreatedAt: ts(r.CreatedAt),
		StartedAt: tsp(r.StartedAt), FinishedAt: tsp(r.FinishedAt), AvailableAt: ts(r.AvailableAt),
		UpdatedAt: ts(r.UpdatedAt), WorkerId: r.LockedBy, CancelRequested: r.CancelRequested,
		ScheduleId: optString(r.ScheduleID), ScheduleTick: tsp(r.ScheduleTick),
		Attributes: attributesPB(r.Attributes), Deadline: tsp(r.Deadline), ParentRunId: optString(r.ParentRunID),
		Priority: int32(r.Priority), ConcurrencyKey: optString(r.ConcurrencyKey), DebounceKey: optString(r.DebounceKey),
		Hold: holdPB(r.Hold), ContinuedFromRunId: optString(r.ContinuedFromRunID),
		ContinuedAsRunId: optString(r.ContinuedAsRunID),
	}
}

func holdPB(h *kagzi.Hold) *adminpb.FlowHold {
	if h == nil {
		return nil
	}
	return &adminpb.FlowHold{Limit: h.Limit, Until: tsp(h.Until)}
}

func limitsPB(namespace string, l *kagzi.Limits) *adminpb.FlowLimits {
	pl := &adminpb.FlowLimits{Namespace: namespace, WorkflowType: l.WorkflowType, Concurrency: int32(l.Concurrency),
		KeyConcurrency: int32(l.KeyConcurrency), Rate: int32(l.Rate), KeyRate: int32(l.KeyRate), UpdatedAt: ts(l.UpdatedAt)}
	if l.RatePeriod > 0 {
		pl.RatePeriod = durationpb.New(l.RatePeriod)
	}
	if l.KeyRatePeriod > 0 {
		pl.KeyRatePeriod = durationpb.New(l.KeyRatePeriod)
	}
	return pl
}

// attributesPB is a run's attributes as a Struct; nil when it has none.
func attributesPB(attrs map[string]any) *structpb.Struct {
	if len(attrs) == 0 {
		return nil
	}
	return structOf(attrs)
}

func structOf(m map[string]any) *structpb.Struct {
	s := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(m))}
	for k, v := range m {
		s.Fields[k] = attributePB(v)
	}
	return s
}

// attributePB is an attribute's value as a Struct holds it: a number as a double
// (rounded beyond ±2^53), and one no double holds (beyond ±1.8e308) as its digits in
// a string, so that one such value does not lose the run's other attributes.
func attributePB(v any) *structpb.Value {
	switch x := v.(type) {
	case json.Number:
		if f, err := x.Float64(); err == nil {
			return structpb.NewNumberValue(f)
		}
		return structpb.NewStringValue(x.String())
	case map[string]any:
		return structpb.NewStructValue(structOf(x))
	case []any:
		l := &structpb.ListValue{Values: make([]*structpb.Value, len(x))}
		for i, e := range x {
			l.Values[i] = attributePB(e)
		}
		return structpb.NewListValue(l)
	}
	if pv, err := structpb.NewValue(v); err == nil {
		return pv
	}
	return structpb.NewNullValue()
}

func stepPB(namespace, runID string, s *kagzi.StepInfo) *adminpb.Step {
	ps := &adminpb.Step{
		StepId: runID + "/" + s.Key, RunId: runID, Namespace: namespace, Key: s.Key, Name: s.Name,
		Kind: stepKinds[s.Kind], Status: stepStatuses[s.Status], Output: payload(s.Output),
		Error: errorDetail(s.Error), WakeAt: tsp(s.WakeAt), CreatedAt: ts(s.CreatedAt), UpdatedAt: ts(s.UpdatedAt),
	}
	for _, a := range s.Attempts {
		ps.Attempts = append(ps.Attempts, &adminpb.StepAttempt{Number: int32(a.Number),
			Status: stepStatuses[a.Status], Error: errorDetail(a.Error), StartedAt: ts(a.StartedAt),
			FinishedAt: ts(a.FinishedAt)})
	}
	return ps
}

func workerPB(w *kagzi.WorkerInfo) *adminpb.Worker {
	pw := &adminpb.Worker{
		WorkerId: w.ID, Namespace: w.Namespace, Status: workerStatuses[w.Status], Hostname: w.Hostname,
		Pid: int32(w.PID), Version: w.Version, WorkflowTypes: w.WorkflowTypes, MaxConcurrent: int32(w.MaxConcurrent),
		ActiveCount: int32(w.ActiveRuns), TotalCompleted: w.CompletedTotal, TotalFailed: w.FailedTotal,
		RegisteredAt: ts(w.StartedAt), LastHeartbeatAt: ts(w.LastHeartbeatAt), StoppedAt: tsp(w.StoppedAt),
		Labels: w.Labels,
	}
	if w.HeartbeatInterval > 0 {
		pw.HeartbeatInterval = durationpb.New(w.HeartbeatInterval)
	}
	return pw
}

func schedulePB(s *kagzi.ScheduleInfo) *adminpb.WorkflowSchedule {
	return &adminpb.WorkflowSchedule{
		ScheduleId: s.ID, Namespace: s.Namespace, WorkflowType: s.WorkflowType, CronExpr: s.Cron,
		CronSeconds: s.Seconds, TimeZone: s.TimeZone, Input: payload(s.Input), Paused: s.Paused,
		MaxCatchup: int32(s.MaxCatchup), Overlap: overlapPolicies[s.Overlap], NextFireAt: tsp(s.NextFireAt),
		LastFiredAt: tsp(s.LastFiredAt), LastRunId: optString(s.LastRunID), BufferedTick: tsp(s.BufferedTick),
		CatchupSkipped: s.CatchupSkipped, OverlapSkipped: s.OverlapSkipped, CreatedAt: ts(s.CreatedAt),
		UpdatedAt: ts(s.UpdatedAt),
	}
}
