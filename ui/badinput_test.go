package ui_test

import (
	"context"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/ui"
)

// Found by an outside audit of the console: each was a 500, a misleading refusal, an
// action audited for a request that was at fault, or links that left the console.

func TestAuditPageTokensOutOfRangeAreBadRequestsNotServerErrors(t *testing.T) {
	e := newEnv(t)
	b := serve(t, ui.Handler(e.client, ui.Options{Logger: quiet()}))
	// An id past int4 (the audit ids are bigint): a page, older than it.
	if status, body := b.get("n/default/audit?page=MjE0NzQ4MzY0OA"); status != http.StatusOK {
		t.Errorf("audit page older than id 2147483648: %d, want 200\n%s", status, body)
	}
	// "0" and "-1" are no ids of the console's links.
	for _, token := range []string{"MA", "LTE"} {
		if status, body := b.get("n/default/audit?page=" + token); status != http.StatusBadRequest {
			t.Errorf("audit page %q: %d, want 400\n%s", token, status, body)
		}
	}
}

func TestAFormOverTheConsolesCapIsRefusedAsTooLargeNotAsAMissingCSRFToken(t *testing.T) {
	e := newEnv(t)
	id := startIdle(t, e.client, 1)[0]
	b := serve(t, ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll, Logger: quiet()}))
	_, page := b.get("n/default/runs/" + id)
	form := url.Values{"csrf": {csrf(t, page)}, "name": {"go"}, "payload": {`"` + strings.Repeat("x", 3<<20) + `"`}}
	status, _, body := b.post("n/default/runs/"+id+"/signal", form)
	if status != http.StatusRequestEntityTooLarge || !strings.Contains(body, "larger than 2 MiB") {
		t.Fatalf("a 3 MB signal form: %d, want 413 saying the form is too large\n%s", status, body)
	}
}

