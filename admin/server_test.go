package kagziadmin_test

import (
	"context"
	"encoding/json"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kagzi/kagzi"
	kagziadmin "github.com/kagzi/kagzi/admin"
	"github.com/kagzi/kagzi/admin/adminpb"
	"github.com/kagzi/kagzi/internal/testdb"
)

func TestEveryRPCAnswersOverARealListener(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	c := admin(t, f.addr, token)

	info, err := c.GetServerInfo(ctx, &adminpb.GetServerInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Version != kagzi.Version || info.ApiVersion != "kagzi.v1" || info.SchemaVersion == 0 ||
		info.SchemaVersion != info.LatestSchemaVersion || !slices.Contains(info.SupportedFeatures, "auth.bearer") ||
		!slices.Contains(info.SupportedFeatures, "schedules") || !slices.Contains(info.SupportedFeatures, "workflows.attributes") {
		t.Fatalf("server info: %v", info)
	}

	got, err := c.GetWorkflow(ctx, &adminpb.GetWorkflowRequest{Namespace: nsA,
		Selector: &adminpb.GetWorkflowRequest_RunId{RunId: f.greets[0]}})
	if err != nil {
		t.Fatal(err)
	}
	wf := got.Workflow
	if wf.RunId != f.greets[0] || wf.WorkflowId != "greet-ada" || wf.Namespace != nsA || wf.WorkflowType != "greet" ||
		wf.Status != adminpb.WorkflowStatus_WORKFLOW_STATUS_COMPLETED || wf.Attempt != 1 ||
		string(wf.Output.GetData()) != `"hello ada!"` || wf.Output.GetMetadata()["encoding"] != "json" ||
		!strings.Contains(string(wf.Input.GetData()), `"ada"`) || wf.CreatedAt == nil || wf.FinishedAt == nil ||
		wf.StartedAt == nil || wf.Error != nil {
		t.Fatalf("GetWorkflow: %v", wf)
	}
	byID, err := c.GetWorkflow(ctx, &adminpb.GetWorkflowRequest{Namespace: nsA,
		Selector: &adminpb.GetWorkflowRequest_WorkflowId{WorkflowId: "boom-1"}})
	if err != nil {
		t.Fatal(err)
	}
	if e := byID.Workflow.Error; byID.Workflow.RunId != f.failed ||
		byID.Workflow.Status != adminpb.WorkflowStatus_WORKFLOW_STATUS_FAILED || e.GetCode() != "KABOOM" ||
		!strings.Contains(e.GetMessage(), "it exploded") || !e.GetNonRetryable() {
		t.Fatalf("GetWorkflow by workflow id: %v", byID.Workflow)
	}

	list, err := c.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Workflows) != 8 || list.Page.GetHasMore() || list.Page.GetNextPageToken() != "" {
		t.Fatalf("ListWorkflows: %d runs, page %v; want all 8 of team-a on one page", len(list.Workflows), list.Page)
	}

	step, err := c.GetStep(ctx, &adminpb.GetStepRequest{Namespace: nsA, RunId: f.greets[1], StepKey: "flaky#1"})
	if err != nil {
		t.Fatal(err)
	}
	s := step.Step
	if s.Key != "flaky#1" || s.Name != "flaky" || s.Kind != adminpb.StepKind_STEP_KIND_FUNCTION ||
		s.Status != adminpb.StepStatus_STEP_STATUS_COMPLETED || s.StepId != f.greets[1]+"/flaky#1" ||
		string(s.Output.GetData()) != `"hello bob!"` || len(s.Attempts) != 2 ||
		s.Attempts[0].Status != adminpb.StepStatus_STEP_STATUS_FAILED || s.Attempts[0].Error.GetCode() != "FLAKY" ||
		s.Attempts[1].Status != adminpb.StepStatus_STEP_STATUS_COMPLETED || s.Attempts[1].Number != 2 ||
		s.Attempts[0].StartedAt == nil || s.Attempts[0].FinishedAt == nil {
		t.Fatalf("GetStep: %v", s)
	}
	byName, err := c.GetStep(ctx, &adminpb.GetStepRequest{Namespace: nsA, RunId: f.greets[1], StepKey: "compose"})
	if err != nil || byName.Step.Key != "compose#1" {
		t.Fatalf("GetStep by plain name: %v, %v", byName, err)
	}

	steps, err := c.ListSteps(ctx, &adminpb.ListStepsRequest{Namespace: nsA, RunId: f.failed})
	if err != nil {
		t.Fatal(err)
	}
	if len(steps.Steps) != 1 || steps.Steps[0].Status != adminpb.StepStatus_STEP_STATUS_FAILED ||
		steps.Steps[0].Error.GetCode() != "KABOOM" || len(steps.Steps[0].Attempts) != 1 || steps.Page.GetHasMore() {
		t.Fatalf("ListSteps of the failed run: %v", steps)
	}

	wk, err := c.GetWorker(ctx, &adminpb.GetWorkerRequest{Namespace: nsA, WorkerId: f.worker})
	if err != nil {
		t.Fatal(err)
	}
	w := wk.Worker
	if w.WorkerId != f.worker || w.Namespace != nsA || w.Status != adminpb.WorkerStatus_WORKER_STATUS_OFFLINE ||
		w.Labels["region"] != "test" || !slices.Equal(w.WorkflowTypes, []string{"greet", "boom"}) || w.Pid == 0 ||
		w.Version != kagzi.Version || w.TotalCompleted != 5 || w.TotalFailed != 1 || w.StoppedAt == nil ||
		w.HeartbeatInterval.AsDuration() != 250*time.Millisecond {
		t.Fatalf("GetWorker: %v", w)
	}
	workers, err := c.ListWorkers(ctx, &adminpb.ListWorkersRequest{Namespace: nsA})
	if err != nil {
		t.Fatal(err)
	}
	if len(workers.Workers) != 1 || workers.Workers[0].WorkerId != f.worker {
		t.Fatalf("ListWorkers: %v", workers)
	}

	sc, err := c.GetWorkflowSchedule(ctx, &adminpb.GetWorkflowScheduleRequest{Namespace: nsA, ScheduleId: "hourly-sync"})
	if err != nil {
		t.Fatal(err)
	}
	if p := sc.Schedule; p.ScheduleId != "hourly-sync" || p.WorkflowType != "later" || p.CronExpr != "0 * * * *" ||
		!p.Paused || p.NextFireAt != nil || p.Overlap != adminpb.OverlapPolicy_OVERLAP_POLICY_SKIP || p.TimeZone == "" {
		t.Fatalf("GetWorkflowSchedule: %v", p)
	}
	scs, err := c.ListWorkflowSchedules(ctx, &adminpb.ListWorkflowSchedulesRequest{Namespace: nsA})
	if err != nil {
		t.Fatal(err)
	}
	if len(scs.Schedules) != 2 || scs.Schedules[0].ScheduleId != "daily-report" || scs.Schedules[0].MaxCatchup != 3 ||
		scs.Schedules[0].NextFireAt == nil || !strings.Contains(string(scs.Schedules[0].Input.GetData()), `"report"`) {
		t.Fatalf("ListWorkflowSchedules: %v", scs)
	}
	active, err := c.ListWorkflowSchedules(ctx, &adminpb.ListWorkflowSchedulesRequest{Namespace: nsA, Paused: proto.Bool(false)})
	if err != nil || len(active.Schedules) != 1 || active.Schedules[0].ScheduleId != "daily-report" {
		t.Fatalf("ListWorkflowSchedules paused=false: %v, %v", active, err)
	}

	h, err := c.HealthCheck(ctx, &adminpb.HealthCheckRequest{Namespace: nsA})
	if err != nil {
		t.Fatal(err)
	}
	if h.Status != adminpb.HealthCheckResponse_SERVING_STATUS_SERVING || !h.DatabaseOk || !h.SchemaCurrent ||
		!slices.Equal(h.PendingTypesWithoutWorker, []string{"later"}) || h.Timestamp == nil {
		t.Fatalf("HealthCheck: %v", h)
	}
}

