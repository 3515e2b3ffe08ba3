package ui_test

import (
	"context"
	"html"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/ui"
)

// overviewRow returns the text of the cells of a workflow type's row on the overview.
func overviewRow(t *testing.T, page, typ string) []string {
	t.Helper()
	row := regexp.MustCompile(`(?s)<tr[^>]*>\s*<td><a href="[^"]*">` + regexp.QuoteMeta(typ) + `</a>.*?</tr>`).FindString(page)
	if row == "" {
		t.Fatalf("the overview has no row of type %q", typ)
	}
	var cells []string
	for _, m := range regexp.MustCompile(`(?s)<td[^>]*>(.*?)</td>`).FindAllStringSubmatch(row, -1) {
		cells = append(cells, strings.TrimSpace(regexp.MustCompile(`<[^>]*>`).ReplaceAllString(m[1], "")))
	}
	return cells
}

// underAMinute matches a duration the console shows under a minute: "850ms", "4.2s".
var underAMinute = regexp.MustCompile(`^[0-9.]+(µs|ms|s)$`)

// Found by an outside tester: the overview's oldest claimable run read its wait from
// available_at, which WithPriority moves up to an hour into the past, so a run started
// a moment ago with priority 3600 showed as having waited "1h 00m".
func TestTheOldestReadyRunsWaitCountsFromWhenItBecameReadyNotFromItsPriority(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	start := func(typ string, opts ...kagzi.StartOption) string {
		t.Helper()
		r, err := e.client.StartByName(ctx, typ, 1, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return r.RunID
	}
	start("urgent", kagzi.WithPriority(kagzi.MaxPriority))
	start("half", kagzi.WithPriority(1800))
	start("half")
	// A start time in the past: ready since it was started, not since that time.
	start("backdated", kagzi.WithStartAt(time.Now().Add(-2*time.Hour)), kagzi.WithPriority(60))
	// A start time to come: not ready, whatever its priority.
	start("later", kagzi.WithStartAt(time.Now().Add(time.Hour)), kagzi.WithPriority(kagzi.MaxPriority))
	// A run ready for ten minutes (started with priority 600 ten minutes ago): its
	// wait is the ten minutes.
	stale := start("stale", kagzi.WithPriority(600))
	if _, err := e.pool.Exec(ctx, `UPDATE kagzi.runs SET created_at = created_at - interval '10 minutes',
		available_at = available_at - interval '10 minutes' WHERE run_id = $1`, stale); err != nil {
		t.Fatal(err)
	}
	b := serve(t, ui.Handler(e.client, ui.Options{Logger: quiet()}))
	_, page := b.get("n/default/")
	const oldestReady = 7 // the column of a type's row
	for _, typ := range []string{"urgent", "half", "backdated"} {
		if got := overviewRow(t, page, typ)[oldestReady]; !underAMinute.MatchString(got) {
			t.Errorf("type %s, started a moment ago: its oldest ready run has waited %q", typ, got)
		}
	}
	if got := overviewRow(t, page, "later")[oldestReady]; got != "" {
		t.Errorf("type later, whose run starts in an hour: its oldest ready run has waited %q, want none", got)
	}
	if got := overviewRow(t, page, "stale")[oldestReady]; !strings.HasPrefix(got, "10m ") {
		t.Errorf("type stale, ready for ten minutes: its oldest ready run has waited %q", got)
	}
	card := regexp.MustCompile(`id="oldest-ready">([^<]*)<`).FindStringSubmatch(page)
	if card == nil || !strings.HasPrefix(card[1], "10m ") {
		t.Errorf("the oldest claimable run has waited %v, want the stale run's ten minutes", card)
	}

	// Without the stale run, the oldest claimable run is one started a moment ago.
	if err := e.client.Cancel(ctx, stale); err != nil {
		t.Fatal(err)
	}
	_, page = b.get("n/default/")
	card = regexp.MustCompile(`id="oldest-ready">([^<]*)<`).FindStringSubmatch(page)
	if card == nil || !underAMinute.MatchString(card[1]) {
		t.Errorf("runs started a moment ago (with priorities up to %d): the oldest claimable has waited %v", kagzi.MaxPriority, card)
	}
}

// Found by an outside tester: the overview judged "claimable runs with no live
// worker" by type alone, and from ready PENDING runs only, so it stayed silent about
// what Health reports: runs pinned to a version no live worker runs, and runs whose
// worker died holding them (RUNNING past their lease). And its link listed only the
// type's PENDING runs.
func TestTheOverviewFlagsTheTypesHealthReportsWithoutAWorkerAndLinksTheirRuns(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	v1 := kagzi.Define("checkout", func(ctx *kagzi.Context, n int) (int, error) { return n, nil }, kagzi.WithVersion("v1"))
	runWorker(t, e.client, v1)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if p, err := e.client.ListWorkers(ctx, kagzi.WorkerFilter{}); err == nil && len(p.Workers) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the worker never registered")
		}
	}
	pinned, err := e.client.StartByName(ctx, "checkout", 1, kagzi.WithRunVersion("v2"))
	if err != nil {
		t.Fatal(err)
	}
	// A run whose worker died: RUNNING, its lease passed a minute ago.
	stranded, err := e.client.StartByName(ctx, "stranded", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'RUNNING', locked_by = 'gone', lease_epoch = 1,
		started_at = now() - interval '2 minutes', available_at = now() - interval '1 minute' WHERE run_id = $1`, stranded.RunID); err != nil {
		t.Fatal(err)
	}
	health := e.client.Health(ctx).PendingTypesWithoutWorker
	if strings.Join(health, ",") != "checkout,stranded" {
		t.Fatalf("Health reports %v without a live worker, want checkout (v2) and stranded", health)
	}
	b := serve(t, ui.Handler(e.client, ui.Options{Logger: quiet()}))
	_, page := b.get("n/default/")
	warning := regexp.MustCompile(`(?s)<p class="warn" id="no-worker">.*?</p>`).FindString(page)
	links := map[string]string{}
	for _, m := range regexp.MustCompile(`<a href="([^"]*)">([^<]*)</a>`).FindAllStringSubmatch(warning, -1) {
		links[m[2]] = html.UnescapeString(m[1])
	}
	for typ, run := range map[string]string{"checkout": pinned.RunID, "stranded": stranded.RunID} {
		if links[typ] == "" {
			t.Errorf("Health reports %s without a live worker; the overview's warning does not list it:\n%s", typ, warning)
			continue
		}
		if cells := overviewRow(t, page, typ); !strings.Contains(cells[0], "no worker") {
			t.Errorf("the overview's row of %s is not tagged \"no worker\": %v", typ, cells)
		}
		if _, runs := b.get(links[typ]); !strings.Contains(runs, `class="run-link" href="n/default/runs/`+run+`"`) {
			t.Errorf("the warning's link of %s, %s, does not list its run %s", typ, links[typ], run)
		}
	}
}
