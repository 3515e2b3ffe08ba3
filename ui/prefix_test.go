package ui_test

import (
	"context"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/ui"
)

var linkRE = regexp.MustCompile(`(?:href|src|action)="([^"]*)"`)
var baseRE = regexp.MustCompile(`<base href="([^"]*)">`)

// Every page and asset linked from the console mounted under a prefix (children,
// parents, keyset pages, a schedule id with a slash and a space) stays under the
// prefix and answers 200.
func TestEveryLinkOfTheConsoleUnderAPrefixStaysUnderItAndAnswers(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	startFamily(t, e)
	startIdle(t, e.client, 60)
	if _, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: "nightly/x y", WorkflowType: "parent", Cron: "0 3 * * *", Input: 1}); err != nil {
		t.Fatal(err)
	}
	h := ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll, Logger: quiet()})
	mux := http.NewServeMux()
	mux.Handle("/ops/kagzi/", http.StripPrefix("/ops/kagzi", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	cl := &http.Client{Jar: jar}
	seen := map[string]bool{}
	queue := []string{srv.URL + "/ops/kagzi/"}
	n := 0
	for len(queue) > 0 && n < 400 {
		u := queue[0]
		queue = queue[1:]
		if seen[u] {
			continue
		}
		seen[u] = true
		n++
		resp, err := cl.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %s: %d", u, resp.StatusCode)
			continue
		}
		final := resp.Request.URL
		if !strings.HasPrefix(final.Path, "/ops/kagzi/") {
			t.Errorf("%s ended at %s", u, final)
		}
		if !strings.Contains(resp.Header.Get("Content-Type"), "html") {
			continue
		}
		base := final
		if m := baseRE.FindStringSubmatch(string(body)); m != nil {
			base, _ = final.Parse(html.UnescapeString(m[1]))
		}
		for _, m := range linkRE.FindAllStringSubmatch(baseRE.ReplaceAllString(string(body), ""), -1) {
			ref := html.UnescapeString(m[1])
			to, err := base.Parse(ref)
			if err != nil {
				t.Errorf("%s: bad link %q", u, ref)
				continue
			}
			if !strings.HasPrefix(to.Path, "/ops/kagzi/") {
				t.Errorf("%s: link %q leaves the prefix: %s", u, ref, to)
				continue
			}
			if strings.Contains(m[0], "action=") {
				continue
			}
			to.Fragment = ""
			queue = append(queue, to.String())
		}
	}
	if n < 50 {
		t.Fatalf("crawled %d pages, want the run, child, parent, schedule and paged lists among them", n)
	}
}