func TestListWorkflowsPagesThroughEveryRunOnceAndFilters(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	c := admin(t, f.addr, token)

	var seen []string
	tok := ""
	pages := 0
	for {
		resp, err := c.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA,
			Page: &adminpb.PageRequest{PageSize: 3, PageToken: tok}})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(resp.Workflows) > 3 {
			t.Fatalf("page of %d runs, want at most 3", len(resp.Workflows))
		}
		for _, w := range resp.Workflows {
			seen = append(seen, w.RunId)
		}
		if resp.Page.GetHasMore() != (resp.Page.GetNextPageToken() != "") {
			t.Fatalf("page info inconsistent: %v", resp.Page)
		}
		if !resp.Page.GetHasMore() {
			break
		}
		tok = resp.Page.GetNextPageToken()
	}
	want := []string{f.cancel, f.pending, f.failed, f.greets[4], f.greets[3], f.greets[2], f.greets[1], f.greets[0]}
	if pages != 3 || !slices.Equal(seen, want) {
		t.Fatalf("paged %d times and saw %v, want 3 pages of %v (newest first, each once)", pages, seen, want)
	}

	filtered := func(req *adminpb.ListWorkflowsRequest) []string {
		t.Helper()
		req.Namespace = nsA
		resp, err := c.ListWorkflows(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, w := range resp.Workflows {
			ids = append(ids, w.RunId)
		}
		return ids
	}
	if got := filtered(&adminpb.ListWorkflowsRequest{Statuses: []adminpb.WorkflowStatus{
		adminpb.WorkflowStatus_WORKFLOW_STATUS_FAILED, adminpb.WorkflowStatus_WORKFLOW_STATUS_CANCELLED}}); !slices.Equal(got, []string{f.cancel, f.failed}) {
		t.Fatalf("status filter: %v", got)
	}
	if got := filtered(&adminpb.ListWorkflowsRequest{WorkflowType: proto.String("later")}); !slices.Equal(got, []string{f.cancel, f.pending}) {
		t.Fatalf("type filter: %v", got)
	}
	if got := filtered(&adminpb.ListWorkflowsRequest{WorkflowId: proto.String("greet-cy")}); !slices.Equal(got, []string{f.greets[2]}) {
		t.Fatalf("workflow id filter: %v", got)
	}
	if got := filtered(&adminpb.ListWorkflowsRequest{ScheduleId: proto.String("daily-report")}); len(got) != 0 {
		t.Fatalf("schedule filter: %v, want none (nothing fired yet)", got)
	}
	third, err := f.a.GetRun(ctx, f.greets[2])
	if err != nil {
		t.Fatal(err)
	}
	if got := filtered(&adminpb.ListWorkflowsRequest{WorkflowType: proto.String("greet"),
		CreatedAfter:  timestamppb.New(third.CreatedAt),
		CreatedBefore: timestamppb.New(third.CreatedAt.Add(time.Microsecond))}); !slices.Equal(got, []string{f.greets[2]}) {
		t.Fatalf("created_after/created_before: %v, want just %s", got, f.greets[2])
	}
}

