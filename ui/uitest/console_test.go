package uitest

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/testdb"
	"github.com/kagzi/kagzi/ui"
)

var screenshots = flag.Bool("screenshots", false, "write the screenshots of the console's views into docs/console")

// chromium finds the browser: $KAGZI_CHROMIUM, else chromium (Debian's package) or
// another Chrome in PATH.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("KAGZI_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no Chromium found: install Debian's chromium package (apt-get install chromium; scripts/test does as root) " +
		"or set KAGZI_CHROMIUM to a Chrome or Chromium binary")
	return ""
}

// newBrowser starts a headless Chromium with a fresh profile and nothing that reaches
// the network on its own.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	profile, err := os.MkdirTemp("", "kagzi-console-chromium")
	if err != nil {
		t.Fatal(err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1360, 900),
		// On a loaded 2-core box Chromium took more than the default 20 s to start.
		chromedp.WSURLReadTimeout(90 * time.Second),
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() {
		cancelTimeout()
		cancel()
		cancelAlloc() // waits for the browser to exit
		_ = os.RemoveAll(profile)
	})
	if err := chromedp.Run(ctx); err != nil { // starts the browser
		t.Fatalf("starting %s: %v", chromium(t), err)
	}
	return ctx
}

// shot saves a full-page screenshot of the current page as docs/console/name.png
// (with -screenshots), else in the test's temporary directory.
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	var png []byte
	if err := chromedp.Run(ctx, chromedp.FullScreenshot(&png, 100)); err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	dir := t.TempDir()
	if *screenshots {
		dir = filepath.Join("..", "..", "docs", "console")
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// text returns the text of the first element matching sel.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	var s string
	if err := chromedp.Run(ctx, chromedp.WaitVisible(sel, chromedp.ByQuery), chromedp.Text(sel, &s, chromedp.ByQuery)); err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

func contains(t *testing.T, ctx context.Context, sel string, want ...string) {
	t.Helper()
	got := text(t, ctx, sel)
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("%s does not show %q; it shows:\n%s", sel, w, got)
		}
	}
}

func run(t *testing.T, ctx context.Context, actions ...chromedp.Action) {
	t.Helper()
	if err := chromedp.Run(ctx, actions...); err != nil {
		var url string
		_ = chromedp.Run(ctx, chromedp.Location(&url))
		t.Fatalf("in the browser at %s: %v", url, err)
	}
}

