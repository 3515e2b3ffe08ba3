package uitest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/testdb"
	"github.com/kagzi/kagzi/ui"
)

// Found by an outside tester: the confirmation's button said "Cancel 5 runs" and
// cancelled 25, the 20 started while the confirmation was open too, though its note
// said that runs started after it would not be included.
func TestABulkCancelConfirmedForFiveRunsCancelsThoseFiveNotTheRunsStartedWhileItWasOpen(t *testing.T) {
	ctx := context.Background()
	pool, _ := testdb.NewPool(t)
	client, err := kagzi.NewClient(pool, kagzi.Config{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	start := func(n int) { // runs of a type no worker runs: they stay PENDING
		t.Helper()
		for i := range n {
			if _, err := client.StartByName(ctx, "import-batch", i); err != nil {
				t.Fatal(err)
			}
		}
	}
	start(5)
	srv := httptest.NewServer(ui.Handler(client, ui.Options{Actions: true, Logger: quiet(),
		Authorize: func(*http.Request, ui.Access) (string, bool) { return "ops@example.com", true }}))
	t.Cleanup(srv.Close)
	b := newBrowser(t)

	run(t, b, chromedp.Navigate(srv.URL+"/n/default/runs?type=import-batch"), chromedp.WaitVisible("#bulk-cancel", chromedp.ByQuery),
		chromedp.Click("#bulk-cancel", chromedp.ByQuery), chromedp.WaitVisible("#bulk-count", chromedp.ByQuery))
	contains(t, b, "#bulk-count", "5 runs in namespace default match")
	contains(t, b, "#bulk-confirm", "Cancel 5 runs")
	cutoff := func(want string) { // the note on the cutoff, without waiting for it
		t.Helper()
		var note string
		run(t, b, chromedp.Evaluate(`document.getElementById("bulk-cutoff")?.textContent ?? ""`, &note))
		if !strings.Contains(note, want) {
			t.Errorf("the page's note on the cutoff is %q; want it to say %q", note, want)
		}
	}
	cutoff("Runs created after this page counted them")
	start(20) // while the operator reads the confirmation
	run(t, b, chromedp.Click("#bulk-confirm", chromedp.ByQuery), chromedp.WaitVisible("#bulk-result", chromedp.ByQuery))
	contains(t, b, "#bulk-result", "5 matched, 5 cancelled")
	cutoff("were not included")

	var cancelled, pending, audited int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'CANCELLED'), count(*) FILTER (WHERE status = 'PENDING')
		FROM kagzi.runs WHERE workflow_type = 'import-batch'`).Scan(&cancelled, &pending); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT run_count FROM kagzi.console_audit WHERE action = 'bulk-cancel'`).Scan(&audited); err != nil {
		t.Fatal(err)
	}
	if cancelled != 5 || pending != 20 || audited != 5 {
		t.Fatalf("after confirming the cancel of 5 runs: %d cancelled, %d pending, %d recorded; want 5, the 20 started since, 5",
			cancelled, pending, audited)
	}
}
