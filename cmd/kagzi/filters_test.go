package main_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/testdb"
)

type listedRuns struct {
	Runs []struct {
		RunID      string         `json:"run_id"`
		WorkflowID string         `json:"workflow_id"`
		Attributes map[string]any `json:"attributes"`
		Deadline   *time.Time     `json:"deadline"`
	} `json:"runs"`
}

func (l listedRuns) ids() []string {
	var ids []string
	for _, r := range l.Runs {
		ids = append(ids, r.WorkflowID)
	}
	return ids
}

func TestRunsListSelectsByAttributesPrefixTypesErrorCodeAndOrder(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, attrs := range []map[string]any{
		{"customer": "c-42", "priority": 1},
		{"customer": "c-43", "priority": 2},
		{"customer": "42", "order_id": int64(1234567890123456789)},
	} {
		id := fmt.Sprintf("order-%d", i+1)
		if _, err := f.client.StartByName(ctx, "later", 0, kagzi.WithID(id), kagzi.WithAttributes(attrs),
			kagzi.WithRunTimeout(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--attr", "customer=c-42"}, "order-1"},
		{[]string{"--attr", "customer=42"}, ""},                         // 42 parses as JSON: a number
		{[]string{"--attr", `customer="42"`}, "order-3"},                // quoted: the string
		{[]string{"--attr", "order_id=1234567890123456789"}, "order-3"}, // past 2^53: exact
		{[]string{"--attr", "order_id=1234567890123456788"}, ""},
		{[]string{"--attr", "customer=c-43", "--attr", "priority=2"}, "order-2"},
		{[]string{"--attr", "customer=c-43", "--attr", "priority=1"}, ""},
		{[]string{"--workflow-id-prefix", "order-", "--oldest-first", "--limit", "2", "--all"}, "order-1 order-2 order-3"},
		{[]string{"--workflow-type", "boom,later", "--root-only", "--workflow-id-prefix", "boom"}, "boom-1"},
		{[]string{"--error-code", "KABOOM"}, "boom-1"},
		{[]string{"--error-code", "FLAKY"}, ""},
	} {
		args := append([]string{"runs", "list", "--json"}, c.args...)
		got := decode[listedRuns](t, ok(t, f.url, args...))
		if ids := strings.Join(got.ids(), " "); ids != c.want {
			t.Errorf("%v listed %q, want %q", c.args, ids, c.want)
		}
	}
	got := decode[listedRuns](t, ok(t, f.url, "runs", "list", "--json", "--attr", "customer=c-42"))
	if got.Runs[0].Attributes["priority"] != float64(1) || got.Runs[0].Deadline == nil {
		t.Fatalf("listed run: %+v, want its attributes and deadline", got.Runs[0])
	}
	out := ok(t, f.url, "runs", "show", "--workflow-id", "order-1")
	for _, want := range []string{`Attributes:`, `"customer":"c-42"`, `Deadline:`} {
		if !strings.Contains(out, want) {
			t.Fatalf("runs show lacks %q:\n%s", want, out)
		}
	}
	for _, bad := range [][]string{{"--attr", "novalue"}, {"--attr", "=1"}} {
		if r := kagziCmd(t, f.url, append([]string{"runs", "list"}, bad...)...); r.code != 2 {
			t.Errorf("%v: exit %d, want 2 (usage)\n%s", bad, r.code, r.stderr)
		}
	}
	if r := kagziCmd(t, f.url, "runs", "list", "--root-only", "--parent", f.greets[0]); r.code != 2 ||
		!strings.Contains(r.stderr, "exclude each other") {
		t.Errorf("--root-only --parent: exit %d, want 2 (usage)\n%s", r.code, r.stderr)
	}
}

func TestHealthReportsAndExitsNonZeroWhenUnhealthy(t *testing.T) {
	f := newFixture(t)
	out := ok(t, f.url, "health")
	for _, want := range []string{"Status:", "healthy", "Database:", "ok", "Schema version:", "No live worker for:", "later"} {
		if !strings.Contains(out, want) {
			t.Fatalf("health lacks %q:\n%s", want, out)
		}
	}
	h := decode[map[string]any](t, ok(t, f.url, "health", "--json"))
	if h["healthy"] != true || h["database_ok"] != true || h["schema_current"] != true || h["namespace"] != "default" {
		t.Fatalf("health --json: %v", h)
	}
	if pending, _ := h["pending_types_without_worker"].([]any); len(pending) != 1 || pending[0] != "later" {
		t.Fatalf("pending types without worker: %v", h["pending_types_without_worker"])
	}

	empty := testdb.NewEmpty(t) // never migrated
	r := kagziCmd(t, empty, "health", "--json")
	if r.code != 1 {
		t.Fatalf("health of an unmigrated database: exit %d, want 1\n%s%s", r.code, r.stdout, r.stderr)
	}
	if h := decode[map[string]any](t, r.stdout); h["healthy"] != false || h["schema_current"] != false || h["database_ok"] != true {
		t.Fatalf("health --json of an unmigrated database: %v", h)
	}
	r = kagziCmd(t, "postgres://nobody@127.0.0.1:1/none?connect_timeout=2", "health")
	if r.code != 1 || !strings.Contains(r.stdout, "UNHEALTHY") {
		t.Fatalf("health of an unreachable database: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

func TestBadFlagValuesExitTwoAndFailuresOfTheDatabaseExitOne(t *testing.T) {
	f := newFixture(t)
	// The other order's token of a real listing: well formed, yet not for this one.
	r := kagziCmd(t, f.url, "runs", "list", "--limit", "1", "--oldest-first")
	m := regexp.MustCompile(`--page-token (\S+)`).FindStringSubmatch(r.stderr)
	if r.code != 0 || m == nil {
		t.Fatalf("runs list --limit 1 --oldest-first: exit %d\n%s", r.code, r.stderr)
	}
	for _, c := range []struct {
		args []string
		want string // in the message
	}{
		{[]string{"runs", "list", "--status", "bogus"}, `unknown run status "bogus"`},
		{[]string{"runs", "list", "--status", "failed,nope"}, `unknown run status "nope"`},
		{[]string{"runs", "list", "--parent", "nope"}, `"nope" is not a UUID`},
		{[]string{"runs", "list", "--page-token", "garbage"}, "malformed page token"},
		{[]string{"runs", "list", "--page-token", m[1]}, "other order"},
		{[]string{"runs", "list", "--workflow-type", "bad\ttype"}, "control character"},
		{[]string{"runs", "list", "--limit", "0"}, "--limit 0"},
		{[]string{"runs", "list", "--created-after", "yesterday"}, "--created-after"},
		{[]string{"workers", "list", "--status", "asleep"}, `unknown worker status "asleep"`},
		{[]string{"workers", "list", "--page-token", "garbage"}, "malformed page token"},
		{[]string{"schedules", "list", "--page-token", "garbage"}, "malformed page token"},
		{[]string{"runs", "show", "--workflow-id", "bad\tid"}, "control character"},
		{[]string{"workers", "list", "--workflow-type", "bad\ttype"}, "control character"},
		{[]string{"schedules", "list", "--workflow-type", "bad\ttype"}, "control character"},
		{[]string{"-n", "bad\tns", "runs", "list"}, "control character"},
		{[]string{"-n", "", "runs", "list"}, "empty namespace"},
		{[]string{"serve-admin", "--token", "   "}, "blank"},
		{[]string{"schedules", "show", "bad\tid"}, "control character"},
		{[]string{"schedules", "pause", strings.Repeat("x", 201)}, "longer than"},
		// Found from outside: the limits commands exited 1 for a TYPE that is no name.
		{[]string{"limits", "get", ""}, "empty workflow type"},
		{[]string{"limits", "get", "bad\ttype"}, "control character"},
		{[]string{"limits", "set", "", "--concurrency", "1"}, "empty workflow type"},
		{[]string{"limits", "set", "bad\ttype", "--concurrency", "1"}, "control character"},
		{[]string{"limits", "delete", ""}, "empty workflow type"},
		{[]string{"limits", "delete", strings.Repeat("x", 256)}, "longer than"},
	} {
		r := kagziCmd(t, f.url, c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) || !strings.Contains(r.stderr, "kagzi help") {
			t.Errorf("kagzi %q: exit %d, %q; want 2 (usage) naming %q", c.args, r.code, r.stderr, c.want)
		}
	}
	// Checked before the database is needed: a usage error without one too.
	for _, args := range [][]string{{"runs", "list", "--status", "bogus"}, {"runs", "list", "--parent", "nope"},
		{"workers", "list", "--status", "asleep"}} {
		if r := kagziCmd(t, "", args...); r.code != 2 {
			t.Errorf("kagzi %q without a database: exit %d, %q; want 2 (usage)", args, r.code, r.stderr)
		}
	}
	// Good flags the database cannot answer: a failure, exit 1.
	down := "postgres://nobody@127.0.0.1:1/none?connect_timeout=2"
	for _, args := range [][]string{{"runs", "list", "--status", "failed"}, {"workers", "list"}, {"schedules", "list"}} {
		if r := kagziCmd(t, down, args...); r.code != 1 || !strings.Contains(r.stderr, "unavailable") {
			t.Errorf("kagzi %q over an unreachable database: exit %d, %q; want 1", args, r.code, r.stderr)
		}
	}
}

func TestErrorTextIsPrintedWithoutTheControlCharactersThatWouldDriveTheTerminal(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	escapes := kagzi.Define("escapes", func(ctx *kagzi.Context, _ int) (int, error) {
		return 0, &kagzi.Error{Code: "ESC", Message: "\x1b[31mred\x1b[0m\rover\x07written", NonRetryable: true}
	})
	w, err := kagzi.NewWorker(f.client, kagzi.WorkerConfig{DisableScheduler: true}, escapes)
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() { stop(); <-done }()
	run, err := kagzi.Start(ctx, f.client, escapes, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.Wait(ctx); err == nil {
		t.Fatal("the run did not fail")
	}
	for _, args := range [][]string{{"runs", "list", "--error-code", "ESC"}, {"runs", "show", run.RunID}} {
		out := ok(t, f.url, args...)
		if strings.ContainsAny(out, "\x1b\r\x07") || !strings.Contains(out, `\x1b[31mred\x1b[0m over\awritten`) {
			t.Errorf("kagzi %q printed %q; want the escapes shown, not sent", args, out)
		}
	}
}
