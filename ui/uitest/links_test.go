package uitest

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/testdb"
	"github.com/kagzi/kagzi/ui"
)

// Found by an outside tester: the overview's links of a workflow type were encoded
// twice (the template's helper, then html/template), so a type whose name a query
// string escapes ("billing/charge") linked to a runs list of "billing%2Fcharge": none.
func TestOverviewLinksOfATypeWhateverItsNameListItsRuns(t *testing.T) {
	ctx := context.Background()
	pool, _ := testdb.NewPool(t)
	client, err := kagzi.NewClient(pool, kagzi.Config{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	// No worker: each type is also listed among the types with no live worker.
	types := []string{"plain", "billing/charge", "reports:daily", "bestellung-prüfen", "a <b>&c d", "x+y=z?%25#"}
	runIDs := map[string]string{}
	for _, typ := range types {
		r, err := client.StartByName(ctx, typ, 1)
		if err != nil {
			t.Fatal(err)
		}
		runIDs[typ] = r.RunID
	}
	srv := httptest.NewServer(ui.Handler(client, ui.Options{Logger: quiet()}))
	t.Cleanup(srv.Close)
	b := newBrowser(t)

	follow := func(t *testing.T, list, typ string) {
		t.Helper()
		run(t, b, chromedp.Navigate(srv.URL+"/n/default/"), chromedp.WaitVisible(list, chromedp.ByQuery))
		var found bool
		run(t, b, chromedp.Evaluate(`(() => {
			const a = Array.from(document.querySelectorAll(`+jsString(list+" a")+`)).find(a => a.textContent === `+jsString(typ)+`);
			if (!a) return false;
			document.body.dataset.left = "1";
		a.click();
			return true })()`, &found))
		if !found {
			t.Fatalf("%s has no link named %q", list, typ)
		}
		run(t, b, chromedp.WaitVisible("body:not([data-left]) #runs", chromedp.ByQuery))
		var ids []string
		var location, input string
		run(t, b, chromedp.Evaluate(`Array.from(document.querySelectorAll("#runs a.run-link")).map(a => a.getAttribute("href").split("/").pop())`, &ids),
			chromedp.Location(&location),
			chromedp.Evaluate(`document.querySelector('#run-filter input[name="type"]').value`, &input))
		if len(ids) != 1 || ids[0] != runIDs[typ] {
			t.Errorf("%s: the link of %q leads to %s, which lists runs %v; want its run %s", list, typ, location, ids, runIDs[typ])
		}
		if input != typ {
			t.Errorf("%s: the link of %q leads to a runs list filtered by type %q", list, typ, input)
		}
	}
	for _, typ := range types {
		t.Run("types "+typ, func(t *testing.T) { follow(t, "#types", typ) })
		t.Run("no worker "+typ, func(t *testing.T) { follow(t, "#no-worker", typ) })
	}
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
