package kagziadmin

import (
	"context"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/admin/adminpb"
)

// features lists what every server offers, as GetServerInfo reports it.
var features = []string{"workflows", "workflows.attributes", "steps", "workers", "schedules", "flow", "health", "grpc.health.v1", "reflection"}

var runStatusOf = func() map[adminpb.WorkflowStatus]kagzi.RunStatus {
	m := map[adminpb.WorkflowStatus]kagzi.RunStatus{}
	for k, v := range workflowStatuses {
		m[v] = k
	}
	return m
}()

var workerStatusOf = func() map[adminpb.WorkerStatus]kagzi.WorkerStatus {
	m := map[adminpb.WorkerStatus]kagzi.WorkerStatus{}
	for k, v := range workerStatuses {
		m[v] = k
	}
	return m
}()

// GetWorkflow reads one run by run id, or by workflow id (the active run of the id,
// else its newest).
func (s *Server) GetWorkflow(ctx context.Context, req *adminpb.GetWorkflowRequest) (*adminpb.GetWorkflowResponse, error) {
	c, err := s.client(ctx, req.GetNamespace())
	if err != nil {
		return nil, err
	}
	var info *kagzi.RunInfo
	switch sel := req.GetSelector().(type) {
	case *adminpb.GetWorkflowRequest_RunId:
		info, err = c.GetRun(ctx, sel.RunId)
	case *adminpb.GetWorkflowRequest_WorkflowId:
		info, err = c.GetRunByWorkflowID(ctx, sel.WorkflowId)
	default:
		return nil, status.Error(codes.InvalidArgument, "name the run: run_id or workflow_id")
	}
	if err != nil {
		return nil, toStatus(err)
	}
	return &adminpb.GetWorkflowResponse{Workflow: workflowPB(info)}, nil
}

// ListWorkflows lists the namespace's runs, newest (or oldest) first, with ListRuns's
// filters.
func (s *Server) ListWorkflows(ctx context.Context, req *adminpb.ListWorkflowsRequest) (*adminpb.ListWorkflowsResponse, error) {
	const rpc = "ListWorkflows"
	c, err := s.client(ctx, req.GetNamespace())
	if err != nil {
		return nil, err
	}
	f, err := runFilter(req)
	if err != nil {
		return nil, err
	}
	if f.PageSize, err = pageSize(req.GetPage()); err != nil {
		return nil, err
	}
	if f.PageToken, err = decodePageToken(req.GetPage().GetPageToken(), rpc, c.Namespace()); err != nil {
		return nil, err
	}
	page, err := c.ListRuns(ctx, f)
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &adminpb.ListWorkflowsResponse{Page: pageInfo(encodePageToken(rpc, c.Namespace(), page.NextPageToken))}
	for i := range page.Runs {
		resp.Workflows = append(resp.Workflows, workflowPB(&page.Runs[i]))
	}
	return resp, nil
}

// runFilter is the kagzi.RunFilter of a ListWorkflows request, but for its page.
func runFilter(req *adminpb.ListWorkflowsRequest) (kagzi.RunFilter, error) {
	f := kagzi.RunFilter{WorkflowType: req.GetWorkflowType(), WorkflowTypes: req.GetWorkflowTypes(),
		WorkflowID: req.GetWorkflowId(), WorkflowIDPrefix: req.GetWorkflowIdPrefix(), ScheduleID: req.GetScheduleId(),
		ParentRunID: req.GetParentRunId(), RootOnly: req.GetRootOnly(), ErrorCode: req.GetErrorCode(),
		OldestFirst: req.GetOldestFirst(), IncludePayloads: req.GetIncludePayloads()}
	if req.GetAttributes() != nil {
		f.Attributes = req.GetAttributes().AsMap()
	}
	for _, st := range req.GetStatuses() {
		rs, ok := runStatusOf[st]
		if !ok {
			return f, status.Errorf(codes.InvalidArgument, "unknown workflow status %v", st)
		}
		f.Statuses = append(f.Statuses, rs)
	}
	var err error
	if f.CreatedAfter, err = timeFilter("created_after", req.GetCreatedAfter()); err != nil {
		return f, err
	}
	if f.CreatedBefore, err = timeFilter("created_before", req.GetCreatedBefore()); err != nil {
		return f, err
	}
	return f, nil
}

