package ui_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/testdb"
	"github.com/kagzi/kagzi/ui"
)

// Found by an outside tester: the confirmation said "Cancel 5 runs" and its button
// cancelled 25: the action read the filter again when posted, so it also matched the
// 20 runs started while the confirmation was open, which its note said it would not.
func TestABulkActionCoversOnlyTheRunsCreatedUpToWhenItsConfirmationCountedThem(t *testing.T) {
	e := newEnv(t)
	counted := startIdle(t, e.client, 5)
	b := serve(t, ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll, Logger: quiet()}))
	_, confirm := b.get("n/default/bulk?action=cancel&type=idle")
	if !strings.Contains(confirm, "<b>5</b> runs in namespace <b>default</b> match") {
		t.Fatalf("the confirmation of 5 runs:\n%s", confirm)
	}
	if !strings.Contains(confirm, "Runs created after this page counted them (") {
		t.Errorf("the confirmation does not say that runs created after it counted are not included")
	}
	late := startIdle(t, e.client, 20) // while the operator reads the confirmation
	status, done := b.postFollow("n/default/bulk", confirmForm(t, confirm))
	if m := regexp.MustCompile(`id="bulk-result">(.*?)</p>`).FindStringSubmatch(done); status != http.StatusOK || m == nil ||
		!strings.Contains(m[1], "<b>5</b> matched, <b>5</b> cancelled") || !strings.Contains(done, `id="bulk-cutoff"`) {
		t.Errorf("POST bulk: %d, the result says %q; want the 5 runs counted cancelled, and the cutoff", status, m)
	}
	for _, id := range counted {
		if s := statusOf(t, e.client, id); s != kagzi.StatusCancelled {
			t.Errorf("counted run %s is %s after the bulk cancel", id, s)
		}
	}
	for _, id := range late {
		if s := statusOf(t, e.client, id); s != kagzi.StatusPending {
			t.Errorf("run %s, started after the confirmation counted, is %s after the bulk cancel", id, s)
		}
	}
	var count int
	var confirmed, countedAt string
	if err := e.pool.QueryRow(context.Background(), `SELECT run_count, detail->>'confirmed_count', detail->>'counted_at'
		FROM kagzi.console_audit`).Scan(&count, &confirmed, &countedAt); err != nil {
		t.Fatal(err)
	}
	if count != 5 || confirmed != "5" || countedAt == "" {
		t.Fatalf("audit: %d runs changed, confirmed_count %q, counted_at %q; want 5 of the 5 confirmed, and when they were counted",
			count, confirmed, countedAt)
	}
}

// A filter's own creation bound still applies when it is earlier than the
// confirmation's.
func TestABulkActionKeepsItsFiltersEarlierCreatedBefore(t *testing.T) {
	e := newEnv(t)
	early := startIdle(t, e.client, 2)
	time.Sleep(300 * time.Millisecond)
	bound := time.Now().UTC().Format(time.RFC3339Nano)
	time.Sleep(300 * time.Millisecond)
	later := startIdle(t, e.client, 3)
	b := serve(t, ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll, Logger: quiet()}))
	_, confirm := b.get("n/default/bulk?action=cancel&type=idle&created_before=" + url.QueryEscape(bound))
	if !strings.Contains(confirm, "<b>2</b> runs in namespace <b>default</b> match") {
		t.Fatalf("the confirmation of the 2 runs created before %s:\n%s", bound, confirm)
	}
	if status, done := b.postFollow("n/default/bulk", confirmForm(t, confirm)); status != http.StatusOK ||
		!strings.Contains(done, "<b>2</b> matched, <b>2</b> cancelled") {
		t.Fatalf("POST bulk: %d\n%s", status, done)
	}
	for _, id := range early {
		if s := statusOf(t, e.client, id); s != kagzi.StatusCancelled {
			t.Errorf("run %s, created before the bound, is %s", id, s)
		}
	}
	for _, id := range later {
		if s := statusOf(t, e.client, id); s != kagzi.StatusPending {
			t.Errorf("run %s, created after the bound, is %s", id, s)
		}
	}
}