func TestABulkActionWithAFilterTheListingRefusesIsABadRequestAndRecordsNothing(t *testing.T) {
	e := newEnv(t)
	ids := startIdle(t, e.client, 2)
	b := serve(t, ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll, Logger: quiet()}))
	_, confirm := b.get("n/default/bulk?action=cancel&type=idle")
	status, _, body := b.post("n/default/bulk", url.Values{"csrf": {csrf(t, confirm)}, "action": {"cancel"}, "parent": {"xx"}})
	if status != http.StatusBadRequest {
		t.Fatalf("a bulk cancel whose parent is not a run id: %d, want 400\n%s", status, body)
	}
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM kagzi.console_audit`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d audit rows for a refused request, want none", n)
	}
	for _, id := range ids {
		if s := statusOf(t, e.client, id); s != kagzi.StatusPending {
			t.Fatalf("run %s is %s after a refused bulk cancel", id, s)
		}
	}
}

func TestPagesOfANamespaceWithASlashLinkBackToTheConsoleUnderItsPrefix(t *testing.T) {
	e := newEnv(t)
	namespaces := func(ns string) (*kagzi.Client, error) {
		return kagzi.NewClient(e.pool, kagzi.Config{Namespace: ns, Logger: quiet()})
	}
	b := serve(t, ui.Handler(e.client, ui.Options{Namespaces: namespaces, Authorize: allowAll, Logger: quiet()}))
	status, page := b.get("n/a%2Fb/runs")
	if status != http.StatusOK {
		t.Fatalf("runs of namespace a/b: %d\n%s", status, page)
	}
	// /console/n/a%2Fb/runs: "../../" from /console/n/a%2Fb/ is /console/ (the
	// decoded path's extra "/" made it "../../../", above the console).
	if !strings.Contains(page, `<base href="../../">`) {
		t.Fatalf("the page's base does not lead back to /console/:\n%s", page)
	}
}

func TestSwitchingToAnEmptyNamespaceNameIsABadRequestThatSaysSo(t *testing.T) {
	e := newEnv(t)
	b := serve(t, ui.Handler(e.client, ui.Options{Logger: quiet()}))
	for _, path := range []string{"ns", "ns?name=", "ns?name=%20%20"} {
		if status, body := b.get(path); status != http.StatusBadRequest || !strings.Contains(body, "name a namespace") {
			t.Errorf("GET %s: %d, want 400 asking for a namespace\n%s", path, status, body)
		}
	}
	// A name still switches.
	if status, body := b.get("ns?name=default"); status != http.StatusSeeOther {
		t.Errorf("GET ns?name=default: %d, want a redirect to the namespace\n%s", status, body)
	}
}

func TestARequestForANamespaceAuthorizeRefusesMakesNoClient(t *testing.T) {
	e := newEnv(t)
	made := 0
	b := serve(t, ui.Handler(e.client, ui.Options{Logger: quiet(),
		Namespaces: func(ns string) (*kagzi.Client, error) {
			made++
			return kagzi.NewClient(e.pool, kagzi.Config{Namespace: ns, Logger: quiet()})
		},
		Authorize: func(r *http.Request, a ui.Access) (string, bool) {
			return "t", a.Namespace == "default" || a.Namespace == "other"
		}}))
	for i := range 20 {
		if status, body := b.get("n/refused" + string(rune('a'+i)) + "/"); status != http.StatusForbidden {
			t.Fatalf("a refused namespace: %d, want 403\n%s", status, body)
		}
	}
	if made != 0 {
		t.Fatalf("%d clients made for refused requests, want none", made)
	}
	if status, body := b.get("n/other/"); status != http.StatusOK || made != 1 {
		t.Fatalf("an allowed namespace: %d with %d clients made, want 200 and one\n%s", status, made, body)
	}
}

func TestRepeatedWorkflowTypesSelectRunsOfEveryTypeOnTheBulkPageInTheActionAndInTheAudit(t *testing.T) {
	e := newEnv(t)
	ids := startIdle(t, e.client, 2)
	spare := kagzi.Define("spare", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
	spares, err := kagzi.StartMany(context.Background(), e.client, spare, make([]int, 3))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range spares {
		ids = append(ids, r.RunID)
	}
	kept := kagzi.Define("kept", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
	keep, err := kagzi.Start(context.Background(), e.client, kept, 1)
	if err != nil {
		t.Fatal(err)
	}
	b := serve(t, ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll, Logger: quiet()}))
	_, runs := b.get("n/default/runs?type=idle&type=spare")
	// The filter form keeps both types, so that filtering again selects the same runs.
	if !strings.Contains(runs, `name="type" value="idle"`) || !strings.Contains(runs, `name="type" value="spare"`) ||
		strings.Contains(runs, keep.RunID[len(keep.RunID)-12:]) {
		t.Fatalf("the runs page of two types:\n%s", runs)
	}
	_, confirm := b.get("n/default/bulk?action=cancel&type=idle&type=spare")
	if !strings.Contains(confirm, "<b>5</b> runs in namespace <b>default</b> match: runs with workflow type idle or spare") {
		t.Fatalf("the confirmation of two types:\n%s", confirm)
	}
	status, done := b.postFollow("n/default/bulk", confirmForm(t, confirm))
	if status != http.StatusOK || !strings.Contains(done, "<b>5</b> matched, <b>5</b> cancelled") {
		t.Fatalf("POST bulk of two types: %d\n%s", status, done)
	}
	for _, id := range ids {
		if s := statusOf(t, e.client, id); s != kagzi.StatusCancelled {
			t.Fatalf("run %s is %s after the bulk cancel of both its type and another", id, s)
		}
	}
	if s := statusOf(t, e.client, keep.RunID); s != kagzi.StatusPending {
		t.Fatalf("a run of a third type is %s", s)
	}
	var target string
	var count int
	if err := e.pool.QueryRow(context.Background(), `SELECT target, run_count FROM kagzi.console_audit`).
		Scan(&target, &count); err != nil {
		t.Fatal(err)
	}
	if target != "runs with workflow type idle or spare" || count != 5 {
		t.Fatalf("audit: %q %d", target, count)
	}
}

func TestARepeatedSingleValuedFilterIsABadRequestThatDoesNothingAndRecordsNothing(t *testing.T) {
	e := newEnv(t)
	ids := startIdle(t, e.client, 2)
	b := serve(t, ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll, Logger: quiet()}))
	_, confirm := b.get("n/default/bulk?action=cancel&type=idle")
	token := csrf(t, confirm)
	for _, filter := range []url.Values{
		{"workflow_id": {"a", "b"}},
		{"schedule": {"x", "y"}},
		{"parent": {ids[0], ids[1]}},
		{"created_after": {"2020-01-01T00:00", "2021-01-01T00:00"}},
		{"created_before": {"2030-01-01T00:00", "2031-01-01T00:00"}},
	} {
		if status, body := b.get("n/default/bulk?action=cancel&" + filter.Encode()); status != http.StatusBadRequest ||
			!strings.Contains(body, "takes one value") {
			t.Errorf("bulk confirmation of %s: %d, want 400 saying it takes one value\n%s", filter.Encode(), status, body)
		}
		form := url.Values{"csrf": {token}, "action": {"cancel"}}
		for k, v := range filter {
			form[k] = v
		}
		if status, _, body := b.post("n/default/bulk", form); status != http.StatusBadRequest ||
			!strings.Contains(body, "takes one value") {
			t.Errorf("bulk cancel of %s: %d, want 400 saying it takes one value\n%s", filter.Encode(), status, body)
		}
		if status, body := b.get("n/default/runs?" + filter.Encode()); status != http.StatusBadRequest ||
			!strings.Contains(body, `id="filter-error"`) || !strings.Contains(body, "takes one value") {
			t.Errorf("runs page of %s: %d, want 400 with the filter's error in the page\n%s", filter.Encode(), status, body)
		}
	}
	if n := auditRows(t, e); n != 0 {
		t.Fatalf("%d audit rows for refused requests, want none", n)
	}
	for _, id := range ids {
		if s := statusOf(t, e.client, id); s != kagzi.StatusPending {
			t.Fatalf("run %s is %s after refused bulk cancels", id, s)
		}
	}
}

func TestANamespaceURLWithoutItsSlashRedirectsRelativelyUnderThePrefix(t *testing.T) {
	e := newEnv(t)
	namespaces := func(ns string) (*kagzi.Client, error) {
		return kagzi.NewClient(e.pool, kagzi.Config{Namespace: ns, Logger: quiet()})
	}
	b := serve(t, ui.Handler(e.client, ui.Options{Namespaces: namespaces, Authorize: allowAll, Logger: quiet()}))
	for path, want := range map[string]string{"n/default": "/console/n/default/", "n/a%2Fb": "/console/n/a%2Fb/"} {
		u, _ := url.Parse(b.srv.URL + "/console/" + path)
		resp, err := b.http.Get(u.String())
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		loc := resp.Header.Get("Location")
		if resp.StatusCode != http.StatusSeeOther || strings.HasPrefix(loc, "/") {
			t.Errorf("GET %s: %d to %q, want a relative 303", path, resp.StatusCode, loc)
			continue
		}
		to, err := url.Parse(loc)
		if err != nil {
			t.Fatal(err)
		}
		if got := u.ResolveReference(to).EscapedPath(); got != want {
			t.Errorf("GET %s: redirected to %s, want %s", path, got, want)
		}
		if status, body := b.get(strings.TrimPrefix(want, "/console/")); status != http.StatusOK {
			t.Errorf("GET %s: %d\n%s", want, status, body)
		}
	}
}

func TestNamespacesNamedDotOrDotDotAreBadRequestsThatSayWhy(t *testing.T) {
	e := newEnv(t)
	namespaces := func(ns string) (*kagzi.Client, error) {
		return kagzi.NewClient(e.pool, kagzi.Config{Namespace: ns, Logger: quiet()})
	}
	b := serve(t, ui.Handler(e.client, ui.Options{Namespaces: namespaces, Authorize: allowAll, Logger: quiet()}))
	// Browsers resolve "." and ".." (and "%2E", "%2E%2E") segments away: no link to
	// such a namespace's pages could work.
	for _, path := range []string{"n/%2E/", "n/%2E%2E/runs", "n/%2e", "n/%2E%2E", "ns?name=.", "ns?name=..", "ns?name=+..+"} {
		if status, body := b.get(path); status != http.StatusBadRequest || !strings.Contains(body, "cannot be served") {
			t.Errorf("GET %s: %d, want 400 saying the namespace cannot be served\n%s", path, status, body)
		}
	}
	// A console whose own namespace is "..", a name the client takes.
	dots, err := kagzi.NewClient(e.pool, kagzi.Config{Namespace: "..", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	b = serve(t, ui.Handler(dots, ui.Options{Logger: quiet()}))
	if status, body := b.get(""); status != http.StatusBadRequest || !strings.Contains(body, "cannot be served") {
		t.Errorf("the root of a console of namespace \"..\": %d, want 400\n%s", status, body)
	}
}

func TestSchedulesWithTheIDsDotAndDotDotAreShownUnlinkedAndTheirURLsRefused(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	b := serve(t, ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll, Logger: quiet()}))
	for _, path := range []string{"n/default/schedules/%2E", "n/default/schedules/%2E%2E"} {
		if status, body := b.get(path); status != http.StatusBadRequest || !strings.Contains(body, "cannot be") {
			t.Errorf("GET %s: %d, want 400 saying why\n%s", path, status, body)
		}
	}
	_, confirm := b.get("n/default/bulk?action=cancel")
	if status, _, body := b.post("n/default/schedules/%2E%2E/pause", url.Values{"csrf": {csrf(t, confirm)}}); status != http.StatusBadRequest {
		t.Errorf("POST pause of schedule \"..\": %d, want 400\n%s", status, body)
	}
	if n := auditRows(t, e); n != 0 {
		t.Fatalf("%d audit rows for refused requests, want none", n)
	}

	var runID string
	for _, id := range []string{".", ".."} {
		if _, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: id, WorkflowType: "idle", Cron: "0 3 * * *"}); err != nil {
			t.Fatal(err)
		}
		run, err := e.client.TriggerSchedule(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		runID = run.RunID
	}
	status, list := b.get("n/default/schedules")
	if status != http.StatusOK {
		t.Fatalf("schedules: %d\n%s", status, list)
	}
	for _, bad := range []string{`schedules/."`, `schedules/.."`, `schedules/./`, `schedules/../`} {
		if strings.Contains(list, bad) {
			t.Errorf("the schedules page links %s:\n%s", bad, list)
		}
	}
	if !strings.Contains(list, "<td>..") {
		t.Errorf("the schedules page does not list schedule \"..\":\n%s", list)
	}
	_, run := b.get("n/default/runs/" + runID)
	if strings.Contains(run, `schedules/.."`) || !strings.Contains(run, "<dt>schedule</dt><dd>..") {
		t.Errorf("the page of a run of schedule \"..\" links it, or does not name it:\n%s", run)
	}
}

