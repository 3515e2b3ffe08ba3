package uitest

import (
	"context"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/testdb"
	"github.com/kagzi/kagzi/ui"
)

// Found by an outside tester: a run cancelled a few seconds into an hour's sleep (or
// a signal wait) was drawn sleeping up to now, its axis stretched at every reload and
// its note said "wakes in 58m 13s", cut off at the image's edge, while its facts said
// it had finished.
func TestACancelledRunsSleepAndSignalWaitEndWithTheRunOnItsTimelineAndNoTextIsCutOff(t *testing.T) {
	ctx := context.Background()
	pool, _ := testdb.NewPool(t)
	client, err := kagzi.NewClient(pool, kagzi.Config{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	const longSleep = "wait-for-the-warehouse-to-confirm-the-reservation"
	nap := kagzi.Define("nap", func(ctx *kagzi.Context, n int) (int, error) {
		return n, ctx.Sleep(longSleep, time.Hour)
	})
	approval := kagzi.Define("approval", func(ctx *kagzi.Context, po string) (string, error) {
		return kagzi.WaitSignal[string](ctx, "approve", time.Hour)
	})
	worker, err := kagzi.NewWorker(client, kagzi.WorkerConfig{}, nap, approval)
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- worker.Run(wctx) }()
	t.Cleanup(func() { stop(); <-done })
	s := &scenario{pool: pool, client: client}
	start := func(name string, in any) string {
		r, err := client.StartByName(ctx, name, in)
		if err != nil {
			t.Fatal(err)
		}
		return r.RunID
	}
	napping, waiting, sleeping := start("nap", 1), start("approval", "PO-1"), start("nap", 2)
	for _, id := range []string{napping, waiting, sleeping} {
		s.waitFor(t, ctx, id, kagzi.StatusSleeping)
	}
	time.Sleep(2 * time.Second)
	for _, id := range []string{napping, waiting} {
		if err := client.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(ui.Handler(client, ui.Options{Logger: quiet()}))
	t.Cleanup(srv.Close)
	b := newBrowser(t)

	took := regexp.MustCompile(`took (\S+)`)
	for name, id := range map[string]string{"the sleep": napping, "the signal wait": waiting} {
		t.Run(name, func(t *testing.T) {
			run(t, b, chromedp.Navigate(srv.URL+"/n/default/runs?status=CANCELLED"), chromedp.WaitVisible("#runs", chromedp.ByQuery),
				chromedp.Click(`#runs a.run-link[href$="`+id+`"]`, chromedp.ByQuery), chromedp.WaitVisible("#timeline svg", chromedp.ByQuery))
			if got := text(t, b, "#run-id"); got != id {
				t.Fatalf("clicked the run %s, landed on %s", id, got)
			}
			facts := text(t, b, "dl.facts")
			m := took.FindStringSubmatch(facts)
			if m == nil {
				t.Fatalf("the facts of the cancelled run do not say how long it took:\n%s", facts)
			}
			var notes []string
			var axisEnd, first string
			var sleepEnd, runEnd float64
			run(t, b, chromedp.Evaluate(`Array.from(document.querySelectorAll("#timeline text.note")).map(e => e.textContent)`, &notes),
				chromedp.Evaluate(`Array.from(document.querySelectorAll("#timeline text.axis")).pop().textContent`, &axisEnd),
				chromedp.Evaluate(`(b => b.x + b.width)(document.querySelector("#timeline rect.bar.run").getBBox())`, &runEnd),
				chromedp.Evaluate(`(b => b.x + b.width)(document.querySelector("#timeline rect.bar.sleep, #timeline rect.bar.signal").getBBox())`, &sleepEnd),
				chromedp.OuterHTML("#timeline svg", &first, chromedp.ByQuery))
			if len(notes) != 2 || notes[1] != "ended with the run" {
				t.Errorf("the lanes' notes are %q; want the wait's to say that it ended with the run", notes)
			}
			if axisEnd != "+"+m[1] {
				t.Errorf("the axis ends at %s; the run took %s", axisEnd, m[1])
			}
			if sleepEnd > runEnd+0.5 {
				t.Errorf("the wait's bar ends at x=%.1f, past the run's end at x=%.1f", sleepEnd, runEnd)
			}
			textFits(t, b)
			time.Sleep(1500 * time.Millisecond)
			var again string
			run(t, b, chromedp.Reload(), chromedp.WaitVisible("#timeline svg", chromedp.ByQuery),
				chromedp.OuterHTML("#timeline svg", &again, chromedp.ByQuery))
			if again != first {
				t.Errorf("the finished run's timeline changed on reload:\n%s\n%s", first, again)
			}
		})
	}
	t.Run("a sleep still open", func(t *testing.T) {
		run(t, b, chromedp.Navigate(srv.URL+"/n/default/runs/"+sleeping), chromedp.WaitVisible("#timeline svg", chromedp.ByQuery))
		contains(t, b, "#timeline", "wakes in 59m")
		textFits(t, b)
	})
}

// textFits checks that every text of the timeline on the page lies within its image.
func textFits(t *testing.T, b context.Context) {
	t.Helper()
	var out []string
	run(t, b, chromedp.Evaluate(`(() => {
		const svg = document.querySelector("#timeline svg"), w = svg.viewBox.baseVal.width;
		return Array.from(svg.querySelectorAll("text")).map(e => [e, e.getBBox()])
			.filter(([e, b]) => b.x < 0 || b.x + b.width > w)
			.map(([e, b]) => e.textContent + " spans x " + Math.round(b.x) + " to " + Math.round(b.x + b.width) + " of " + w)
	})()`, &out))
	for _, o := range out {
		t.Errorf("timeline text cut off at the image's edge: %s", o)
	}
	if len(out) > 0 {
		var s string
		run(t, b, chromedp.OuterHTML("#timeline svg", &s, chromedp.ByQuery))
		t.Logf("the timeline: %s", strings.TrimSpace(s))
	}
}