func TestListStepsPagesThroughStepsWithTheirAttemptHistory(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	c := admin(t, f.addr, token)

	first, err := c.ListSteps(ctx, &adminpb.ListStepsRequest{Namespace: nsA, RunId: f.greets[0],
		Page: &adminpb.PageRequest{PageSize: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Steps) != 1 || first.Steps[0].Key != "compose#1" || !first.Page.GetHasMore() {
		t.Fatalf("first page: %v", first)
	}
	second, err := c.ListSteps(ctx, &adminpb.ListStepsRequest{Namespace: nsA, RunId: f.greets[0],
		Page: &adminpb.PageRequest{PageSize: 1, PageToken: first.Page.GetNextPageToken()}})
	if err != nil {
		t.Fatal(err)
	}
	if len(second.Steps) != 1 || second.Steps[0].Key != "flaky#1" || second.Page.GetHasMore() {
		t.Fatalf("second page: %v", second)
	}
	if a := second.Steps[0].Attempts; len(a) != 2 || a[0].Number != 1 || a[0].Error.GetMessage() != "try again" {
		t.Fatalf("attempt history: %v", a)
	}
	named, err := c.ListSteps(ctx, &adminpb.ListStepsRequest{Namespace: nsA, RunId: f.greets[0], StepName: proto.String("flaky")})
	if err != nil || len(named.Steps) != 1 || named.Steps[0].Name != "flaky" {
		t.Fatalf("step_name filter: %v, %v", named, err)
	}
	// A token of one run does not page another.
	_, err = c.ListSteps(ctx, &adminpb.ListStepsRequest{Namespace: nsA, RunId: f.greets[1],
		Page: &adminpb.PageRequest{PageSize: 1, PageToken: first.Page.GetNextPageToken()}})
	wantCode(t, err, codes.InvalidArgument)
}

func TestListWorkersAndSchedulesFilterAndPage(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	c := admin(t, f.addr, token)
	// Two more workers in team-a, online while the test runs.
	for _, id := range []string{"worker-b", "worker-c"} {
		w, err := kagzi.NewWorker(f.a, kagzi.WorkerConfig{ID: id, DisableScheduler: true}, Boom)
		if err != nil {
			t.Fatal(err)
		}
		wctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(wctx) }()
		t.Cleanup(func() { stop(); <-done })
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := c.ListWorkers(ctx, &adminpb.ListWorkersRequest{Namespace: nsA,
			Statuses: []adminpb.WorkerStatus{adminpb.WorkerStatus_WORKER_STATUS_ONLINE}})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Workers) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("online workers: %v", resp.Workers)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var ids []string
	tok := ""
	for {
		resp, err := c.ListWorkers(ctx, &adminpb.ListWorkersRequest{Namespace: nsA,
			Page: &adminpb.PageRequest{PageSize: 2, PageToken: tok}})
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range resp.Workers {
			ids = append(ids, w.WorkerId)
		}
		if tok = resp.Page.GetNextPageToken(); tok == "" {
			break
		}
	}
	if !slices.Equal(ids, []string{"worker-a", "worker-b", "worker-c"}) {
		t.Fatalf("paged workers: %v", ids)
	}
	greeters, err := c.ListWorkers(ctx, &adminpb.ListWorkersRequest{Namespace: nsA, WorkflowType: proto.String("greet")})
	if err != nil || len(greeters.Workers) != 1 || greeters.Workers[0].WorkerId != "worker-a" {
		t.Fatalf("workflow_type filter: %v, %v", greeters, err)
	}

	page1, err := c.ListWorkflowSchedules(ctx, &adminpb.ListWorkflowSchedulesRequest{Namespace: nsA,
		Page: &adminpb.PageRequest{PageSize: 1}})
	if err != nil || len(page1.Schedules) != 1 || !page1.Page.GetHasMore() {
		t.Fatalf("schedules page 1: %v, %v", page1, err)
	}
	page2, err := c.ListWorkflowSchedules(ctx, &adminpb.ListWorkflowSchedulesRequest{Namespace: nsA,
		Page: &adminpb.PageRequest{PageSize: 1, PageToken: page1.Page.GetNextPageToken()}})
	if err != nil || len(page2.Schedules) != 1 || page2.Schedules[0].ScheduleId != "hourly-sync" || page2.Page.GetHasMore() {
		t.Fatalf("schedules page 2: %v, %v", page2, err)
	}
	byType, err := c.ListWorkflowSchedules(ctx, &adminpb.ListWorkflowSchedulesRequest{Namespace: nsA, WorkflowType: proto.String("greet")})
	if err != nil || len(byType.Schedules) != 1 || byType.Schedules[0].ScheduleId != "daily-report" {
		t.Fatalf("schedules by type: %v, %v", byType, err)
	}
}

func TestRequestsWithoutValidCredentialsAreUnauthenticated(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	for name, tok := range map[string]string{"no token": "", "wrong token": "not-the-token"} {
		c := admin(t, f.addr, tok)
		_, err := c.GetServerInfo(ctx, &adminpb.GetServerInfoRequest{})
		wantCode(t, err, codes.Unauthenticated)
		_, err = c.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA})
		wantCode(t, err, codes.Unauthenticated)
		_, err = c.GetWorkflow(ctx, &adminpb.GetWorkflowRequest{Namespace: nsA,
			Selector: &adminpb.GetWorkflowRequest_RunId{RunId: f.greets[0]}})
		wantCode(t, err, codes.Unauthenticated)
		// Reflection needs credentials too.
		stream, err := reflectionpb.NewServerReflectionClient(dial(t, f.addr, tok)).ServerReflectionInfo(ctx)
		if err == nil {
			_, err = stream.Recv()
		}
		wantCode(t, err, codes.Unauthenticated)
		t.Logf("%s: rejected", name)
	}
}