func timeFilter(field string, t *timestamppb.Timestamp) (time.Time, error) {
	if t == nil {
		return time.Time{}, nil
	}
	if err := t.CheckValid(); err != nil {
		return time.Time{}, status.Errorf(codes.InvalidArgument, "%s: %v", field, err)
	}
	return t.AsTime(), nil
}

// GetStep reads one recorded step of a run with its attempts. The key is
// "name#occurrence"; a plain name means the step's first occurrence.
func (s *Server) GetStep(ctx context.Context, req *adminpb.GetStepRequest) (*adminpb.GetStepResponse, error) {
	c, err := s.client(ctx, req.GetNamespace())
	if err != nil {
		return nil, err
	}
	if req.GetStepKey() == "" {
		return nil, status.Error(codes.InvalidArgument, "step_key is required")
	}
	steps, err := c.ListSteps(ctx, req.GetRunId())
	if err != nil {
		return nil, toStatus(err)
	}
	found := -1
	for i := range steps {
		if steps[i].Key == req.GetStepKey() {
			found = i
			break
		}
	}
	if found < 0 {
		for i := range steps {
			if steps[i].Name == req.GetStepKey() {
				found = i
				break
			}
		}
	}
	if found < 0 {
		return nil, status.Errorf(codes.NotFound, "run %s has no recorded step %q", req.GetRunId(), req.GetStepKey())
	}
	return &adminpb.GetStepResponse{Step: stepPB(c.Namespace(), req.GetRunId(), &steps[found])}, nil
}

// ListSteps lists the recorded steps of a run in the order they were first recorded,
// each with its attempt history, a page at a time. A step_name keeps the steps of that
// name; an empty one, like an unset one, filters nothing (as every empty filter field).
func (s *Server) ListSteps(ctx context.Context, req *adminpb.ListStepsRequest) (*adminpb.ListStepsResponse, error) {
	const rpc = "ListSteps"
	c, err := s.client(ctx, req.GetNamespace())
	if err != nil {
		return nil, err
	}
	size, err := pageSize(req.GetPage())
	if err != nil {
		return nil, err
	}
	cursor, err := decodePageToken(req.GetPage().GetPageToken(), rpc, c.Namespace())
	if err != nil {
		return nil, err
	}
	afterKey := ""
	if cursor != "" {
		run, key, ok := strings.Cut(cursor, "/")
		if !ok || run != req.GetRunId() {
			return nil, status.Error(codes.InvalidArgument, "page token belongs to another run")
		}
		afterKey = key
	}
	steps, err := c.ListSteps(ctx, req.GetRunId())
	if err != nil {
		return nil, toStatus(err)
	}
	start := 0
	if afterKey != "" {
		start = -1
		for i := range steps {
			if steps[i].Key == afterKey {
				start = i + 1
				break
			}
		}
		if start < 0 {
			return nil, status.Error(codes.InvalidArgument, "page token names a step the run no longer has")
		}
	}
	resp := &adminpb.ListStepsResponse{}
	last := ""
	for i := start; i < len(steps); i++ {
		if req.GetStepName() != "" && steps[i].Name != req.GetStepName() {
			continue
		}
		if len(resp.Steps) == size {
			// another matching step exists: the page ends at the last one taken
			resp.Page = pageInfo(encodePageToken(rpc, c.Namespace(), req.GetRunId()+"/"+last))
			return resp, nil
		}
		resp.Steps = append(resp.Steps, stepPB(c.Namespace(), req.GetRunId(), &steps[i]))
		last = steps[i].Key
	}
	resp.Page = pageInfo("")
	return resp, nil
}

