package ui_test

import (
	"context"
	"errors"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/ui"
)

// Found from outside: a NUL byte (or bytes that are not UTF-8) in a form field or path
// segment an action records in the audit log made the audit's insert fail, a 500
// "could not read the database", where bad input is a 400 that changes nothing.
func TestAnActionWithANULOrBytesThatAreNotUTF8IsABadRequestAndChangesNothing(t *testing.T) {
	e := newEnv(t)
	id := startIdle(t, e.client, 1)[0]
	b := serve(t, ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll, Logger: quiet()}))
	_, page := b.get("n/default/runs/" + id)
	tok := csrf(t, page)
	cases := []struct {
		path string
		form url.Values
	}{
		{"n/default/runs/" + id + "/signal", url.Values{"name": {"a\x00b"}}},
		{"n/default/runs/" + id + "/fork", url.Values{"step": {"a\x00b"}}},
		{"n/default/bulk", url.Values{"action": {"cancel"}, "type": {"nothing-matches"}, "counted_at": {"2030-01-01T00:00:00Z"}, "count": {"1\x002"}}},
		{"n/default/schedules/a%00b/pause", nil},
		{"n/default/schedules/%FF/trigger", nil},
	}
	for _, c := range cases {
		form := url.Values{"csrf": {tok}}
		for k, v := range c.form {
			form[k] = v
		}
		if status, _, body := b.post(c.path, form); status >= 500 {
			msg := body
			if i := strings.Index(body, `id="error-message">`); i >= 0 {
				msg = body[i : i+120]
			}
			t.Errorf("POST %s %q: %d, want a 4xx\n%s", c.path, c.form, status, msg)
		}
	}
	if s := statusOf(t, e.client, id); s != kagzi.StatusPending {
		t.Fatalf("the run is %s", s)
	}
}

// The same through an Authorize hook that names the caller as the request says, as
// `kagzi ui` does with the Basic user name (cmd/kagzi/ui.go caller): a user name
// with a NUL made every action a 500.
func TestAnActionByACallerWhoseNameHoldsANULIsABadRequestNotAServerError(t *testing.T) {
	e := newEnv(t)
	id := startIdle(t, e.client, 1)[0]
	basicUser := func(r *http.Request, _ ui.Access) (string, bool) {
		u, _, _ := r.BasicAuth()
		return u, true
	}
	h := ui.Handler(e.client, ui.Options{Actions: true, Authorize: basicUser, Logger: quiet()})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	cl := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get, _ := http.NewRequest(http.MethodGet, srv.URL+"/n/default/runs/"+id, nil)
	get.SetBasicAuth("a\x00b", "tok")
	resp, err := cl.Do(get)
	if err != nil {
		t.Fatal(err)
	}
	pageBytes, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	page := string(pageBytes)
	post, _ := http.NewRequest(http.MethodPost, srv.URL+"/n/default/runs/"+id+"/cancel",
		strings.NewReader(url.Values{"csrf": {csrf(t, page)}}.Encode()))
	post.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	post.SetBasicAuth("a\x00b", "tok")
	resp, err = cl.Do(post)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode >= 500 {
		t.Fatalf("a cancel by user %q: %d, want a 4xx", "a\x00b", resp.StatusCode)
	}
	if s := statusOf(t, e.client, id); s != kagzi.StatusPending {
		t.Fatalf("the run is %s after a refused cancel", s)
	}
}

// Found from outside: the runs list had no workflow id prefix, error code or
// attributes filter (the CLI and the admin API have them): the parameters were
// ignored and the page, and a bulk confirmation of such a filter, covered every run.
func TestTheRunsListFiltersByWorkflowIDPrefixErrorCodeAndAttributes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	boom := kagzi.Define("boom", func(ctx *kagzi.Context, _ int) (int, error) {
		return 0, &kagzi.Error{Code: "KABOOM", Message: "it exploded", NonRetryable: true}
	})
	quietFail := kagzi.Define("quietfail", func(ctx *kagzi.Context, _ int) (int, error) {
		return 0, kagzi.NonRetryable(errors.New("other"))
	})
	runWorker(t, e.client, boom, quietFail)
	order, err := kagzi.Start(ctx, e.client, boom, 1, kagzi.WithID("order-1"), kagzi.WithAttributes(map[string]any{"customer": "c-7"}))
	if err != nil {
		t.Fatal(err)
	}
	other, err := kagzi.Start(ctx, e.client, quietFail, 1, kagzi.WithID("invoice-1"))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = order.Wait(ctx)
	_, _ = other.Wait(ctx)
	b := serve(t, ui.Handler(e.client, ui.Options{Logger: quiet()}))
	_, form := b.get("n/default/runs")
	for _, field := range []string{"workflow_id_prefix", "error_code", "attributes"} {
		if !strings.Contains(form, `name="`+field+`"`) {
			t.Errorf("the runs filter form has no %s field", field)
		}
	}
	for _, q := range []string{"workflow_id_prefix=order-", "error_code=KABOOM", "attributes=" + url.QueryEscape(`{"customer":"c-7"}`)} {
		status, page := b.get("n/default/runs?" + q)
		if status != http.StatusOK || !strings.Contains(page, order.RunID) {
			t.Errorf("runs?%s: %d, or it does not list run %s", q, status, order.RunID)
		}
		if strings.Contains(page, other.RunID) {
			t.Errorf("runs?%s lists run %s (workflow id invoice-1, no error code KABOOM, no attributes): the filter is ignored", q, other.RunID)
		}
	}
	if _, page := b.get("n/default/runs?attributes=" + url.QueryEscape(`["c-7"]`)); strings.Contains(page, order.RunID) ||
		!strings.Contains(page, "not a JSON object") {
		t.Errorf("runs with attributes that are no JSON object: the page lists runs or does not say why it refused")
	}
}

