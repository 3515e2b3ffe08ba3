package kagzi_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

// staged sets attributes, waits for a signal (released: a replay follows), and sets
// them again.
var staged = kagzi.Define("staged", func(ctx *kagzi.Context, _ int) (string, error) {
	if err := ctx.SetAttributes(map[string]any{"stage": "received", "first": 1}); err != nil {
		return "", err
	}
	if _, err := kagzi.WaitSignal[string](ctx, "go", 0); err != nil {
		return "", err
	}
	if err := ctx.SetAttributes(map[string]any{"stage": "done", "tier": nil}); err != nil {
		return "", err
	}
	return "ok", nil
})

func TestAttributesSetAtStartAndByTheWorkflowAreMergedAndNotRewrittenByAReplay(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	runWorker(t, e.client, fastWorker(), staged)
	run, err := kagzi.Start(ctx, e.client, staged, 0,
		kagzi.WithAttributes(map[string]any{"customer": "c-42", "tier": "gold", "unset": nil}))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the run to wait for its signal", func() bool { return runStatus(t, e.client, run.RunID) == kagzi.StatusSleeping })
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"customer": "c-42", "tier": "gold", "stage": "received", "first": float64(1)}
	if !reflect.DeepEqual(info.Attributes, want) {
		t.Fatalf("attributes while waiting = %v, want %v", info.Attributes, want)
	}
	// Changed behind the workflow's back: a replay of the first SetAttributes would put
	// "first" back to 1.
	if _, err := e.pool.Exec(ctx, `UPDATE kagzi.runs SET attributes = attributes || '{"first": "changed"}' WHERE run_id = $1`,
		run.RunID); err != nil {
		t.Fatal(err)
	}
	if err := e.client.Signal(ctx, run.RunID, "go", "now"); err != nil {
		t.Fatal(err)
	}
	if _, err := run.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	info, err = e.client.GetRun(ctx, run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	want = map[string]any{"customer": "c-42", "stage": "done", "first": "changed"}
	if !reflect.DeepEqual(info.Attributes, want) {
		t.Fatalf("attributes at the end = %v, want %v (tier removed, first not rewritten by the replay)", info.Attributes, want)
	}
	var kinds []kagzi.StepKind
	for _, s := range stepsOf(t, e.client, run.RunID) {
		if s.Kind == kagzi.KindAttributes {
			kinds = append(kinds, s.Kind)
		}
	}
	if len(kinds) != 2 {
		t.Fatalf("%d ATTRIBUTES steps, want 2", len(kinds))
	}
}

func TestListRunsSelectsRunsWhoseAttributesContainTheFilter(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	start := func(id string, attrs map[string]any) string {
		t.Helper()
		run, err := e.client.StartByName(ctx, "held", 0, kagzi.WithID(id), kagzi.WithAttributes(attrs))
		if err != nil {
			t.Fatal(err)
		}
		return run.RunID
	}
	var all []string // newest first
	paris := start("paris", map[string]any{"customer": "c-42", "tags": []string{"a", "b"},
		"region": map[string]any{"country": "FR", "city": "Paris"}, "priority": 7})
	lyon := start("lyon", map[string]any{"customer": "c-43", "region": map[string]any{"country": "FR", "city": "Lyon"}})
	none := start("none", nil)
	all = []string{none, lyon, paris}
	for _, c := range []struct {
		filter map[string]any
		want   []string
	}{
		{map[string]any{"customer": "c-42"}, []string{paris}},
		{map[string]any{"customer": "c-44"}, nil},
		{map[string]any{"tags": []string{"b"}}, []string{paris}},
		{map[string]any{"region": map[string]any{"country": "FR"}}, []string{lyon, paris}},
		{map[string]any{"priority": 7}, []string{paris}},
		{map[string]any{"priority": "7"}, nil},
		{map[string]any{}, all}, // asks nothing of the attributes, as nil
	} {
		page, err := e.client.ListRuns(ctx, kagzi.RunFilter{Attributes: c.filter})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range page.Runs {
			got = append(got, r.RunID)
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("filter %v selected %v, want %v", c.filter, got, c.want)
		}
	}
}