func TestAConfiguredTokenEndingInANewlineOrSpacesAuthenticatesItsToken(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool, _ := testdb.NewPool(t)
	// As read from a secret file: the token, then a newline (or spaces around it).
	addr := serve(t, newClient(t, pool, nsA), kagziadmin.WithBearerToken("from-a-file\n"),
		kagziadmin.WithBearerToken("  spaced\t"))
	for _, tok := range []string{"from-a-file", "spaced"} {
		if _, err := admin(t, addr, tok).ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA}); err != nil {
			t.Errorf("token %q: %v, want accepted", tok, err)
		}
	}
	_, err := admin(t, addr, "from-a-file-not").ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA})
	wantCode(t, err, codes.Unauthenticated)
}

func TestStandardHealthServiceAnswersWithoutCredentials(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	h := healthpb.NewHealthClient(dial(t, f.addr, ""))
	for _, svc := range []string{"", "kagzi.v1.AdminService"} {
		resp, err := h.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health of %q: %v", svc, resp.Status)
		}
	}
}

func TestServerReflectionListsTheAdminService(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	stream, err := reflectionpb.NewServerReflectionClient(dial(t, f.addr, token)).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	for _, want := range []string{"kagzi.v1.AdminService", "grpc.health.v1.Health"} {
		if !slices.Contains(names, want) {
			t.Fatalf("reflection lists %v, want %s among them", names, want)
		}
	}
}

