package ui_test

import (
	"context"
	"errors"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
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

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

type env struct {
	pool   *pgxpool.Pool
	client *kagzi.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	c, err := kagzi.NewClient(pool, kagzi.Config{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &env{pool: pool, client: c}
}

// runWorker runs a worker until the test ends.
func runWorker(t *testing.T, c *kagzi.Client, wfs ...kagzi.Definition) {
	t.Helper()
	w, err := kagzi.NewWorker(c, kagzi.WorkerConfig{LeaseDuration: 2 * time.Second, HeartbeatInterval: 250 * time.Millisecond,
		PollInterval: 200 * time.Millisecond, DrainTimeout: time.Second}, wfs...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// browser is an HTTP client with a cookie jar, against the console mounted under
// /console/ of a test server.
type browser struct {
	t    *testing.T
	srv  *httptest.Server
	http *http.Client
}

func serve(t *testing.T, h http.Handler) *browser {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/console/", http.StripPrefix("/console", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, srv: srv, http: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

// get fetches a page (path relative to the console's root) and returns its status and body.
func (b *browser) get(path string) (int, string) {
	b.t.Helper()
	resp, err := b.http.Get(b.srv.URL + "/console/" + path)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// post posts a form and returns the status, the Location and the body.
func (b *browser) post(path string, form url.Values) (int, string, string) {
	b.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, b.srv.URL+"/console/"+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := b.http.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(body)
}

// postFollow posts a form that must answer with a redirect (303 See Other) and
// returns the status and body of the page it leads to, as a browser shows it.
func (b *browser) postFollow(path string, form url.Values) (int, string) {
	b.t.Helper()
	status, loc, body := b.post(path, form)
	if status != http.StatusSeeOther || loc == "" {
		b.t.Fatalf("POST %s: %d (Location %q), want a redirect\n%s", path, status, loc, body)
	}
	base, _ := url.Parse(b.srv.URL + "/console/" + path)
	to, err := base.Parse(loc)
	if err != nil {
		b.t.Fatal(err)
	}
	resp, err := b.http.Get(to.String())
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(page)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf returns the CSRF token of a page's forms.
func csrf(t *testing.T, page string) string {
	t.Helper()
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF field on the page:\n%s", page)
	}
	return m[1]
}

// allowAll is an Authorize hook that allows everything as "tester".
func allowAll(*http.Request, ui.Access) (string, bool) { return "tester", true }

var (
	bulkFormTag = regexp.MustCompile(`(?s)<form [^>]*id="bulk-form">(.*?)</form>`)
	hiddenField = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)
)

// confirmForm returns the fields the bulk confirmation page's button posts.
func confirmForm(t *testing.T, page string) url.Values {
	t.Helper()
	f := bulkFormTag.FindStringSubmatch(page)
	if f == nil {
		t.Fatalf("no bulk form on the page:\n%s", page)
	}
	form := url.Values{}
	for _, m := range hiddenField.FindAllStringSubmatch(f[1], -1) {
		form.Add(html.UnescapeString(m[1]), html.UnescapeString(m[2]))
	}
	return form
}

// startFamily runs a worker of a parent (a step, a child, an event), its child and a
// workflow that fails, and starts and waits for a parent (input 21) and a failing run.
func startFamily(t *testing.T, e *env) (parent, failed *kagzi.Run[int]) {
	t.Helper()
	ctx := context.Background()
	child := kagzi.Define("child", func(ctx *kagzi.Context, n int) (int, error) { return n * 2, nil })
	parentWF := kagzi.Define("parent", func(ctx *kagzi.Context, n int) (int, error) {
		if _, err := kagzi.Step(ctx, "one", func(context.Context) (int, error) { return 1, nil }); err != nil {
			return 0, err
		}
		ch, err := kagzi.StartChild(ctx, "kid", child, n)
		if err != nil {
			return 0, err
		}
		if err := ctx.SetEvent("progress", "half"); err != nil {
			return 0, err
		}
		return ch.Get()
	})
	failing := kagzi.Define("failing", func(ctx *kagzi.Context, _ int) (int, error) {
		return 0, kagzi.NonRetryable(errors.New("boom"))
	})
	runWorker(t, e.client, parentWF, child, failing)
	parent, err := kagzi.Start(ctx, e.client, parentWF, 21)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parent.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if failed, err = kagzi.Start(ctx, e.client, failing, 0); err != nil {
		t.Fatal(err)
	}
	_, _ = failed.Wait(ctx)
	return parent, failed
}