// A bulk action posted without the time its confirmation counted the matches (not
// from its confirmation page) is refused, and does and records nothing.
func TestABulkActionWithoutItsConfirmationsTimeIsABadRequestThatDoesNothing(t *testing.T) {
	e := newEnv(t)
	ids := startIdle(t, e.client, 2)
	b := serve(t, ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll, Logger: quiet()}))
	_, confirm := b.get("n/default/bulk?action=cancel&type=idle")
	for _, countedAt := range []string{"", "yesterday"} {
		form := confirmForm(t, confirm)
		if countedAt == "" {
			form.Del("counted_at")
		} else {
			form.Set("counted_at", countedAt)
		}
		if status, _, body := b.post("n/default/bulk", form); status != http.StatusBadRequest ||
			!strings.Contains(body, "confirmation") {
			t.Errorf("a bulk cancel with counted_at %q: %d, want 400 that says to confirm it\n%s", countedAt, status, body)
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

// Found from outside: with a ReadPool that lags (here a migrated database holding none
// of the primary's runs, as a replica that has not replayed them), the bulk
// confirmation counted 0 runs and its action, on the primary, cancelled 3; and the page
// of a run just started (a fork's redirect) was a 404.
func TestWithALaggingReadPoolTheBulkConfirmationCountsOnThePrimaryAndARunsPageFindsANewRun(t *testing.T) {
	e := newEnv(t)
	replica, _ := testdb.NewPool(t) // migrated, and none of the primary's rows
	c, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quiet(), ReadPool: replica})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ids := startIdle(t, c, 3)
	b := serve(t, ui.Handler(c, ui.Options{Actions: true, Authorize: allowAll, Logger: quiet()}))
	_, confirm := b.get("n/default/bulk?action=cancel&type=idle")
	if !strings.Contains(confirm, "<b>3</b> runs in namespace <b>default</b> match") {
		t.Fatalf("the confirmation with a lagging read pool does not count the 3 runs the action would cancel:\n%s", confirm)
	}
	if status, page := b.get("n/default/runs/" + ids[0]); status != http.StatusOK || !strings.Contains(page, ids[0]) {
		t.Fatalf("the page of a run the read pool has not replayed: %d", status)
	}
}

// Found from outside: with the database down every page was a 500 showing the driver's
// error, with the database's host, port, user and name, to anyone allowed to read.
func TestWithTheDatabaseDownPagesAre503WithoutTheConnectionsDetails(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://secretuser@127.0.0.1:1/secretdb?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c, err := kagzi.NewClient(pool, kagzi.Config{Logger: quiet(), DisableDirectConn: true})
	if err != nil {
		t.Fatal(err)
	}
	b := serve(t, ui.Handler(c, ui.Options{Authorize: allowAll, Logger: quiet()}))
	for _, page := range []string{"n/default/", "n/default/runs", "n/default/workers", "n/default/schedules",
		"n/default/audit", "n/default/runs/01890000-0000-7000-8000-000000000000"} {
		status, body := b.get(page)
		if status != http.StatusServiceUnavailable || strings.Contains(body, "secretuser") ||
			strings.Contains(body, "secretdb") || strings.Contains(body, "127.0.0.1:1") {
			t.Errorf("%s with the database down: %d; want 503, and no connection details in:\n%s", page, status, body)
		}
	}
}

// A namespace name that no namespace can have is a bad request, not a missing page.
func TestANamespaceThatIsNoValidNameIsABadRequest(t *testing.T) {
	e := newEnv(t)
	b := serve(t, ui.Handler(e.client, ui.Options{Authorize: allowAll, Logger: quiet(),
		Namespaces: func(ns string) (*kagzi.Client, error) {
			return kagzi.NewClient(e.pool, kagzi.Config{Namespace: ns, Logger: quiet()})
		}}))
	if status, _ := b.get("n/a%00b/runs"); status != http.StatusBadRequest {
		t.Fatalf("a namespace with a NUL: %d, want 400", status)
	}
	if status, _ := b.get("n/other/runs"); status != http.StatusOK {
		t.Fatalf("a namespace the callback serves: %d, want 200", status)
	}
}