func TestAnOperatorFollowsRunsThroughTheConsoleCancelsOneAndRerunsTheFailedInBulk(t *testing.T) {
	ctx := context.Background()
	pool, _ := testdb.NewPool(t)
	client, err := kagzi.NewClient(pool, kagzi.Config{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	s := &scenario{pool: pool, client: client}
	worker, err := kagzi.NewWorker(client, kagzi.WorkerConfig{ID: "worker-a", MaxConcurrent: 16, Labels: map[string]string{"region": "eu-west"},
		LeaseDuration: 5 * time.Second, HeartbeatInterval: 500 * time.Millisecond}, s.workflows()...)
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- worker.Run(wctx) }()
	t.Cleanup(func() { stop(); <-done })
	s.start(t, ctx)

	mux := http.NewServeMux()
	mux.Handle("/kagzi/", http.StripPrefix("/kagzi", ui.Handler(client, ui.Options{Title: "Kagzi · shop",
		Actions: true, Authorize: func(*http.Request, ui.Access) (string, bool) { return "ops@example.com", true }})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	b := newBrowser(t)
	base := srv.URL + "/kagzi/"

	t.Run("overview", func(t *testing.T) {
		run(t, b, chromedp.Navigate(base), chromedp.WaitVisible("#types", chromedp.ByQuery))
		contains(t, b, "#types", "order", "approval", "sync-ledger", "import-file", "reminder")
		contains(t, b, "main", "Started and finished per minute", "Stuck runs")
		shot(t, b, "overview")
	})
	t.Run("runs, a run, its child and back", func(t *testing.T) { followRuns(t, b, base, s) })
	t.Run("a failed run with its stack", func(t *testing.T) {
		run(t, b, chromedp.Navigate(base+"n/default/runs/"+s.failed), chromedp.WaitVisible("#run-error", chromedp.ByQuery))
		contains(t, b, "#run-error", "PANIC", "index out of range", "goroutine")
		contains(t, b, "#run-status", "FAILED")
		shot(t, b, "run-failed")
	})
	t.Run("workers and schedules", func(t *testing.T) {
		run(t, b, chromedp.Navigate(base+"n/default/workers"), chromedp.WaitVisible("#workers", chromedp.ByQuery))
		contains(t, b, "#workers", "worker-a", "ONLINE", "/ 16", kagzi.Version, "order")
		shot(t, b, "workers")
		run(t, b, chromedp.Navigate(base+"n/default/schedules"), chromedp.WaitVisible("#schedules", chromedp.ByQuery))
		contains(t, b, "#schedules", "nightly-ledger", "0 3 * * *", "Europe/Paris", "PAUSED", "SKIP")
		shot(t, b, "schedules")
		run(t, b, chromedp.Click(`a[href$="schedules/weekly-import"]`, chromedp.ByQuery),
			chromedp.WaitVisible("#schedule-runs", chromedp.ByQuery))
		contains(t, b, "#schedule-runs", "FAILED")
	})
	t.Run("cancel a waiting run", func(t *testing.T) { cancelThroughPage(t, b, base, s) })
	t.Run("bulk rerun of the failed ledger runs", func(t *testing.T) { bulkRerun(t, b, base, s) })
	t.Run("audit", func(t *testing.T) {
		run(t, b, chromedp.Navigate(base+"n/default/audit"), chromedp.WaitVisible("#audit", chromedp.ByQuery))
		contains(t, b, "#audit", "bulk-rerun", "cancel", "ops@example.com", "runs with status FAILED, workflow type sync-ledger")
		shot(t, b, "audit")
	})
}

// followRuns goes from the runs list to the order, to its first child and back.
func followRuns(t *testing.T, b context.Context, base string, s *scenario) {
	run(t, b, chromedp.Navigate(base+"n/default/runs"), chromedp.WaitVisible("#runs", chromedp.ByQuery))
	contains(t, b, "#runs", "order-A-1001", "COMPLETED", "FAILED", "SLEEPING", "CANCELLED", "PANIC")
	shot(t, b, "runs")
	run(t, b, chromedp.Click(`#runs a.run-link[href$="`+s.order+`"]`, chromedp.ByQuery),
		chromedp.WaitVisible("#timeline svg", chromedp.ByQuery))
	if id := text(t, b, "#run-id"); id != s.order {
		t.Fatalf("clicked the order's run, landed on %s", id)
	}
	contains(t, b, "#steps", "reserve#1", "charge#1", "settle#1", "ship#1", "ship#2", "card network timeout")
	contains(t, b, "#children", "ship", "COMPLETED")
	contains(t, b, "#events", "stage", "shipped")
	contains(t, b, "#lease", "epoch")
	var bars int
	run(t, b, chromedp.Evaluate(`document.querySelectorAll("#timeline rect.bar").length`, &bars))
	if bars < 9 { // the run, 2 steps, 3 attempts of charge, the sleep, 2 child starts, 2 children
		t.Errorf("the timeline draws %d bars", bars)
	}
	shot(t, b, "run")
	var child string
	run(t, b, chromedp.AttributeValue("#children a.child-link", "href", &child, nil, chromedp.ByQuery),
		chromedp.Click("#children a.child-link", chromedp.ByQuery), chromedp.WaitVisible("#parent-link", chromedp.ByQuery))
	if id := text(t, b, "#run-id"); !strings.HasSuffix(child, id) {
		t.Fatalf("clicked the child %s, landed on %s", child, id)
	}
	contains(t, b, "#steps", "label#1")
	run(t, b, chromedp.Click("#parent-link", chromedp.ByQuery), chromedp.WaitVisible("#children", chromedp.ByQuery))
	if id := text(t, b, "#run-id"); id != s.order {
		t.Fatalf("clicked the parent link, landed on %s", id)
	}
	// The timeline's child bars link to the child too.
	var links int
	run(t, b, chromedp.Evaluate(`document.querySelectorAll("#timeline a").length`, &links))
	if links != 2 {
		t.Errorf("the timeline links %d children, want 2", links)
	}
}

func cancelThroughPage(t *testing.T, b context.Context, base string, s *scenario) {
	run(t, b, chromedp.Navigate(base+"n/default/runs/"+s.waiting), chromedp.WaitVisible("#cancel-run", chromedp.ByQuery))
	contains(t, b, "#steps", "approve#1", "WAITING")
	run(t, b, chromedp.Click("#cancel-run", chromedp.ByQuery), chromedp.WaitVisible(".flash", chromedp.ByQuery))
	contains(t, b, ".flash", "Cancel requested")
	contains(t, b, "#run-status", "CANCELLED")
	var status string
	if err := s.pool.QueryRow(context.Background(), `SELECT status FROM kagzi.runs WHERE run_id = $1`, s.waiting).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "CANCELLED" {
		t.Fatalf("the database says the run is %s", status)
	}
}

func bulkRerun(t *testing.T, b context.Context, base string, s *scenario) {
	s.broken.Store(false) // the fix is deployed
	run(t, b, chromedp.Navigate(base+"n/default/runs?type=sync-ledger&status=FAILED"),
		chromedp.WaitVisible("#bulk-rerun", chromedp.ByQuery), chromedp.Click("#bulk-rerun", chromedp.ByQuery),
		chromedp.WaitVisible("#bulk-count", chromedp.ByQuery))
	contains(t, b, "#bulk-count", "3 runs in namespace default match")
	shot(t, b, "bulk-confirm")
	run(t, b, chromedp.Click("#bulk-confirm", chromedp.ByQuery), chromedp.WaitVisible("#bulk-result", chromedp.ByQuery))
	contains(t, b, "#bulk-result", "3 matched, 3 rerun")
	for _, id := range s.ledger {
		s.waitFor(t, context.Background(), id, kagzi.StatusCompleted)
	}
	var reruns int
	if err := s.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM kagzi.runs WHERE workflow_type = 'sync-ledger' AND status = 'COMPLETED' AND attempt = 2`).Scan(&reruns); err != nil {
		t.Fatal(err)
	}
	if reruns != 3 {
		t.Fatalf("%d ledger runs completed at attempt 2, want 3", reruns)
	}
	var audited int
	if err := s.pool.QueryRow(context.Background(),
		`SELECT run_count FROM kagzi.console_audit WHERE action = 'bulk-rerun' AND outcome = 'ok' AND who = 'ops@example.com'`).Scan(&audited); err != nil {
		t.Fatal(fmt.Errorf("the bulk rerun's audit row: %w", err))
	}
	if audited != 3 {
		t.Fatalf("the audit records %d runs rerun", audited)
	}
}
