package ui_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/ui"
)

func TestEveryPageRendersWithRunsOfEveryKind(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	run, bad := startFamily(t, e)
	if _, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: "nightly", WorkflowType: "parent", Cron: "0 3 * * *", Input: 1}); err != nil {
		t.Fatal(err)
	}
	b := serve(t, ui.Handler(e.client, ui.Options{Logger: quiet()}))
	for path, want := range map[string][]string{
		"n/default/":                   {"Workflow types", "parent", "failing", "<svg"},
		"n/default/runs":               {run.RunID[len(run.RunID)-12:], "FAILED", "COMPLETED"},
		"n/default/runs?status=FAILED": {"boom"},
		"n/default/runs/" + run.RunID:  {"Timeline", "kid#1", "child", "progress", "&#34;half&#34;"},
		"n/default/runs/" + bad.RunID:  {"non-retryable", "boom"},
		"n/default/workers":            {"ONLINE", "parent, child, failing"},
		"n/default/schedules":          {"nightly", "0 3 * * *"},
		"n/default/schedules/nightly":  {"Next fire times", "UTC"},
		"n/default/audit":              {"No actions recorded"},
	} {
		status, body := b.get(path)
		if status != 200 {
			t.Errorf("GET %s: %d\n%s", path, status, body)
			continue
		}
		for _, w := range want {
			if !strings.Contains(body, w) {
				t.Errorf("GET %s: the page lacks %q", path, w)
			}
		}
		if strings.Contains(body, "csrf") && !strings.Contains(path, "runs/") {
			t.Errorf("GET %s: a read-only console renders a form", path)
		}
	}
	if status, _ := b.get("n/default/runs/" + "0190a0f4-0000-7000-8000-000000000000"); status != 404 {
		t.Errorf("an unknown run: %d, want 404", status)
	}
	_ = time.Second
}
