package kagzi_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

// listAll follows every page of f and returns the run ids in the order listed.
func listAll(t *testing.T, c *kagzi.Client, f kagzi.RunFilter) []string {
	t.Helper()
	var ids []string
	for range 100 {
		page, err := c.ListRuns(context.Background(), f)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Runs {
			ids = append(ids, r.RunID)
		}
		if f.PageToken = page.NextPageToken; f.PageToken == "" {
			return ids
		}
	}
	t.Fatal("more than 100 pages")
	return nil
}

func TestListRunsPagesEitherWayThroughRunsCreatedInTheSameInstant(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	// StartMany's runs share their created_at (one statement): only the run id orders them.
	if _, err := kagzi.StartMany(ctx, e.client, greet, make([]greetIn, 7)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := kagzi.Start(ctx, e.client, greet, greetIn{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []kagzi.RunFilter{{}, {WorkflowType: "greet"}, {RootOnly: true}} {
		f.PageSize = 3
		newest := listAll(t, e.client, f)
		f.OldestFirst = true
		oldest := listAll(t, e.client, f)
		if len(newest) != 10 || len(oldest) != 10 {
			t.Fatalf("%+v: listed %d newest first and %d oldest first, want 10 each", f, len(newest), len(oldest))
		}
		reversed := slices.Clone(newest)
		slices.Reverse(reversed)
		if !reflect.DeepEqual(oldest, reversed) {
			t.Fatalf("%+v: oldest first %v is not newest first %v reversed", f, oldest, newest)
		}
		if !slices.IsSorted(oldest) { // UUIDv7: their text sorts as they were made
			t.Fatalf("%+v: oldest first is not in creation order: %v", f, oldest)
		}
	}
	page, err := e.client.ListRuns(ctx, kagzi.RunFilter{PageSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.client.ListRuns(ctx, kagzi.RunFilter{PageSize: 3, PageToken: page.NextPageToken, OldestFirst: true})
	mustErrorIs(t, err, kagzi.ErrInvalidArgument)
}

// failsWith fails at once with its input as the error code; "" completes.
var failsWith = kagzi.Define("fails-with", func(ctx *kagzi.Context, code string) (string, error) {
	if code == "" {
		return "done", nil
	}
	return "", &kagzi.Error{Code: code, NonRetryable: true}
})

// spawns starts a failsWith child that completes, and waits for it.
var spawns = kagzi.Define("spawns", func(ctx *kagzi.Context, _ int) (string, error) {
	child, err := kagzi.StartChild(ctx, "child", failsWith, "")
	if err != nil {
		return "", err
	}
	return child.Get()
})

func TestListRunsFiltersByTypesPrefixRootsErrorCodeAndLeavesPayloadsOut(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	runWorker(t, e.client, fastWorker(), failsWith, spawns)
	ids := map[string]string{}
	for _, c := range []struct{ id, code string }{{"order-1", "card_declined"}, {"order-2", "out_of_stock"},
		{"invoice-1", "card_declined"}, {"50%-off", ""}} {
		run, err := kagzi.Start(ctx, e.client, failsWith, c.code, kagzi.WithID(c.id), kagzi.WithRunTimeout(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := run.Wait(ctx); (err == nil) != (c.code == "") {
			t.Fatalf("run %s ended with %v", c.id, err)
		}
		ids[c.id] = run.RunID
	}
	parent, err := kagzi.Start(ctx, e.client, spawns, 0, kagzi.WithID("parent"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parent.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	ids["parent"] = parent.RunID
	children := listAll(t, e.client, kagzi.RunFilter{ParentRunID: parent.RunID})
	if len(children) != 1 {
		t.Fatalf("%d children, want 1", len(children))
	}
	ids["child"] = children[0]

	for _, c := range []struct {
		filter kagzi.RunFilter
		want   []string
	}{
		{kagzi.RunFilter{WorkflowIDPrefix: "order-"}, []string{"order-2", "order-1"}},
		{kagzi.RunFilter{WorkflowIDPrefix: "50%"}, []string{"50%-off"}},
		{kagzi.RunFilter{WorkflowIDPrefix: "5_"}, nil},
		{kagzi.RunFilter{ErrorCode: "card_declined"}, []string{"invoice-1", "order-1"}},
		{kagzi.RunFilter{ErrorCode: "card_declined", WorkflowIDPrefix: "order-", OldestFirst: true}, []string{"order-1"}},
		{kagzi.RunFilter{WorkflowTypes: []string{"spawns", "nothing"}}, []string{"parent"}},
		{kagzi.RunFilter{WorkflowType: "spawns", WorkflowTypes: []string{"fails-with"}, RootOnly: true},
			[]string{"parent", "50%-off", "invoice-1", "order-2", "order-1"}},
		{kagzi.RunFilter{WorkflowType: "fails-with", Statuses: []kagzi.RunStatus{kagzi.StatusCompleted}},
			[]string{"child", "50%-off"}},
	} {
		var want []string
		for _, name := range c.want {
			want = append(want, ids[name])
		}
		if got := listAll(t, e.client, c.filter); !reflect.DeepEqual(got, want) {
			t.Errorf("%+v listed %v, want %v", c.filter, got, want)
		}
	}

	page, err := e.client.ListRuns(ctx, kagzi.RunFilter{WorkflowID: "50%-off"})
	if err != nil || len(page.Runs) != 1 {
		t.Fatalf("%+v, %v", page, err)
	}
	if r := page.Runs[0]; r.Input != nil || r.Output != nil || r.Deadline == nil || time.Until(*r.Deadline) < 50*time.Minute {
		t.Fatalf("listed without payloads: input %s, output %s, deadline %v; want none, none, in an hour", r.Input, r.Output, r.Deadline)
	}
	page, err = e.client.ListRuns(ctx, kagzi.RunFilter{WorkflowID: "50%-off", IncludePayloads: true})
	if err != nil || len(page.Runs) != 1 || string(page.Runs[0].Input) != `""` || string(page.Runs[0].Output) != `"done"` {
		t.Fatalf("listed with payloads: %+v, %v", page, err)
	}
	info, err := e.client.GetRun(ctx, ids["50%-off"])
	if err != nil || string(info.Input) != `""` || string(info.Output) != `"done"` || info.Deadline == nil {
		t.Fatalf("GetRun: %+v, %v; want the payloads and the deadline", info, err)
	}
}

func TestBadListingFiltersAreTypedErrors(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	child := "0190a0a0-0000-7000-8000-000000000000"
	for i, f := range []kagzi.RunFilter{
		{RootOnly: true, ParentRunID: child},
		{WorkflowTypes: []string{"ok", ""}},
		{WorkflowIDPrefix: "a\nb"},
		{ErrorCode: string(make([]byte, 256))},
		{ParentRunID: "not-a-uuid"},
		{PageSize: 1001},
	} {
		if _, err := e.client.ListRuns(ctx, f); !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("filter %d (%+v): got %v, want ErrInvalidArgument", i, f, err)
		}
		// Err tells the same without reading anything.
		if err := f.Err(); !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("filter %d (%+v): Err() = %v, want ErrInvalidArgument", i, f, err)
		}
	}
	if err := (kagzi.RunFilter{WorkflowType: "ok", ParentRunID: child}).Err(); err != nil {
		t.Errorf("a good filter: Err() = %v, want nil", err)
	}
}

func TestCreatedBoundsBetweenMicrosecondsSelectAsTheirNanosecondsSay(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	run, err := e.client.StartByName(ctx, "held", 0)
	if err != nil {
		t.Fatal(err)
	}
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	at := info.CreatedAt // microseconds, as stored
	for _, c := range []struct {
		f    kagzi.RunFilter
		want int
	}{
		{kagzi.RunFilter{CreatedAfter: at}, 1},
		{kagzi.RunFilter{CreatedAfter: at.Add(time.Nanosecond)}, 0},
		{kagzi.RunFilter{CreatedAfter: at.Add(-time.Nanosecond)}, 1},
		{kagzi.RunFilter{CreatedBefore: at}, 0},
		{kagzi.RunFilter{CreatedBefore: at.Add(time.Nanosecond)}, 1},
		{kagzi.RunFilter{CreatedBefore: at.Add(-time.Nanosecond)}, 0},
	} {
		page, err := e.client.ListRuns(ctx, c.f)
		if err != nil || len(page.Runs) != c.want {
			t.Errorf("created after %v, before %v (run created %v): %d runs, %v; want %d",
				c.f.CreatedAfter.Sub(at), c.f.CreatedBefore.Sub(at), at, len(page.Runs), err, c.want)
		}
	}
}