func TestRequestWithoutNamespaceIsInvalidArgumentNeverDefaulted(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	c := admin(t, f.addr, token)
	calls := map[string]func() error{
		"GetWorkflow": func() error {
			_, err := c.GetWorkflow(ctx, &adminpb.GetWorkflowRequest{Selector: &adminpb.GetWorkflowRequest_RunId{RunId: f.greets[0]}})
			return err
		},
		"ListWorkflows": func() error { _, err := c.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{}); return err },
		"GetStep": func() error {
			_, err := c.GetStep(ctx, &adminpb.GetStepRequest{RunId: f.greets[0], StepKey: "compose#1"})
			return err
		},
		"ListSteps": func() error {
			_, err := c.ListSteps(ctx, &adminpb.ListStepsRequest{RunId: f.greets[0]})
			return err
		},
		"GetWorker": func() error {
			_, err := c.GetWorker(ctx, &adminpb.GetWorkerRequest{WorkerId: f.worker})
			return err
		},
		"ListWorkers": func() error { _, err := c.ListWorkers(ctx, &adminpb.ListWorkersRequest{}); return err },
		"GetWorkflowSchedule": func() error {
			_, err := c.GetWorkflowSchedule(ctx, &adminpb.GetWorkflowScheduleRequest{ScheduleId: "daily-report"})
			return err
		},
		"ListWorkflowSchedules": func() error {
			_, err := c.ListWorkflowSchedules(ctx, &adminpb.ListWorkflowSchedulesRequest{})
			return err
		},
		"HealthCheck": func() error { _, err := c.HealthCheck(ctx, &adminpb.HealthCheckRequest{}); return err },
	}
	for name, call := range calls {
		err := call()
		wantCode(t, err, codes.InvalidArgument)
		if !strings.Contains(err.Error(), "namespace is required") {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

func TestNamespacesAreIsolated(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	c := admin(t, f.addr, token)

	// team-b's run, worker-less registry and schedule are invisible from team-a, and
	// team-a's from team-b.
	_, err := c.GetWorkflow(ctx, &adminpb.GetWorkflowRequest{Namespace: nsA,
		Selector: &adminpb.GetWorkflowRequest_RunId{RunId: f.bRun}})
	wantCode(t, err, codes.NotFound)
	_, err = c.GetWorkflow(ctx, &adminpb.GetWorkflowRequest{Namespace: nsB,
		Selector: &adminpb.GetWorkflowRequest_RunId{RunId: f.greets[0]}})
	wantCode(t, err, codes.NotFound)
	_, err = c.ListSteps(ctx, &adminpb.ListStepsRequest{Namespace: nsB, RunId: f.greets[0]})
	wantCode(t, err, codes.NotFound)
	_, err = c.GetWorker(ctx, &adminpb.GetWorkerRequest{Namespace: nsB, WorkerId: f.worker})
	wantCode(t, err, codes.NotFound)
	_, err = c.GetWorkflowSchedule(ctx, &adminpb.GetWorkflowScheduleRequest{Namespace: nsB, ScheduleId: "daily-report"})
	wantCode(t, err, codes.NotFound)

	bList, err := c.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsB})
	if err != nil {
		t.Fatal(err)
	}
	if len(bList.Workflows) != 1 || bList.Workflows[0].RunId != f.bRun || bList.Workflows[0].Namespace != nsB {
		t.Fatalf("team-b lists %v, want only its own run", bList.Workflows)
	}
	bWorkers, err := c.ListWorkers(ctx, &adminpb.ListWorkersRequest{Namespace: nsB})
	if err != nil || len(bWorkers.Workers) != 0 {
		t.Fatalf("team-b workers: %v, %v", bWorkers, err)
	}
	bSchedules, err := c.ListWorkflowSchedules(ctx, &adminpb.ListWorkflowSchedulesRequest{Namespace: nsB})
	if err != nil || len(bSchedules.Schedules) != 1 || bSchedules.Schedules[0].ScheduleId != "b-schedule" {
		t.Fatalf("team-b schedules: %v, %v", bSchedules, err)
	}
	bHealth, err := c.HealthCheck(ctx, &adminpb.HealthCheckRequest{Namespace: nsB})
	if err != nil || !slices.Equal(bHealth.PendingTypesWithoutWorker, []string{"greet"}) {
		t.Fatalf("team-b health: %v, %v", bHealth, err)
	}

	// A page token of team-a does not page team-b.
	aPage, err := c.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA, Page: &adminpb.PageRequest{PageSize: 1}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsB,
		Page: &adminpb.PageRequest{PageToken: aPage.Page.GetNextPageToken()}})
	wantCode(t, err, codes.InvalidArgument)

	// A token limited to team-b reads team-b only.
	cb := admin(t, f.addr, tokenB)
	if _, err := cb.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsB}); err != nil {
		t.Fatal(err)
	}
	_, err = cb.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA})
	wantCode(t, err, codes.PermissionDenied)

	// A server without WithNamespaces answers for its client's namespace only.
	single := admin(t, serve(t, f.a), "")
	if _, err := single.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA}); err != nil {
		t.Fatal(err)
	}
	_, err = single.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsB})
	wantCode(t, err, codes.PermissionDenied)

	// OnlyNamespaces refuses the namespaces it does not list.
	only := admin(t, serve(t, f.a, kagziadmin.WithNamespaces(kagziadmin.OnlyNamespaces(
		kagziadmin.PoolClients(f.pool, kagzi.Config{Logger: quietLogger()}), nsB))), "")
	if _, err := only.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsB}); err != nil {
		t.Fatal(err)
	}
	_, err = only.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: "team-c"})
	wantCode(t, err, codes.PermissionDenied)
}

