package uitest

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/testdb"
	"github.com/kagzi/kagzi/ui"
)

// Found by an outside tester: an 8 KB error, failing each of a step's 3 attempts,
// made a run's page 8,200 px tall and squeezed the step table's columns, and the runs
// list printed the whole message in its row.
func TestLongErrorsShowAnExcerptThatKeepsThePagesLayoutWithTheWholeMessageAClickAway(t *testing.T) {
	ctx := context.Background()
	pool, _ := testdb.NewPool(t)
	client, err := kagzi.NewClient(pool, kagzi.Config{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	var msg strings.Builder
	for i := 0; msg.Len() < 8<<10; i++ {
		fmt.Fprintf(&msg, "upstream inventory service answered 502 Bad Gateway for warehouse %d; ", i)
	}
	long := msg.String()
	wf := kagzi.Define("flaky-fetch", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Step(ctx, "fetch", func(context.Context) (int, error) {
			return 0, errors.New(long)
		}, kagzi.WithRetry(kagzi.Linear(3, 10*time.Millisecond)))
	})
	worker, err := kagzi.NewWorker(client, kagzi.WorkerConfig{}, wf)
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- worker.Run(wctx) }()
	t.Cleanup(func() { stop(); <-done })
	h, err := kagzi.Start(ctx, client, wf, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Wait(ctx); err == nil {
		t.Fatal("the run completed; want it FAILED")
	}
	steps, err := client.ListSteps(ctx, h.RunID)
	if err != nil || len(steps) != 1 || len(steps[0].Attempts) != 3 {
		t.Fatalf("the run's steps: %+v, %v; want one step of 3 failed attempts", steps, err)
	}
	srv := httptest.NewServer(ui.Handler(client, ui.Options{Logger: quiet()}))
	t.Cleanup(srv.Close)
	b := newBrowser(t)

	t.Run("the run's page", func(t *testing.T) {
		var height int
		var cells [][]float64
		run(t, b, chromedp.Navigate(srv.URL+"/n/default/runs/"+h.RunID), chromedp.WaitVisible("#steps", chromedp.ByQuery),
			chromedp.Evaluate(`document.documentElement.scrollHeight`, &height),
			// The height of what the key, kind and status cells of each step show.
			chromedp.Evaluate(`Array.from(document.querySelectorAll("#steps tbody tr")).map(tr => [0, 1, 2].map(i => {
				const r = document.createRange(); r.selectNodeContents(tr.cells[i]); return r.getBoundingClientRect().height }))`, &cells))
		if height > 2000 { // 9,300 px with every message whole
			t.Errorf("the run's page is %d px tall", height)
		}
		for _, row := range cells {
			for i, h := range row {
				if h > 24 {
					t.Errorf("the step table's %s column is squeezed: its text takes %.0f px, more than a line", []string{"key", "kind", "status"}[i], h)
				}
			}
		}
		// The whole message is a click away: in the error box and in the step table.
		for _, box := range []string{"#run-error", "#steps"} {
			if !present(t, b, box+" details.errfull summary") {
				continue
			}
			var whole string
			run(t, b, chromedp.Click(box+" details.errfull summary", chromedp.ByQuery),
				chromedp.WaitVisible(box+" details.errfull[open] pre", chromedp.ByQuery),
				chromedp.Text(box+" details.errfull[open] pre", &whole, chromedp.ByQuery))
			if !strings.Contains(whole, strings.TrimSpace(long)) {
				t.Errorf("%s: the opened message is %d characters; want the whole %d", box, len(whole), len(long))
			}
		}
		var opened int
		run(t, b, chromedp.Evaluate(`document.documentElement.scrollHeight`, &opened))
		if opened > height+2*400 {
			t.Errorf("with two whole messages open the page is %d px tall (%d closed): an opened message is not bounded", opened, height)
		}
	})
	t.Run("the runs list", func(t *testing.T) {
		var rowH float64
		var shown int
		run(t, b, chromedp.Navigate(srv.URL+"/n/default/runs?type=flaky-fetch"), chromedp.WaitVisible("#runs", chromedp.ByQuery),
			chromedp.Evaluate(`document.querySelector("#runs tbody tr").getBoundingClientRect().height`, &rowH),
			chromedp.Evaluate(`document.querySelector("#runs tbody tr").innerText.length`, &shown))
		if rowH > 240 || shown > 1000 { // 1,500 px and 8,300 characters with the message whole
			t.Errorf("the failed run's row is %.0f px tall and shows %d characters", rowH, shown)
		}
		if !present(t, b, "#runs details.errfull summary") {
			return
		}
		var whole string
		run(t, b, chromedp.Click("#runs details.errfull summary", chromedp.ByQuery),
			chromedp.WaitVisible("#runs details.errfull[open] pre", chromedp.ByQuery),
			chromedp.Text("#runs details.errfull[open] pre", &whole, chromedp.ByQuery))
		if !strings.Contains(whole, strings.TrimSpace(long)) {
			t.Errorf("the runs list's opened message is %d characters; want the whole %d", len(whole), len(long))
		}
	})
}

// present reports whether the page has an element matching sel, and says so when not.
func present(t *testing.T, b context.Context, sel string) bool {
	t.Helper()
	var n int
	run(t, b, chromedp.Evaluate(`document.querySelectorAll(`+jsString(sel)+`).length`, &n))
	if n == 0 {
		t.Errorf("the page has no %s: the whole message cannot be opened", sel)
	}
	return n > 0
}