// GetWorker reads a worker of the namespace from the registry.
func (s *Server) GetWorker(ctx context.Context, req *adminpb.GetWorkerRequest) (*adminpb.GetWorkerResponse, error) {
	c, err := s.client(ctx, req.GetNamespace())
	if err != nil {
		return nil, err
	}
	w, err := c.GetWorker(ctx, req.GetWorkerId())
	if err != nil {
		return nil, toStatus(err)
	}
	return &adminpb.GetWorkerResponse{Worker: workerPB(w)}, nil
}

// ListWorkers lists the namespace's workers from the registry, ordered by id.
func (s *Server) ListWorkers(ctx context.Context, req *adminpb.ListWorkersRequest) (*adminpb.ListWorkersResponse, error) {
	const rpc = "ListWorkers"
	c, err := s.client(ctx, req.GetNamespace())
	if err != nil {
		return nil, err
	}
	f := kagzi.WorkerFilter{WorkflowType: req.GetWorkflowType()}
	if f.PageSize, err = pageSize(req.GetPage()); err != nil {
		return nil, err
	}
	if f.PageToken, err = decodePageToken(req.GetPage().GetPageToken(), rpc, c.Namespace()); err != nil {
		return nil, err
	}
	for _, st := range req.GetStatuses() {
		ws, ok := workerStatusOf[st]
		if !ok {
			return nil, status.Errorf(codes.InvalidArgument, "unknown worker status %v", st)
		}
		f.Statuses = append(f.Statuses, ws)
	}
	page, err := c.ListWorkers(ctx, f)
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &adminpb.ListWorkersResponse{Page: pageInfo(encodePageToken(rpc, c.Namespace(), page.NextPageToken))}
	for i := range page.Workers {
		resp.Workers = append(resp.Workers, workerPB(&page.Workers[i]))
	}
	return resp, nil
}

// GetFlowLimits reads the flow-control limits of a workflow type of the namespace.
func (s *Server) GetFlowLimits(ctx context.Context, req *adminpb.GetFlowLimitsRequest) (*adminpb.GetFlowLimitsResponse, error) {
	c, err := s.client(ctx, req.GetNamespace())
	if err != nil {
		return nil, err
	}
	l, err := c.GetLimits(ctx, req.GetWorkflowType())
	if err != nil {
		return nil, toStatus(err)
	}
	return &adminpb.GetFlowLimitsResponse{Limits: limitsPB(c.Namespace(), l)}, nil
}