func TestTheSchedulePageShowsTheEffectiveCatchUpOfAScheduleWithoutMaxCatchup(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, sc := range []kagzi.Schedule{
		{ID: "plain", WorkflowType: "idle", Cron: "0 3 * * *"},
		{ID: "eager", WorkflowType: "idle", Cron: "0 3 * * *", MaxCatchup: 5},
	} {
		if _, err := e.client.CreateSchedule(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	b := serve(t, ui.Handler(e.client, ui.Options{Logger: quiet()}))
	for id, want := range map[string]string{"plain": "at most 1 due tick a pass (the default)", "eager": "at most 5 due ticks a pass"} {
		if _, page := b.get("n/default/schedules/" + id); !strings.Contains(page, want) {
			t.Errorf("schedule %s: the page lacks %q", id, want)
		}
	}
}

func TestASignalWithoutANameIsABadRequestThatRecordsNothing(t *testing.T) {
	e := newEnv(t)
	id := startIdle(t, e.client, 1)[0]
	b := serve(t, ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll, Logger: quiet()}))
	_, page := b.get("n/default/runs/" + id)
	status, _, body := b.post("n/default/runs/"+id+"/signal", url.Values{"csrf": {csrf(t, page)}, "name": {"  "}, "payload": {"1"}})
	if status != http.StatusBadRequest || !strings.Contains(body, "name the signal") {
		t.Fatalf("a signal without a name: %d, want 400 asking for one\n%s", status, body)
	}
	if n := auditRows(t, e); n != 0 {
		t.Fatalf("%d audit rows for a refused signal, want none", n)
	}
}