func TestUnknownIdsAreNotFound(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	c := admin(t, f.addr, token)
	const missing = "01890000-0000-7000-8000-000000000000"
	_, err := c.GetWorkflow(ctx, &adminpb.GetWorkflowRequest{Namespace: nsA, Selector: &adminpb.GetWorkflowRequest_RunId{RunId: missing}})
	wantCode(t, err, codes.NotFound)
	_, err = c.GetWorkflow(ctx, &adminpb.GetWorkflowRequest{Namespace: nsA, Selector: &adminpb.GetWorkflowRequest_WorkflowId{WorkflowId: "nope"}})
	wantCode(t, err, codes.NotFound)
	_, err = c.GetStep(ctx, &adminpb.GetStepRequest{Namespace: nsA, RunId: f.greets[0], StepKey: "nope#1"})
	wantCode(t, err, codes.NotFound)
	_, err = c.GetStep(ctx, &adminpb.GetStepRequest{Namespace: nsA, RunId: missing, StepKey: "compose#1"})
	wantCode(t, err, codes.NotFound)
	_, err = c.ListSteps(ctx, &adminpb.ListStepsRequest{Namespace: nsA, RunId: missing})
	wantCode(t, err, codes.NotFound)
	_, err = c.GetWorker(ctx, &adminpb.GetWorkerRequest{Namespace: nsA, WorkerId: "nope"})
	wantCode(t, err, codes.NotFound)
	_, err = c.GetWorkflowSchedule(ctx, &adminpb.GetWorkflowScheduleRequest{Namespace: nsA, ScheduleId: "nope"})
	wantCode(t, err, codes.NotFound)
}

func TestMalformedRequestsAreInvalidArgument(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	c := admin(t, f.addr, token)
	_, err := c.GetWorkflow(ctx, &adminpb.GetWorkflowRequest{Namespace: nsA, Selector: &adminpb.GetWorkflowRequest_RunId{RunId: "not-a-uuid"}})
	wantCode(t, err, codes.InvalidArgument)
	_, err = c.GetWorkflow(ctx, &adminpb.GetWorkflowRequest{Namespace: nsA})
	wantCode(t, err, codes.InvalidArgument)
	_, err = c.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA, Page: &adminpb.PageRequest{PageSize: 5000}})
	wantCode(t, err, codes.InvalidArgument)
	_, err = c.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA, Page: &adminpb.PageRequest{PageToken: "garbage"}})
	wantCode(t, err, codes.InvalidArgument)
	_, err = c.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA,
		Statuses: []adminpb.WorkflowStatus{adminpb.WorkflowStatus_WORKFLOW_STATUS_UNSPECIFIED}})
	wantCode(t, err, codes.InvalidArgument)
	_, err = c.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: "bad\nnamespace"})
	wantCode(t, err, codes.InvalidArgument)
	// A token of ListWorkers does not page ListWorkflows.
	wp, err := c.ListWorkers(ctx, &adminpb.ListWorkersRequest{Namespace: nsA, Page: &adminpb.PageRequest{PageSize: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if wp.Page.GetNextPageToken() == "" {
		// One worker: make a ListWorkflows token and give it to ListWorkers instead.
		rp, err := c.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA, Page: &adminpb.PageRequest{PageSize: 1}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.ListWorkers(ctx, &adminpb.ListWorkersRequest{Namespace: nsA, Page: &adminpb.PageRequest{PageToken: rp.Page.GetNextPageToken()}})
		wantCode(t, err, codes.InvalidArgument)
	}
	_, err = c.GetStep(ctx, &adminpb.GetStepRequest{Namespace: nsA, RunId: f.greets[0]})
	wantCode(t, err, codes.InvalidArgument)
	_, err = c.GetWorker(ctx, &adminpb.GetWorkerRequest{Namespace: nsA})
	wantCode(t, err, codes.InvalidArgument)
}

// TestNoRPCChangesTheDatabase calls every RPC and compares a fingerprint of every
// Kagzi table before and after.
func TestNoRPCChangesTheDatabase(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	c := admin(t, f.addr, token)
	fingerprint := func() string {
		t.Helper()
		var out []string
		for _, table := range []string{"runs", "steps", "step_attempts", "workers", "schedules"} {
			var sum string
			if err := f.pool.QueryRow(ctx, `SELECT coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '')
				FROM kagzi.`+table+` t`).Scan(&sum); err != nil {
				t.Fatal(err)
			}
			out = append(out, table+"="+sum)
		}
		return strings.Join(out, " ")
	}
	before := fingerprint()
	for _, ns := range []string{nsA, nsB} {
		_, _ = c.GetServerInfo(ctx, &adminpb.GetServerInfoRequest{})
		_, _ = c.GetWorkflow(ctx, &adminpb.GetWorkflowRequest{Namespace: ns, Selector: &adminpb.GetWorkflowRequest_RunId{RunId: f.pending}})
		_, _ = c.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: ns})
		_, _ = c.GetStep(ctx, &adminpb.GetStepRequest{Namespace: ns, RunId: f.greets[0], StepKey: "flaky"})
		_, _ = c.ListSteps(ctx, &adminpb.ListStepsRequest{Namespace: ns, RunId: f.greets[0]})
		_, _ = c.GetWorker(ctx, &adminpb.GetWorkerRequest{Namespace: ns, WorkerId: f.worker})
		_, _ = c.ListWorkers(ctx, &adminpb.ListWorkersRequest{Namespace: ns})
		_, _ = c.GetWorkflowSchedule(ctx, &adminpb.GetWorkflowScheduleRequest{Namespace: ns, ScheduleId: "daily-report"})
		_, _ = c.ListWorkflowSchedules(ctx, &adminpb.ListWorkflowSchedulesRequest{Namespace: ns})
		_, _ = c.HealthCheck(ctx, &adminpb.HealthCheckRequest{Namespace: ns})
	}
	if after := fingerprint(); after != before {
		t.Fatalf("the database changed:\nbefore %s\nafter  %s", before, after)
	}
}