// oversized sets two attributes of 10 KiB each: the second would take the run past
// MaxAttributesSize.
var oversized = kagzi.Define("oversized", func(ctx *kagzi.Context, _ int) ([]bool, error) {
	big := strings.Repeat("x", 10<<10)
	if err := ctx.SetAttributes(map[string]any{"a": big}); err != nil {
		return nil, err
	}
	err := ctx.SetAttributes(map[string]any{"b": big})
	bad := ctx.SetAttributes(map[string]any{"": 1})
	return []bool{errors.Is(err, kagzi.ErrInvalidArgument), errors.Is(err, kagzi.ErrNonRetryable),
		errors.Is(bad, kagzi.ErrInvalidArgument)}, nil
})

func TestBadOrOversizedAttributesAreTypedErrorsAndWriteNothing(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	for name, attrs := range map[string]map[string]any{
		"empty key":                    {"": 1},
		"key with a control character": {"a\tb": 1},
		"value that does not encode":   {"c": make(chan int)},
		"too large":                    {"big": strings.Repeat("x", kagzi.MaxAttributesSize)},
	} {
		_, err := e.client.StartByName(ctx, "held", 0, kagzi.WithAttributes(attrs))
		if !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("start with %s: got %v, want ErrInvalidArgument", name, err)
		}
		_, err = e.client.ListRuns(ctx, kagzi.RunFilter{Attributes: attrs})
		if !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("filter with %s: got %v, want ErrInvalidArgument", name, err)
		}
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs`); n != 0 {
		t.Fatalf("%d runs started with bad attributes, want none", n)
	}

	runWorker(t, e.client, fastWorker(), oversized)
	run, err := kagzi.Start(ctx, e.client, oversized, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := run.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, []bool{true, true, true}) {
		t.Fatalf("errors.Is(ErrInvalidArgument, ErrNonRetryable) of the oversized change, ErrInvalidArgument of the bad key = %v", got)
	}
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := info.Attributes["b"]; ok || len(info.Attributes) != 1 {
		t.Fatalf("attributes hold %d keys (b: %v), want a alone", len(info.Attributes), ok)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.steps WHERE kind = 'ATTRIBUTES'`); n != 1 {
		t.Fatalf("%d ATTRIBUTES steps recorded, want 1 (the change that fit)", n)
	}
}

func TestRunInfoJSONCarriesAttributesAndDeadline(t *testing.T) {
	deadline := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	b, err := json.Marshal(kagzi.RunInfo{Attributes: map[string]any{"customer": "c-42"}, Deadline: &deadline})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(m["attributes"]) != "map[customer:c-42]" || m["deadline"] != "2030-01-02T03:04:05Z" {
		t.Fatalf("RunInfo's JSON: %s", b)
	}
}

func TestAnIntegerAttributeBeyondAFloat64ReadsBackExactlyAndSelectsItsRun(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	const id = int64(1234567890123456789) // 19 digits: a float64 rounds it
	run, err := e.client.StartByName(ctx, "held", 0, kagzi.WithAttributes(map[string]any{
		"order_id": id, "count": 3, "ratio": 1.5, "nested": map[string]any{"id": id}}))
	if err != nil {
		t.Fatal(err)
	}
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"order_id": json.Number("1234567890123456789"), "count": 3.0, "ratio": 1.5,
		"nested": map[string]any{"id": json.Number("1234567890123456789")}}
	if !reflect.DeepEqual(info.Attributes, want) {
		t.Fatalf("attributes %#v, want %#v", info.Attributes, want)
	}
	// What GetRun gave selects the run again; the rounded value does not.
	for filter, n := range map[string]int{"read back": 1, "rounded": 0} {
		f := map[string]any{"order_id": info.Attributes["order_id"]}
		if n == 0 {
			f["order_id"] = float64(id)
		}
		page, err := e.client.ListRuns(ctx, kagzi.RunFilter{Attributes: f})
		if err != nil || len(page.Runs) != n {
			t.Fatalf("filter by the %s id: %d runs, %v (want %d)", filter, len(page.Runs), err, n)
		}
	}
}