// Found in a browser: the bulk action rendered its result in the POST's answer, so a
// reload posted the action again, without a confirmation, and cancelled runs started
// since.
func TestReloadingABulkActionsResultShowsItAgainAndDoesNothingMore(t *testing.T) {
	e := newEnv(t)
	startIdle(t, e.client, 2)
	b := serve(t, ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll, Logger: quiet()}))
	_, confirm := b.get("n/default/bulk?action=cancel&type=idle")
	status, loc, _ := b.post("n/default/bulk", confirmForm(t, confirm))
	if status != http.StatusSeeOther || !strings.Contains(loc, "bulk/done?") {
		t.Fatalf("POST bulk: %d to %q, want a redirect to its result", status, loc)
	}
	late := startIdle(t, e.client, 1)[0] // started after the action
	for range 2 {                        // the result, then a reload of it
		_, page := b.get(strings.TrimPrefix(loc, "../../"))
		if !strings.Contains(page, "<b>2</b> matched, <b>2</b> cancelled") || !strings.Contains(page, "workflow type idle") {
			t.Fatalf("the result page (Location %q):\n%s", loc, page)
		}
	}
	if s := statusOf(t, e.client, late); s != kagzi.StatusPending {
		t.Fatalf("a run started after the bulk cancel is %s after its result was shown twice", s)
	}
	if n := auditRows(t, e); n != 1 {
		t.Fatalf("%d audit rows, want the one action", n)
	}
	if status, _ := b.get("n/default/bulk/done?audit=999999&type=idle"); status != http.StatusNotFound {
		t.Fatalf("the result of an unknown action: %d, want 404", status)
	}
}