func TestPayloadsAreTheStoredJSON(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	c := admin(t, f.addr, token)
	got, err := c.GetWorkflow(ctx, &adminpb.GetWorkflowRequest{Namespace: nsA,
		Selector: &adminpb.GetWorkflowRequest_RunId{RunId: f.pending}})
	if err != nil {
		t.Fatal(err)
	}
	var in map[string]int
	if err := json.Unmarshal(got.Workflow.Input.GetData(), &in); err != nil || in["n"] != 1 {
		t.Fatalf("input %q: %v", got.Workflow.Input.GetData(), err)
	}
	if got.Workflow.Output != nil || got.Workflow.Status != adminpb.WorkflowStatus_WORKFLOW_STATUS_PENDING {
		t.Fatalf("pending run: %v", got.Workflow)
	}
}

func TestAServerOverAnUnmigratedDatabaseReportsNotServingAndFailedPrecondition(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool, err := pgxpool.New(ctx, testdb.NewEmpty(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	addr := serve(t, newClient(t, pool, nsA), kagziadmin.WithHealthInterval(50*time.Millisecond))
	c := admin(t, addr, "")

	h, err := c.HealthCheck(ctx, &adminpb.HealthCheckRequest{Namespace: nsA})
	if err != nil {
		t.Fatal(err)
	}
	if h.Status != adminpb.HealthCheckResponse_SERVING_STATUS_NOT_SERVING || h.SchemaCurrent || h.LatestSchemaVersion == 0 {
		t.Fatalf("HealthCheck: %v", h)
	}
	_, err = c.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA})
	wantCode(t, err, codes.FailedPrecondition)

	hc := healthpb.NewHealthClient(dial(t, addr, ""))
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status == healthpb.HealthCheckResponse_NOT_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("standard health stays %v over an unmigrated database", resp.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestADatabaseThatCannotBeReachedOrDropsConnectionsIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	// A port nothing listens on (connection refused), and a listener that accepts every
	// connection and closes it at once (a database that drops its connections).
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := closed.Addr().String()
	closed.Close()
	dropper, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dropper.Close() })
	go func() {
		for {
			conn, err := dropper.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	const missing = "01890000-0000-7000-8000-000000000000"
	for name, dbAddr := range map[string]string{"refused": refused, "dropped": dropper.Addr().String()} {
		pool, err := pgxpool.New(ctx, "postgres://postgres@"+dbAddr+"/none?sslmode=disable&connect_timeout=2")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		c := admin(t, serve(t, newClient(t, pool, nsA)), "")
		for rpc, err := range map[string]error{
			"GetWorkflow": err2(c.GetWorkflow(ctx, &adminpb.GetWorkflowRequest{Namespace: nsA,
				Selector: &adminpb.GetWorkflowRequest_RunId{RunId: missing}})),
			"ListWorkflows":         err2(c.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA})),
			"ListSteps":             err2(c.ListSteps(ctx, &adminpb.ListStepsRequest{Namespace: nsA, RunId: missing})),
			"ListWorkers":           err2(c.ListWorkers(ctx, &adminpb.ListWorkersRequest{Namespace: nsA})),
			"ListWorkflowSchedules": err2(c.ListWorkflowSchedules(ctx, &adminpb.ListWorkflowSchedulesRequest{Namespace: nsA})),
			"ListFlowLimits":        err2(c.ListFlowLimits(ctx, &adminpb.ListFlowLimitsRequest{Namespace: nsA})),
		} {
			if status.Code(err) != codes.Unavailable {
				t.Errorf("%s: %s = %v, want Unavailable (a caller may retry)", name, rpc, err)
			}
		}
	}
}