// ListFlowLimits lists the flow-control limits of the namespace's workflow types.
func (s *Server) ListFlowLimits(ctx context.Context, req *adminpb.ListFlowLimitsRequest) (*adminpb.ListFlowLimitsResponse, error) {
	c, err := s.client(ctx, req.GetNamespace())
	if err != nil {
		return nil, err
	}
	all, err := c.ListLimits(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &adminpb.ListFlowLimitsResponse{}
	for i := range all {
		resp.Limits = append(resp.Limits, limitsPB(c.Namespace(), &all[i]))
	}
	return resp, nil
}

// GetWorkflowSchedule reads a cron schedule of the namespace.
func (s *Server) GetWorkflowSchedule(ctx context.Context, req *adminpb.GetWorkflowScheduleRequest) (*adminpb.GetWorkflowScheduleResponse, error) {
	c, err := s.client(ctx, req.GetNamespace())
	if err != nil {
		return nil, err
	}
	sc, err := c.GetSchedule(ctx, req.GetScheduleId())
	if err != nil {
		return nil, toStatus(err)
	}
	return &adminpb.GetWorkflowScheduleResponse{Schedule: schedulePB(sc)}, nil
}

// ListWorkflowSchedules lists the namespace's cron schedules, ordered by id.
func (s *Server) ListWorkflowSchedules(ctx context.Context, req *adminpb.ListWorkflowSchedulesRequest) (*adminpb.ListWorkflowSchedulesResponse, error) {
	const rpc = "ListWorkflowSchedules"
	c, err := s.client(ctx, req.GetNamespace())
	if err != nil {
		return nil, err
	}
	f := kagzi.ScheduleFilter{WorkflowType: req.GetWorkflowType(), Paused: req.Paused}
	if f.PageSize, err = pageSize(req.GetPage()); err != nil {
		return nil, err
	}
	if f.PageToken, err = decodePageToken(req.GetPage().GetPageToken(), rpc, c.Namespace()); err != nil {
		return nil, err
	}
	page, err := c.ListSchedules(ctx, f)
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &adminpb.ListWorkflowSchedulesResponse{
		Page: pageInfo(encodePageToken(rpc, c.Namespace(), page.NextPageToken))}
	for i := range page.Schedules {
		resp.Schedules = append(resp.Schedules, schedulePB(&page.Schedules[i]))
	}
	return resp, nil
}

// HealthCheck reports the database, the schema version and the namespace's pending
// work that no live worker can take. It answers NOT_SERVING rather than failing.
func (s *Server) HealthCheck(ctx context.Context, req *adminpb.HealthCheckRequest) (*adminpb.HealthCheckResponse, error) {
	c, err := s.client(ctx, req.GetNamespace())
	if err != nil {
		return nil, err
	}
	h := c.Health(ctx)
	resp := &adminpb.HealthCheckResponse{
		Status:    adminpb.HealthCheckResponse_SERVING_STATUS_SERVING,
		Message:   "ok",
		Timestamp: timestamppb.Now(), DatabaseOk: h.DatabaseOK, DatabaseError: h.DatabaseError,
		SchemaVersion: h.SchemaVersion, LatestSchemaVersion: h.LatestSchemaVersion,
		SchemaCurrent: h.SchemaCurrent, PendingTypesWithoutWorker: h.PendingTypesWithoutWorker,
	}
	for _, w := range h.Workers {
		resp.LocalWorkers = append(resp.LocalWorkers, &adminpb.LocalWorkerHealth{WorkerId: w.ID,
			Status: workerStatuses[w.Status], LastHeartbeatAt: ts(w.LastHeartbeat), ActiveRuns: int32(w.ActiveRuns),
			AbandonedSteps: w.AbandonedSteps, Stale: w.Stale})
	}
	switch {
	case !h.DatabaseOK:
		resp.Status, resp.Message = adminpb.HealthCheckResponse_SERVING_STATUS_NOT_SERVING, "database: "+h.DatabaseError
	case h.DatabaseError != "":
		resp.Status, resp.Message = adminpb.HealthCheckResponse_SERVING_STATUS_NOT_SERVING, h.DatabaseError
	case !h.SchemaCurrent && !h.SchemaNewer:
		resp.Status, resp.Message = adminpb.HealthCheckResponse_SERVING_STATUS_NOT_SERVING,
			"schema not current: run kagzi.Migrate (or kagzi migrate up)"
	case !h.Healthy():
		resp.Status, resp.Message = adminpb.HealthCheckResponse_SERVING_STATUS_NOT_SERVING,
			"a worker of this process is stale (its heartbeats fail)"
	}
	return resp, nil
}

// GetServerInfo reports the library version, the API version, the schema version and
// the features this server offers. It reads no tenant data and needs no namespace.
func (s *Server) GetServerInfo(ctx context.Context, _ *adminpb.GetServerInfoRequest) (*adminpb.GetServerInfoResponse, error) {
	if err := s.authorize(ctx, ""); err != nil {
		return nil, err
	}
	h := s.base.Health(ctx)
	resp := &adminpb.GetServerInfoResponse{Version: kagzi.Version, ApiVersion: APIVersion,
		SchemaVersion: h.SchemaVersion, LatestSchemaVersion: h.LatestSchemaVersion,
		SupportedFeatures: append([]string(nil), features...)}
	if len(s.opts.tokens) > 0 {
		resp.SupportedFeatures = append(resp.SupportedFeatures, "auth.bearer")
	}
	if s.opts.certAuth {
		resp.SupportedFeatures = append(resp.SupportedFeatures, "auth.mtls")
	}
	return resp, nil
}