// Found in a browser: a run that continued as new did not link to the run that took
// over, and a run held back by a limit did not say so.
func TestARunPageLinksTheRunItContinuedAsAndSaysWhatHoldsItBack(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	wf := kagzi.Define("page-chain", func(ctx *kagzi.Context, n int) (int, error) {
		if n == 0 {
			return 0, kagzi.ContinueAsNew(ctx, 1)
		}
		return n, nil
	})
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "page-chain", Rate: 2, RatePeriod: time.Hour}); err != nil {
		t.Fatal(err)
	}
	runWorker(t, e.client, wf)
	first, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Wait(ctx); err != nil { // the chain's two runs used the rate's two
		t.Fatal(err)
	}
	held, err := kagzi.Start(ctx, e.client, wf, 5)
	if err != nil {
		t.Fatal(err)
	}
	info, err := e.client.GetRun(ctx, first.RunID)
	if err != nil {
		t.Fatal(err)
	}
	b := serve(t, ui.Handler(e.client, ui.Options{Logger: quiet()}))
	if _, page := b.get("n/default/runs/" + first.RunID); !strings.Contains(page, `id="continued-link" href="n/default/runs/`+info.ContinuedAsRunID+`"`) {
		t.Errorf("the continued run's page does not link the run that took over (%s):\n%s", info.ContinuedAsRunID, page)
	}
	if _, page := b.get("n/default/runs/" + held.RunID); !strings.Contains(page, "held by the rate limit until") {
		t.Errorf("the held run's page does not say what holds it:\n%s", page)
	}
}

// Found by an outside tester: a bulk action's result page read the counts from the
// audit log but described the filter from its own address, so the record of a cancel
// of one type read as a cancel of whatever type a link named.
func TestABulkActionsResultDescribesTheFilterItsAuditRecordHoldsNotItsAddress(t *testing.T) {
	e := newEnv(t)
	startIdle(t, e.client, 2)
	if _, err := e.client.StartByName(context.Background(), "payments", 1); err != nil {
		t.Fatal(err)
	}
	b := serve(t, ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll, Logger: quiet()}))
	_, confirm := b.get("n/default/bulk?action=cancel&type=idle&status=PENDING")
	status, loc, _ := b.post("n/default/bulk", confirmForm(t, confirm))
	m := regexp.MustCompile(`bulk/done\?audit=(\d+)`).FindStringSubmatch(loc)
	if status != http.StatusSeeOther || m == nil {
		t.Fatalf("POST bulk: %d to %q, want a redirect to its result", status, loc)
	}
	result := regexp.MustCompile(`(?s)id="bulk-result">(.*?)</p>`)
	back := regexp.MustCompile(`href="([^"]*)">Back to the runs`)
	for _, query := range []string{"", "&type=payments", "&status=COMPLETED&type=payments", "&workflow_id=x&created_after=2020-01-01T00:00",
		"&status=NOPE", "&workflow_id=a&workflow_id=b"} {
		status, page := b.get("n/default/bulk/done?audit=" + m[1] + query)
		if status != http.StatusOK {
			t.Errorf("bulk/done?audit=%s%s: %d, want the record's result\n%s", m[1], query, status, page)
			continue
		}
		got := result.FindStringSubmatch(page)
		if got == nil || !strings.Contains(got[1], "<b>2</b> matched, <b>2</b> cancelled — runs with status PENDING, workflow type idle.") {
			t.Errorf("bulk/done?audit=%s%s describes the bulk cancel of the PENDING idle runs as:\n%v", m[1], query, got)
		}
		if l := back.FindStringSubmatch(page); l == nil || html.UnescapeString(l[1]) != "n/default/runs?status=PENDING&type=idle" {
			t.Errorf("bulk/done?audit=%s%s links back to the runs as %v, want the audited filter's", m[1], query, l)
		}
	}
}
