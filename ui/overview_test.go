package ui_test

import (
	"context"
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
