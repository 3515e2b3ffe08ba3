package uitest

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/testdb"
	"github.com/kagzi/kagzi/ui"
)

// Found in a browser: long unbroken names and errors widened pages thirty times past
// the window, the auto-refresh toggle did nothing until the box lost focus, and an
// action's message came back at every reload.
func TestLongNamesWrapTheAutoRefreshToggleWorksAtOnceAndAnActionsMessageShowsOnce(t *testing.T) {
	ctx := context.Background()
	pool, _ := testdb.NewPool(t)
	client, err := kagzi.NewClient(pool, kagzi.Config{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	long := "step-" + strings.Repeat("x", 190)
	token := strings.Repeat("E", 2000)
	wf := kagzi.Define("long-fail", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Step(ctx, long, func(context.Context) (int, error) {
			return 0, kagzi.NonRetryable(errors.New("boom " + token))
		})
	})
	worker, err := kagzi.NewWorker(client, kagzi.WorkerConfig{}, wf)
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- worker.Run(wctx) }()
	t.Cleanup(func() { stop(); <-done })
	runH, err := kagzi.Start(ctx, client, wf, 1, kagzi.WithID("wid-"+strings.Repeat("w", 200)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := runH.Wait(ctx); err == nil {
		t.Fatal("the run completed; want it FAILED")
	}
	srv := httptest.NewServer(ui.Handler(client, ui.Options{Actions: true, RefreshInterval: 2 * time.Second, Logger: quiet(),
		Authorize: func(r *http.Request, a ui.Access) (string, bool) { return "t", true }}))
	t.Cleanup(srv.Close)
	b := newBrowser(t)
	base := srv.URL + "/n/default/"

	for _, page := range []string{"runs/" + runH.RunID, "runs?type=long-fail"} {
		var scroll, inner int
		run(t, b, chromedp.Navigate(base+page), chromedp.WaitVisible("main", chromedp.ByQuery),
			chromedp.Evaluate(`document.documentElement.scrollWidth`, &scroll),
			chromedp.Evaluate(`window.innerWidth`, &inner))
		if scroll > inner+20 {
			var wide string
			run(t, b, chromedp.Evaluate(`Array.from(document.querySelectorAll("body *")).filter(e => e.getBoundingClientRect().right > window.innerWidth+20).map(e => e.tagName + "." + e.className + "#" + e.id + ":" + Math.round(e.getBoundingClientRect().width)).slice(0, 12).join(" ")`, &wide))
			t.Logf("wider than the window: %s", wide)
			t.Errorf("%s is %d px wide in a window of %d: long names and errors do not wrap", page, scroll, inner)
		}
	}

	// Auto-refresh, turned on by a click (the box keeps the focus): the page reloads.
	var marked bool
	run(t, b, chromedp.Navigate(base+"runs"), chromedp.WaitVisible("#autorefresh", chromedp.ByQuery),
		chromedp.Evaluate(`window.kagziMark = 1, true`, &marked))
	var focused bool // as after a click: the box ticked, and holding the focus
	// The reloaded page must not reload again (while this test reads it): the stored
	// choice is turned off behind the ticked box, which has its reload scheduled.
	run(t, b, chromedp.Evaluate(`(b => { b.focus(); b.click(); localStorage.setItem("kagzi.console.autorefresh", "0");
		return document.activeElement === b && b.checked })(document.getElementById("autorefresh"))`, &focused))
	if !focused {
		t.Fatal("could not tick the auto-refresh box and keep the focus on it")
	}
	var reloaded bool
	time.Sleep(3 * 2 * time.Second) // the box is ticked: the reload comes within the interval
	run(t, b, chromedp.WaitVisible("main", chromedp.ByQuery),
		chromedp.Evaluate(`window.kagziMark === undefined`, &reloaded))
	if !reloaded {
		t.Fatal("the page did not reload after the auto-refresh box was ticked")
	}

	// An action's message shows once: the address loses its "done" parameter.
	var search string
	run(t, b, chromedp.Navigate(base+"runs/"+runH.RunID+"?done=rerun"), chromedp.WaitVisible("main", chromedp.ByQuery))
	contains(t, b, "main", "The run was made PENDING again.")
	run(t, b, chromedp.Evaluate(`window.location.search`, &search))
	if strings.Contains(search, "done") {
		t.Fatalf("the address still carries %q after the message was shown", search)
	}
}