// Found from outside: an error page rendered before the request's namespace was read
// (a form over the cap: 413; an unknown action; an unreadable form) linked its header
// and "Back to the overview" to "n//…", which lead nowhere. A signal payload over
// 2 MiB is an ordinary way to land there.
func TestAnErrorPageOfARefusedFormLinksBackToTheNamespace(t *testing.T) {
	e := newEnv(t)
	id := startIdle(t, e.client, 1)[0]
	b := serve(t, ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll, Logger: quiet()}))
	_, page := b.get("n/default/runs/" + id)
	tok := csrf(t, page)
	for name, c := range map[string]struct {
		path string
		form url.Values
	}{
		"a signal over 2 MiB": {"n/default/runs/" + id + "/signal", url.Values{"name": {"go"}, "payload": {`"` + strings.Repeat("x", 3<<20) + `"`}}},
		"an unknown action":   {"n/default/runs/" + id + "/nuke", nil},
	} {
		form := url.Values{"csrf": {tok}}
		for k, v := range c.form {
			form[k] = v
		}
		status, _, body := b.post(c.path, form)
		if status < 400 {
			t.Fatalf("%s: %d", name, status)
		}
		for _, m := range linkRE.FindAllStringSubmatch(baseRE.ReplaceAllString(body, ""), -1) {
			if href := html.UnescapeString(m[1]); strings.HasPrefix(href, "n//") {
				t.Errorf("%s: the error page (%d) links to %q, not to namespace default's pages", name, status, href)
				break
			}
		}
	}
}

// Found in review: the error page of a route without a namespace in its path (the
// namespace switcher) still linked to "n//".
func TestTheNamespaceSwitchersErrorPageLinksToTheNamespace(t *testing.T) {
	e := newEnv(t)
	b := serve(t, ui.Handler(e.client, ui.Options{Logger: quiet()}))
	for _, path := range []string{"ns?name=", "ns?name=.."} {
		status, body := b.get(path)
		if status != http.StatusBadRequest {
			t.Errorf("GET %s: %d", path, status)
		}
		for _, m := range linkRE.FindAllStringSubmatch(baseRE.ReplaceAllString(body, ""), -1) {
			if href := html.UnescapeString(m[1]); strings.HasPrefix(href, "n//") {
				t.Errorf("GET %s: the error page links to %q", path, href)
				break
			}
		}
	}
}

// Found in review: the attributes filter read numbers as float64, so a 19-digit id
// selected no run (the library and the CLI keep it exact)...
func TestTheAttributesFilterSelectsTheRunOfA19DigitID(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	wf := kagzi.Define("attr-idle", func(ctx *kagzi.Context, _ int) (int, error) { return 0, nil })
	r, err := kagzi.Start(ctx, e.client, wf, 1, kagzi.WithAttributes(map[string]any{"order": int64(1234567890123456789)}))
	if err != nil {
		t.Fatal(err)
	}
	page, err := e.client.ListRuns(ctx, kagzi.RunFilter{Attributes: map[string]any{"order": int64(1234567890123456789)}})
	if err != nil || len(page.Runs) != 1 {
		t.Fatalf("library: %v, %v", page, err)
	}
	b := serve(t, ui.Handler(e.client, ui.Options{Logger: quiet()}))
	status, body := b.get("n/default/runs?attributes=" + url.QueryEscape(`{"order":1234567890123456789}`))
	if status != http.StatusOK || !strings.Contains(body, r.RunID) {
		t.Errorf("console runs?attributes={\"order\":1234567890123456789}: %d, lists run %s: %v", status, r.RunID, strings.Contains(body, r.RunID))
	}
}

// ...and selected another run, one a bulk action of the filter would then change.
func TestTheAttributesFilterOfA19DigitIDSelectsNoOtherRun(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	wf := kagzi.Define("attr-idle", func(ctx *kagzi.Context, _ int) (int, error) { return 0, nil })
	other, err := kagzi.Start(ctx, e.client, wf, 1, kagzi.WithAttributes(map[string]any{"order": int64(1234567890123456800)}))
	if err != nil {
		t.Fatal(err)
	}
	b := serve(t, ui.Handler(e.client, ui.Options{Logger: quiet()}))
	_, body := b.get("n/default/runs?attributes=" + url.QueryEscape(`{"order":1234567890123456789}`))
	if strings.Contains(body, other.RunID) {
		t.Errorf("runs?attributes={\"order\":1234567890123456789} lists run %s, whose order is 1234567890123456800", other.RunID)
	}
}
