package ui_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/ui"
)

// idle is a workflow type no worker runs: its runs stay PENDING.
var idle = kagzi.Define("idle", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })

func startIdle(t *testing.T, c *kagzi.Client, n int) []string {
	t.Helper()
	runs, err := kagzi.StartMany(context.Background(), c, idle, make([]int, n))
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	for i, r := range runs {
		ids[i] = r.RunID
	}
	return ids
}

func statusOf(t *testing.T, c *kagzi.Client, id string) kagzi.RunStatus {
	t.Helper()
	info, err := c.GetRun(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return info.Status
}

func auditRows(t *testing.T, e *env) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM kagzi.console_audit`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestACancelThroughTheConsoleCancelsTheRunAndIsRecordedWithWhoTookIt(t *testing.T) {
	e := newEnv(t)
	id := startIdle(t, e.client, 1)[0]
	b := serve(t, ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll}))
	_, page := b.get("n/default/runs/" + id)
	status, loc, body := b.post("n/default/runs/"+id+"/cancel", url.Values{"csrf": {csrf(t, page)}})
	if status != http.StatusSeeOther || !strings.HasSuffix(loc, "n/default/runs/"+id+"?done=cancel") {
		t.Fatalf("POST cancel: %d to %q\n%s", status, loc, body)
	}
	if s := statusOf(t, e.client, id); s != kagzi.StatusCancelled {
		t.Fatalf("the run is %s, want CANCELLED", s)
	}
	var who, action, outcome, detail string
	var runs []string
	if err := e.pool.QueryRow(context.Background(), `SELECT who, action, outcome, run_ids::text[], detail::text FROM kagzi.console_audit`).
		Scan(&who, &action, &outcome, &runs, &detail); err != nil {
		t.Fatal(err)
	}
	if who != "tester" || action != "cancel" || outcome != "ok" || len(runs) != 1 || runs[0] != id || detail != "{}" {
		t.Fatalf("audit row: %s %s %s %v %s", who, action, outcome, runs, detail)
	}
	_, page = b.get("n/default/runs/" + id + "?done=cancel")
	if !strings.Contains(page, "Cancel requested.") || !strings.Contains(page, "tester") {
		t.Fatalf("the run's page does not show the cancel and its audit row:\n%s", page)
	}
}

func TestAPostWithoutItsSessionsCSRFTokenOrFromAnotherSiteIsRefusedAndChangesNothing(t *testing.T) {
	e := newEnv(t)
	id := startIdle(t, e.client, 1)[0]
	b := serve(t, ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll}))
	_, page := b.get("n/default/runs/" + id)
	token := csrf(t, page)
	other := serve(t, ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll}))
	_, otherPage := other.get("n/default/runs/" + id)
	for name, form := range map[string]url.Values{
		"no token":                    {},
		"a wrong token":               {"csrf": {"x" + token}},
		"another session's token":     {"csrf": {csrf(t, otherPage)}},
		"another console's key token": {"csrf": {csrf(t, otherPage)}},
	} {
		if status, _, _ := b.post("n/default/runs/"+id+"/cancel", form); status != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", name, status)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, b.srv.URL+"/console/n/default/runs/"+id+"/cancel",
		strings.NewReader(url.Values{"csrf": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	resp, err := b.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a POST from another origin: %d, want 403", resp.StatusCode)
	}
	if s := statusOf(t, e.client, id); s != kagzi.StatusPending || auditRows(t, e) != 0 {
		t.Fatalf("the run is %s with %d audit rows: a refused POST changed something", s, auditRows(t, e))
	}
}

func TestTheConsoleIsReadOnlyUnlessActionsAreEnabledAndAuthorized(t *testing.T) {
	e := newEnv(t)
	id := startIdle(t, e.client, 1)[0]
	for name, opts := range map[string]ui.Options{
		"defaults":                  {},
		"actions without Authorize": {Actions: true},
		"Authorize without actions": {Authorize: allowAll},
		"a hook that refuses cancel": {Actions: true, Authorize: func(_ *http.Request, a ui.Access) (string, bool) {
			return "viewer", a.Action == ui.ActionRead
		}},
	} {
		b := serve(t, ui.Handler(e.client, opts))
		status, page := b.get("n/default/runs/" + id)
		if status != 200 || strings.Contains(page, "cancel-run") {
			t.Errorf("%s: the run page (%d) offers a cancel", name, status)
		}
		_, runs := b.get("n/default/runs")
		if strings.Contains(runs, "bulk-cancel") {
			t.Errorf("%s: the runs page offers a bulk cancel", name)
		}
		token := csrfField.FindStringSubmatch(page)
		form := url.Values{}
		if token != nil {
			form.Set("csrf", token[1])
		}
		if status, _, _ := b.post("n/default/runs/"+id+"/cancel", form); status != http.StatusForbidden {
			t.Errorf("%s: POST cancel: %d, want 403", name, status)
		}
		if status, _ := b.get("n/default/bulk?action=cancel"); status != http.StatusForbidden {
			t.Errorf("%s: the bulk confirmation: %d, want 403", name, status)
		}
	}
	if s := statusOf(t, e.client, id); s != kagzi.StatusPending {
		t.Fatalf("the run is %s", s)
	}
}

func TestAConsoleServesAnotherNamespaceOnlyWhenTheHookAllowsItAndNeverMixesThem(t *testing.T) {
	e := newEnv(t)
	mine := startIdle(t, e.client, 1)[0]
	otherClient, err := kagzi.NewClient(e.pool, kagzi.Config{Namespace: "team-b", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	theirs := startIdle(t, otherClient, 1)[0]
	namespaces := func(ns string) (*kagzi.Client, error) {
		return kagzi.NewClient(e.pool, kagzi.Config{Namespace: ns, Logger: quiet()})
	}
	single := serve(t, ui.Handler(e.client, ui.Options{Namespaces: namespaces}))
	if status, _ := single.get("n/team-b/runs"); status != http.StatusForbidden {
		t.Errorf("another namespace without a hook that allows it: %d, want 403", status)
	}
	if status, _ := single.get("n/default/runs/" + theirs); status != http.StatusNotFound {
		t.Errorf("another namespace's run through this one: %d, want 404", status)
	}
	multi := serve(t, ui.Handler(e.client, ui.Options{Namespaces: namespaces,
		Authorize: func(_ *http.Request, a ui.Access) (string, bool) { return "ops", a.Namespace != "secret" }}))
	_, page := multi.get("n/team-b/runs")
	if !strings.Contains(page, theirs[len(theirs)-12:]) || strings.Contains(page, mine[len(mine)-12:]) {
		t.Errorf("team-b's runs page shows the wrong runs:\n%s", page)
	}
	if status, _ := multi.get("n/secret/runs"); status != http.StatusForbidden {
		t.Errorf("a namespace the hook refuses: %d, want 403", status)
	}
	noFactory := serve(t, ui.Handler(e.client, ui.Options{Authorize: allowAll}))
	if status, _ := noFactory.get("n/team-b/runs"); status != http.StatusNotFound {
		t.Errorf("a namespace the console has no client for: %d, want 404", status)
	}
}

func TestABulkCancelShowsTheCountFirstThenCancelsEveryMatchAndRecordsIt(t *testing.T) {
	e := newEnv(t)
	ids := startIdle(t, e.client, 7)
	other := kagzi.Define("other", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
	keep, err := kagzi.Start(context.Background(), e.client, other, 1)
	if err != nil {
		t.Fatal(err)
	}
	b := serve(t, ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll}))
	_, runs := b.get("n/default/runs?type=idle")
	if !strings.Contains(runs, `href="n/default/bulk?action=cancel&amp;type=idle"`) {
		t.Fatalf("the runs page has no bulk cancel link for its filter:\n%s", runs)
	}
	_, confirm := b.get("n/default/bulk?action=cancel&type=idle")
	if !strings.Contains(confirm, "<b>7</b> runs in namespace <b>default</b> match: runs with workflow type idle") {
		t.Fatalf("the confirmation does not show the count:\n%s", confirm)
	}
	if s := statusOf(t, e.client, ids[0]); s != kagzi.StatusPending {
		t.Fatalf("the confirmation page changed a run: %s", s)
	}
	status, done := b.postFollow("n/default/bulk", confirmForm(t, confirm))
	if status != 200 || !strings.Contains(done, "<b>7</b> matched, <b>7</b> cancelled") {
		t.Fatalf("POST bulk: %d\n%s", status, done)
	}
	for _, id := range ids {
		if s := statusOf(t, e.client, id); s != kagzi.StatusCancelled {
			t.Fatalf("run %s is %s after the bulk cancel", id, s)
		}
	}
	if s := statusOf(t, e.client, keep.RunID); s != kagzi.StatusPending {
		t.Fatalf("a run the filter did not match is %s", s)
	}
	var action, target string
	var count int
	if err := e.pool.QueryRow(context.Background(), `SELECT action, target, run_count FROM kagzi.console_audit`).
		Scan(&action, &target, &count); err != nil {
		t.Fatal(err)
	}
	if action != "bulk-cancel" || target != "runs with workflow type idle" || count != 7 {
		t.Fatalf("audit: %s %q %d", action, target, count)
	}
}

func TestSignalRerunForkAndScheduleActionsThroughTheConsoleDoWhatTheClientDoesAndAreRecorded(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var fail atomicBool
	fail.set(true)
	wait := kagzi.Define("wait", func(ctx *kagzi.Context, _ int) (string, error) {
		if _, err := kagzi.Step(ctx, "first", func(context.Context) (int, error) { return 1, nil }); err != nil {
			return "", err
		}
		got, err := kagzi.WaitSignal[string](ctx, "go", time.Minute)
		if err != nil {
			return "", err
		}
		return kagzi.Step(ctx, "last", func(context.Context) (string, error) {
			if fail.get() {
				return "", kagzi.NonRetryable(errors.New("not yet"))
			}
			return "got " + got, nil
		})
	})
	runWorker(t, e.client, wait)
	run, err := kagzi.Start(ctx, e.client, wait, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := serve(t, ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll}))
	_, page := b.get("n/default/runs/" + run.RunID)
	token := csrf(t, page)
	if status, _, body := b.post("n/default/runs/"+run.RunID+"/signal", url.Values{"csrf": {token}, "name": {"go"}, "payload": {`"hi"`}}); status != http.StatusSeeOther {
		t.Fatalf("POST signal: %d\n%s", status, body)
	}
	if _, err := run.Wait(ctx); !errors.Is(err, kagzi.ErrWorkflowFailed) {
		t.Fatalf("the signalled run: %v, want it FAILED at its last step", err)
	}
	fail.set(false)
	if status, _, body := b.post("n/default/runs/"+run.RunID+"/rerun", url.Values{"csrf": {token}}); status != http.StatusSeeOther {
		t.Fatalf("POST rerun: %d\n%s", status, body)
	}
	if out, err := run.Wait(ctx); err != nil || out != "got hi" {
		t.Fatalf("the rerun: %q, %v", out, err)
	}
	status, loc, body := b.post("n/default/runs/"+run.RunID+"/fork", url.Values{"csrf": {token}, "step": {"last#1"}})
	if status != http.StatusSeeOther || !strings.Contains(loc, "?done=fork") || strings.Contains(loc, run.RunID) {
		t.Fatalf("POST fork: %d to %q\n%s", status, loc, body)
	}
	if _, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: "hourly", WorkflowType: "wait", Cron: "@hourly"}); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"pause", "trigger", "resume"} {
		if status, _, body := b.post("n/default/schedules/hourly/"+a, url.Values{"csrf": {token}}); status != http.StatusSeeOther {
			t.Fatalf("POST %s: %d\n%s", a, status, body)
		}
	}
	if s, _ := e.client.GetSchedule(ctx, "hourly"); s.Paused || s.LastRunID == "" {
		t.Fatalf("schedule after pause, trigger, resume: paused %v, last run %q", s.Paused, s.LastRunID)
	}
	rows, err := e.pool.Query(ctx, `SELECT action, outcome FROM kagzi.console_audit ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var a, o string
		if err := rows.Scan(&a, &o); err != nil {
			t.Fatal(err)
		}
		got = append(got, a+":"+o)
	}
	if want := "signal:ok rerun:ok fork:ok pause:ok trigger:ok resume:ok"; strings.Join(got, " ") != want {
		t.Fatalf("audit %v, want %s", got, want)
	}
	// A refused action is recorded with its error, and the page says why.
	status, _, body = b.post("n/default/runs/"+run.RunID+"/cancel", url.Values{"csrf": {token}})
	if status != http.StatusBadRequest || !strings.Contains(body, "run finished") {
		t.Fatalf("cancelling a finished run: %d\n%s", status, body)
	}
}

type atomicBool struct{ v atomic.Bool }

func (b *atomicBool) set(v bool) { b.v.Store(v) }
func (b *atomicBool) get() bool  { return b.v.Load() }
