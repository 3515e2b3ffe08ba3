package kagziadmin_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/admin/adminpb"
)

func TestListWorkflowsFiltersByAttributesPrefixTypesErrorCodeAndOrder(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	c := admin(t, f.addr, token)
	var orders []string
	for i, customer := range []string{"c-42", "c-43"} {
		run, err := f.a.StartByName(ctx, "later", i, kagzi.WithID("order-"+customer),
			kagzi.WithAttributes(map[string]any{"customer": customer, "region": map[string]any{"country": "FR"}}),
			kagzi.WithRunTimeout(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		orders = append(orders, run.RunID)
	}
	list := func(req *adminpb.ListWorkflowsRequest) []*adminpb.Workflow {
		t.Helper()
		req.Namespace = nsA
		resp, err := c.ListWorkflows(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Workflows
	}
	ids := func(wfs []*adminpb.Workflow) []string {
		var out []string
		for _, w := range wfs {
			out = append(out, w.RunId)
		}
		return out
	}
	attrs := func(m map[string]any) *structpb.Struct {
		s, err := structpb.NewStruct(m)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	got := list(&adminpb.ListWorkflowsRequest{Attributes: attrs(map[string]any{"customer": "c-42"})})
	if !slices.Equal(ids(got), orders[:1]) {
		t.Fatalf("attributes filter: %v, want %v", ids(got), orders[:1])
	}
	w := got[0]
	if w.Attributes.AsMap()["customer"] != "c-42" || w.Deadline == nil || w.Input != nil || w.ParentRunId != nil {
		t.Fatalf("listed workflow: %v; want its attributes and deadline, no input (no include_payloads)", w)
	}
	for name, c := range map[string]struct {
		req  *adminpb.ListWorkflowsRequest
		want []string
	}{
		"nested attributes": {&adminpb.ListWorkflowsRequest{Attributes: attrs(map[string]any{"region": map[string]any{"country": "FR"}})},
			[]string{orders[1], orders[0]}},
		"prefix, oldest first": {&adminpb.ListWorkflowsRequest{WorkflowIdPrefix: proto.String("order-"), OldestFirst: true}, orders},
		"types and roots": {&adminpb.ListWorkflowsRequest{WorkflowTypes: []string{"boom", "greet"}, RootOnly: true,
			WorkflowIdPrefix: proto.String("greet-e")}, []string{f.greets[4]}},
		"error code":   {&adminpb.ListWorkflowsRequest{ErrorCode: proto.String("KABOOM")}, []string{f.failed}},
		"no children":  {&adminpb.ListWorkflowsRequest{ParentRunId: proto.String(f.failed)}, nil},
		"other code":   {&adminpb.ListWorkflowsRequest{ErrorCode: proto.String("FLAKY")}, nil},
		"no attribute": {&adminpb.ListWorkflowsRequest{Attributes: attrs(map[string]any{"customer": "c-44"})}, nil},
	} {
		if got := ids(list(c.req)); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", name, got, c.want)
		}
	}
	withPayloads := list(&adminpb.ListWorkflowsRequest{WorkflowId: proto.String("greet-ada"), IncludePayloads: true})
	if len(withPayloads) != 1 || string(withPayloads[0].Output.GetData()) != `"hello ada!"` {
		t.Fatalf("include_payloads: %v", withPayloads)
	}

	_, err := c.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA, RootOnly: true, ParentRunId: proto.String(f.failed)})
	wantCode(t, err, codes.InvalidArgument)
	_, err = c.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA, Attributes: attrs(map[string]any{"": 1})})
	wantCode(t, err, codes.InvalidArgument)
	// A token continues its own order only.
	first, err := c.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA, Page: &adminpb.PageRequest{PageSize: 1}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA, OldestFirst: true,
		Page: &adminpb.PageRequest{PageSize: 1, PageToken: first.Page.GetNextPageToken()}})
	wantCode(t, err, codes.InvalidArgument)
}

// Found from outside: one integer attribute no double holds (1e400) made the Struct's
// conversion fail, and the run came without any of its attributes. Each value is
// converted alone; such a number comes as its digits in a string.
func TestARunsAttributesComeWholeThoughOneIsANumberNoDoubleHolds(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	c := admin(t, f.addr, token)
	huge := json.Number("1" + strings.Repeat("0", 400))
	r, err := f.a.StartByName(ctx, "later", 1, kagzi.WithAttributes(map[string]any{"customer": "c-42", "huge": huge,
		"nested": map[string]any{"list": []any{huge, "x"}, "empty": map[string]any{}}}))
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.GetWorkflow(ctx, &adminpb.GetWorkflowRequest{Namespace: nsA, Selector: &adminpb.GetWorkflowRequest_RunId{RunId: r.RunID}})
	if err != nil {
		t.Fatal(err)
	}
	fields := got.Workflow.GetAttributes().GetFields()
	nested := fields["nested"].GetStructValue().GetFields()
	if fields["customer"].GetStringValue() != "c-42" || fields["huge"].GetStringValue() != string(huge) ||
		nested["list"].GetListValue().GetValues()[0].GetStringValue() != string(huge) || nested["empty"].GetStructValue() == nil {
		t.Fatalf("attributes over gRPC: %v", got.Workflow.GetAttributes())
	}
}
