package uitest

import (
	"context"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/testdb"
	"github.com/kagzi/kagzi/ui"
)

// Found by an outside tester: a created_after in RFC 3339 (a link, a bookmark, a
// script's URL) is not a value a datetime-local input shows, so the form showed it
// empty and submitting the form again dropped it.
func TestACreationTimeGivenInRFC3339IsShownInTheFormAndKeptWhenTheFormIsSubmitted(t *testing.T) {
	ctx := context.Background()
	pool, _ := testdb.NewPool(t)
	client, err := kagzi.NewClient(pool, kagzi.Config{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.StartByName(ctx, "tick", 1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	after := time.Now().Truncate(time.Second)
	time.Sleep(100 * time.Millisecond)
	late, err := client.StartByName(ctx, "tick", 2)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(ui.Handler(client, ui.Options{Logger: quiet()}))
	t.Cleanup(srv.Close)
	b := newBrowser(t)

	for _, given := range []string{
		after.UTC().Format(time.RFC3339),                                          // 2025-01-02T03:04:05Z
		after.In(time.FixedZone("", 2*3600+30*60)).Format(time.RFC3339),           // +02:30
		after.Add(-time.Second / 4).UTC().Format(time.RFC3339Nano),                // fractional seconds
		after.In(time.FixedZone("", -7*3600)).Format("2006-01-02T15:04:05Z07:00"), // -07:00
	} {
		t.Run(given, func(t *testing.T) {
			run(t, b, chromedp.Navigate(srv.URL+"/n/default/runs?created_after="+url.QueryEscape(given)),
				chromedp.WaitVisible("#runs", chromedp.ByQuery))
			var shown string
			run(t, b, chromedp.Evaluate(`document.querySelector('#run-filter input[name="created_after"]').value`, &shown))
			parsed, _ := time.Parse(time.RFC3339Nano, given)
			if want := parsed.UTC().Format("2006-01-02T15:04:05"); !strings.HasPrefix(shown, want) {
				t.Errorf("created_after=%s shows in the form as %q, want %s (UTC)", given, shown, want)
			}
			var valid bool
			run(t, b, chromedp.Evaluate(`document.getElementById("run-filter").checkValidity()`, &valid))
			if !valid {
				t.Errorf("created_after=%s: the form refuses its own value %q", given, shown)
			}
			run(t, b, chromedp.Evaluate(`document.body.dataset.left = "1", document.getElementById("run-filter").requestSubmit(), true`, &valid))
			var location string
			var ids []string
			run(t, b, chromedp.WaitVisible("body:not([data-left]) #runs", chromedp.ByQuery),
				chromedp.Location(&location),
				chromedp.Evaluate(`Array.from(document.querySelectorAll("#runs a.run-link")).map(a => a.getAttribute("href").split("/").pop())`, &ids))
			u, _ := url.Parse(location)
			if u.Query().Get("created_after") == "" {
				t.Errorf("created_after=%s: submitting the form led to %s, without it", given, location)
			}
			if len(ids) != 1 || ids[0] != late.RunID {
				t.Errorf("created_after=%s: after submitting the form, %s lists %v; want only the later run %s", given, location, ids, late.RunID)
			}
		})
	}
}

// The runs filter's workflow id prefix, error code and attributes fields, typed into
// in the browser and submitted, select the runs they say (found from outside: the
// console had none of them).
func TestTypingAPrefixAnErrorCodeOrAttributesIntoTheRunsFilterSelectsTheirRuns(t *testing.T) {
	ctx := context.Background()
	pool, _ := testdb.NewPool(t)
	client, err := kagzi.NewClient(pool, kagzi.Config{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	boom := kagzi.Define("boom", func(ctx *kagzi.Context, _ int) (int, error) {
		return 0, &kagzi.Error{Code: "KABOOM", Message: "it exploded", NonRetryable: true}
	})
	w, err := kagzi.NewWorker(client, kagzi.WorkerConfig{}, boom)
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(wctx) }()
	t.Cleanup(func() { stop(); <-done })
	failed, err := kagzi.Start(ctx, client, boom, 1, kagzi.WithID("invoice-1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := failed.Wait(ctx); err == nil {
		t.Fatal("the run did not fail")
	}
	order, err := client.StartByName(ctx, "idle", 1, kagzi.WithID("order-7"),
		kagzi.WithAttributes(map[string]any{"customer": "c-7", "order": int64(1234567890123456789)}))
	if err != nil {
		t.Fatal(err)
	}
	other, err := client.StartByName(ctx, "idle", 2, kagzi.WithID("refund-8"), kagzi.WithAttributes(map[string]any{"customer": "c-8"}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(ui.Handler(client, ui.Options{Logger: quiet()}))
	t.Cleanup(srv.Close)
	b := newBrowser(t)
	for _, c := range []struct{ field, value, want string }{
		{"workflow_id_prefix", "order-", order.RunID},
		{"error_code", "KABOOM", failed.RunID},
		{"attributes", `{"order": 1234567890123456789}`, order.RunID},
		{"attributes", `{"customer": "c-8"}`, other.RunID},
	} {
		var ids []string
		var ok bool
		run(t, b, chromedp.Navigate(srv.URL+"/n/default/runs"), chromedp.WaitVisible("#runs", chromedp.ByQuery),
			chromedp.SendKeys(`#run-filter input[name="`+c.field+`"]`, c.value, chromedp.ByQuery),
			chromedp.Evaluate(`document.body.dataset.left = "1", document.getElementById("run-filter").requestSubmit(), true`, &ok),
			chromedp.WaitVisible("body:not([data-left]) #runs", chromedp.ByQuery),
			chromedp.Evaluate(`Array.from(document.querySelectorAll("#runs a.run-link")).map(a => a.getAttribute("href").split("/").pop())`, &ids))
		if len(ids) != 1 || ids[0] != c.want {
			t.Errorf("%s = %s typed into the form: the page lists %v, want only run %s", c.field, c.value, ids, c.want)
		}
	}
}