func TestFlowLimitsAreReadableAndAHeldRunShowsItsHold(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	c := admin(t, f.addr, token)
	if _, err := f.a.SetLimits(ctx, kagzi.Limits{WorkflowType: "later", Concurrency: 3, Rate: 1, RatePeriod: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// The hour's window is full: the pending run of the type is held by the rate limit.
	if _, err := f.pool.Exec(ctx, `SELECT kagzi.flow_rate_room($1, 'later', '', 1, 3600000),
		kagzi.flow_rate_add($1, 'later', '', 3600000, 1)`, nsA); err != nil {
		t.Fatal(err)
	}
	got, err := c.GetFlowLimits(ctx, &adminpb.GetFlowLimitsRequest{Namespace: nsA, WorkflowType: "later"})
	if err != nil {
		t.Fatal(err)
	}
	if l := got.Limits; l.Concurrency != 3 || l.Rate != 1 || l.RatePeriod.AsDuration() != time.Hour || l.KeyRatePeriod != nil ||
		l.Namespace != nsA || l.UpdatedAt == nil {
		t.Fatalf("GetFlowLimits = %v", l)
	}
	list, err := c.ListFlowLimits(ctx, &adminpb.ListFlowLimitsRequest{Namespace: nsA})
	if err != nil || len(list.Limits) != 1 || list.Limits[0].WorkflowType != "later" {
		t.Fatalf("ListFlowLimits = %v, %v", list, err)
	}
	if other, err := c.ListFlowLimits(ctx, &adminpb.ListFlowLimitsRequest{Namespace: nsB}); err != nil || len(other.Limits) != 0 {
		t.Fatalf("team-b's limits = %v, %v; want none", other, err)
	}
	run, err := c.GetWorkflow(ctx, &adminpb.GetWorkflowRequest{Namespace: nsA,
		Selector: &adminpb.GetWorkflowRequest_RunId{RunId: f.pending}})
	if err != nil {
		t.Fatal(err)
	}
	if h := run.Workflow.Hold; h == nil || h.Limit != "rate" || h.Until == nil || time.Until(h.Until.AsTime()) < 50*time.Minute {
		t.Fatalf("held run's hold = %v, want the rate limit until about an hour from now", h)
	}
	for name, tc := range map[string]struct {
		err  error
		want codes.Code
	}{
		"no limits":    {err2(c.GetFlowLimits(ctx, &adminpb.GetFlowLimitsRequest{Namespace: nsA, WorkflowType: "greet"})), codes.NotFound},
		"no namespace": {err2(c.ListFlowLimits(ctx, &adminpb.ListFlowLimitsRequest{})), codes.InvalidArgument},
		"no type":      {err2(c.GetFlowLimits(ctx, &adminpb.GetFlowLimitsRequest{Namespace: nsA})), codes.InvalidArgument},
		"other team":   {err2(admin(t, f.addr, tokenB).ListFlowLimits(ctx, &adminpb.ListFlowLimitsRequest{Namespace: nsA})), codes.PermissionDenied},
	} {
		if status.Code(tc.err) != tc.want {
			t.Errorf("%s: got %v, want %v", name, tc.err, tc.want)
		}
	}
}

func err2[T any](_ T, err error) error { return err }

// The standard health service follows the database on a gRPC server the application
// serves itself (GRPCServer, Register), not only under Serve: found from outside, it
// answered SERVING over an unmigrated database for ever.
func TestTheHealthServiceOfAServerServedByTheApplicationFollowsTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool, err := pgxpool.New(ctx, testdb.NewEmpty(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	srv, err := kagziadmin.NewAdminServer(newClient(t, pool, nsA), kagziadmin.WithLogger(quietLogger()),
		kagziadmin.WithHealthInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	g := srv.GRPCServer()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	hc := healthpb.NewHealthClient(dial(t, lis.Addr().String(), ""))
	resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Check over an unmigrated database: %v, want NOT_SERVING", resp.Status)
	}
	stream, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: "kagzi.v1.AdminService"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if first.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Watch over an unmigrated database: %v, want NOT_SERVING", first.Status)
	}
	// Migrated while watched: the stream turns SERVING.
	if err := kagzi.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for {
		next, err := stream.Recv()
		if err != nil {
			t.Fatalf("Watch ended before the migrated database was SERVING: %v", err)
		}
		if next.Status == healthpb.HealthCheckResponse_SERVING {
			break
		}
	}
}

// A Server whose Serve returned serves again, healthy (found from outside: its health
// service stayed NOT_SERVING for good after the first Serve).
func TestAServerServesAgainAfterServeReturnedAndItsHealthFollowsTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool, _ := testdb.NewPool(t)
	srv, err := kagziadmin.NewAdminServer(newClient(t, pool, nsA), kagziadmin.WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		sctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- srv.Serve(sctx, lis) }()
		resp, err := healthpb.NewHealthClient(dial(t, lis.Addr().String(), "")).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("Serve number %d over a migrated database: %v, want SERVING", round+1, resp.Status)
		}
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// And a gRPC server of its own after that.
	g := srv.GRPCServer()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	resp, err := healthpb.NewHealthClient(dial(t, lis.Addr().String(), "")).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("GRPCServer after Serve returned: %v, want SERVING", resp.Status)
	}
}
