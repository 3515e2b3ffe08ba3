package ui

import (
	"bytes"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/clientdb"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// pages are the templates of the console, each rendered inside templates/layout.html.
var pages = []string{"overview", "runs", "run", "workers", "schedules", "schedule", "audit", "bulk", "bulkdone", "error"}

// console is the handler Handler returns.
type console struct {
	client  *kagzi.Client
	opts    Options
	csrfKey []byte
	tmpl    map[string]*template.Template
	mux     *http.ServeMux
	clients sync.Map // namespace → *kagzi.Client, for Options.Namespaces
}

func newConsole(client *kagzi.Client, opts Options) *console {
	if opts.Title == "" {
		opts.Title = "Kagzi"
	}
	if opts.RefreshInterval <= 0 {
		opts.RefreshInterval = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	c := &console{client: client, opts: opts, csrfKey: opts.CSRFKey, tmpl: map[string]*template.Template{},
		mux: http.NewServeMux()}
	if len(c.csrfKey) == 0 {
		c.csrfKey = make([]byte, 32)
		_, _ = rand.Read(c.csrfKey)
	}
	for _, p := range pages {
		c.tmpl[p] = template.Must(template.New("layout.html").Funcs(funcs).
			ParseFS(templateFS, "templates/layout.html", "templates/"+p+".html"))
	}
	static, _ := fs.Sub(staticFS, "static")
	c.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	c.mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		if err := servableNamespace(client.Namespace()); err != nil {
			c.fail(w, r, nil, err)
			return
		}
		redirect(w, r, "n/"+url.PathEscape(client.Namespace())+"/")
	})
	c.mux.HandleFunc("GET /ns", func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimSpace(r.FormValue("name"))
		if name == "" {
			c.fail(w, r, nil, fmt.Errorf("%w: name a namespace to switch to", kagzi.ErrInvalidArgument))
			return
		}
		if err := servableNamespace(name); err != nil {
			c.fail(w, r, nil, err)
			return
		}
		redirect(w, r, "n/"+url.PathEscape(name)+"/")
	})
	// A namespace's URL without its slash: the mux's own redirect would be absolute
	// (losing the prefix the console is mounted under) and to the decoded path.
	c.mux.HandleFunc("GET /n/{ns}", func(w http.ResponseWriter, r *http.Request) {
		ns := r.PathValue("ns")
		if err := servableNamespace(ns); err != nil {
			c.fail(w, r, nil, err)
			return
		}
		redirect(w, r, "n/"+url.PathEscape(ns)+"/")
	})
	c.page("GET /n/{ns}/{$}", "overview", c.overview)
	c.page("GET /n/{ns}/runs", "runs", c.runs)
	c.page("GET /n/{ns}/runs/{id}", "run", c.run)
	c.page("GET /n/{ns}/workers", "workers", c.workers)
	c.page("GET /n/{ns}/schedules", "schedules", c.schedules)
	c.page("GET /n/{ns}/schedules/{id}", "schedule", c.schedule)
	c.page("GET /n/{ns}/audit", "audit", c.audit)
	c.page("GET /n/{ns}/bulk", "bulk", c.bulkConfirm)
	c.post("POST /n/{ns}/runs/{id}/{action}", c.runAction)
	c.post("POST /n/{ns}/schedules/{id}/{action}", c.scheduleAction)
	c.post("POST /n/{ns}/bulk", c.bulkAction)
	c.page("GET /n/{ns}/bulk/done", "bulkdone", c.bulkDone)
	return c
}

func (c *console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'self'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	c.mux.ServeHTTP(w, r)
}

// req is one request to a page or an action, in a namespace the caller may use.
type req struct {
	w      http.ResponseWriter
	r      *http.Request
	ns     string
	client *kagzi.Client
	pool   *pgxpool.Pool // the client's pool: the audit's writes
	read   *pgxpool.Pool // the client's ReadPool (or pool): the pages' reads
	who    string
	csrf   string
	root   string // the relative path from this request's URL to the console's root
	// auditID is the audit log's record of the action this request took (0: none).
	auditID int64
}

// base is the relative path (from the console's root) of the namespace's pages.
func (q *req) base() string { return "n/" + url.PathEscape(q.ns) + "/" }

// errForbidden is a request Authorize refused, or an action the options disable.
var errForbidden = errors.New("forbidden")

// open resolves the request's namespace and asks whether the caller may do a.
func (c *console) open(w http.ResponseWriter, r *http.Request, a Action) (*req, error) {
	q := &req{w: w, r: r, ns: r.PathValue("ns"), root: relativeRoot(r.URL.EscapedPath())}
	if err := servableNamespace(q.ns); err != nil {
		// No q: the error page's links would be to the namespace's broken URLs.
		return nil, err
	}
	if c.opts.Namespaces == nil && q.ns != c.client.Namespace() {
		return q, fmt.Errorf("%w: namespace %q is not served here", kagzi.ErrNotFound, q.ns)
	}
	// Asked before the namespace's client is made, so that a refused request makes
	// none (and caches none).
	who, ok := c.authorize(r, Access{Namespace: q.ns, Action: a})
	if !ok {
		return q, fmt.Errorf("%w: %s in namespace %q is not allowed", errForbidden, a, q.ns)
	}
	var err error
	if q.client, err = c.clientFor(q.ns); err != nil {
		return q, err
	}
	q.pool = clientdb.Pool(q.client)
	q.read = clientdb.ReadPool(q.client)
	q.who = who
	q.csrf = c.csrfToken(w, r)
	return q, nil
}

// authorize applies Options.Authorize, or the default: reads of the client's
// namespace only.
func (c *console) authorize(r *http.Request, a Access) (string, bool) {
	if a.Action != ActionRead && !c.opts.Actions {
		return "", false
	}
	if c.opts.Authorize == nil {
		return "anonymous", a.Action == ActionRead && a.Namespace == c.client.Namespace()
	}
	return c.opts.Authorize(r, a)
}

// can reports whether the caller may take action a in q's namespace (to show its
// buttons; the POST asks again).
func (c *console) can(q *req, a Action) bool {
	_, ok := c.authorize(q.r, Access{Namespace: q.ns, Action: a})
	return ok
}

// clientFor returns the client of a namespace: the handler's, or one from
// Options.Namespaces.
func (c *console) clientFor(ns string) (*kagzi.Client, error) {
	if ns == c.client.Namespace() {
		return c.client, nil
	}
	if c.opts.Namespaces == nil {
		return nil, fmt.Errorf("%w: namespace %q is not served here", kagzi.ErrNotFound, ns)
	}
	if cl, ok := c.clients.Load(ns); ok {
		return cl.(*kagzi.Client), nil
	}
	cl, err := c.opts.Namespaces(ns)
	if errors.Is(err, kagzi.ErrInvalidArgument) { // a name no namespace can have: 400
		return nil, fmt.Errorf("namespace %q: %w", ns, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: namespace %q: %v", kagzi.ErrNotFound, ns, err)
	}
	if cl == nil || cl.Namespace() != ns {
		return nil, fmt.Errorf("%w: Options.Namespaces gave no client of namespace %q", kagzi.ErrNotFound, ns)
	}
	actual, _ := c.clients.LoadOrStore(ns, cl)
	return actual.(*kagzi.Client), nil
}

// dotSegment reports whether a name is "." or "..": as a path segment, escaped or
// not ("%2E" is a dot to a browser too), a browser resolves it away, so no link to
// the pages of a namespace or schedule of that name could work.
func dotSegment(name string) bool { return name == "." || name == ".." }

// servableNamespace refuses a namespace the console cannot link to (see dotSegment).
func servableNamespace(ns string) error {
	if dotSegment(ns) {
		return fmt.Errorf("%w: namespace %q cannot be served by the console: browsers resolve a %q path segment away, so no link to its pages would work",
			kagzi.ErrInvalidArgument, ns, ns)
	}
	return nil
}

// relativeRoot is the relative path from a URL path to the console's root ("/"):
// "./" for "/x", "../" for "/n/x", and so on. The path is the escaped one: a
// namespace with a "/" in it is one segment ("%2F"), as the browser resolves it.
func relativeRoot(path string) string {
	depth := strings.Count(path, "/") - 1
	if depth <= 0 {
		return "./"
	}
	return strings.Repeat("../", depth)
}

// redirect sends a 303 to a path relative to the console's root. http.Redirect
// would resolve it against the path StripPrefix left, which lost the prefix.
func redirect(w http.ResponseWriter, r *http.Request, to string) {
	w.Header().Set("Location", relativeRoot(r.URL.EscapedPath())+to)
	w.WriteHeader(http.StatusSeeOther)
}

// view is what every page's template gets.
type view struct {
	Title, PageTitle, Page string
	NS, Base, Root, CSRF   string
	Who                    string
	Refresh                int // seconds; 0: the page has no auto-refresh
	MultiNS                bool
	Flash                  string
	Data                   any
}

// pageFunc computes a page's title and data.
type pageFunc func(q *req) (title string, data any, err error)

// page registers a page rendered with its template.
func (c *console) page(pattern, name string, f pageFunc) {
	c.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		q, err := c.open(w, r, ActionRead)
		if err != nil {
			c.fail(w, r, q, err)
			return
		}
		title, data, err := f(q)
		if err != nil {
			c.fail(w, r, q, err)
			return
		}
		status := http.StatusOK
		if p, ok := data.(refusedInput); ok && p.refused() {
			status = http.StatusBadRequest
		}
		c.render(q, status, name, title, data)
	})
}

// refusedInput is a page's data that may show its input refused (a runs filter that
// does not read): the page is rendered, its form kept for the correction, with the
// status of bad input, 400.
type refusedInput interface{ refused() bool }

func (c *console) render(q *req, status int, name, title string, data any) {
	v := view{Title: c.opts.Title, PageTitle: title, Page: name, NS: q.ns, Base: q.base(), Root: q.root,
		CSRF: q.csrf, Who: q.who, MultiNS: c.opts.Namespaces != nil, Flash: flashes[q.r.FormValue("done")], Data: data}
	switch name {
	case "overview", "runs", "run", "workers", "schedules", "schedule":
		v.Refresh = int(c.opts.RefreshInterval.Round(time.Second) / time.Second)
	}
	var buf bytes.Buffer
	if err := c.tmpl[name].Execute(&buf, v); err != nil {
		c.opts.Logger.Error("kagzi console: rendering a page", "page", name, "error", err)
		http.Error(q.w, "the console could not render this page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	q.w.Header().Set("Content-Type", "text/html; charset=utf-8")
	q.w.Header().Set("Cache-Control", "no-store")
	q.w.WriteHeader(status)
	_, _ = buf.WriteTo(q.w)
}

// fail renders an error page with the status the error calls for.
func (c *console) fail(w http.ResponseWriter, r *http.Request, q *req, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, errForbidden):
		status = http.StatusForbidden
	case errors.Is(err, errCSRF):
		status = http.StatusForbidden
	case errors.Is(err, errTooLarge):
		status = http.StatusRequestEntityTooLarge
	case errors.Is(err, kagzi.ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, kagzi.ErrInvalidArgument), errors.Is(err, kagzi.ErrAlreadyExists),
		errors.Is(err, kagzi.ErrRunFinished):
		status = http.StatusBadRequest
	case unreachable(err):
		status = http.StatusServiceUnavailable
	}
	msg := err.Error()
	if status >= 500 {
		// The database's errors name its host, port, user and database: they go to the
		// log, not to whoever may read the console.
		c.opts.Logger.Error("kagzi console", "path", r.URL.Path, "error", err)
		msg = "The console could not read the database (see the server's log)."
		if status == http.StatusServiceUnavailable {
			msg = "The database is unavailable. Try again in a moment."
		}
	}
	if q == nil {
		// The page's links go to the request's namespace when it can be served, else
		// to the client's: never to a namespace's broken URLs ("n//").
		ns := r.PathValue("ns")
		if ns == "" || servableNamespace(ns) != nil {
			ns = c.client.Namespace()
		}
		q = &req{w: w, r: r, ns: ns, root: relativeRoot(r.URL.EscapedPath())}
	}
	q.w, q.r = w, r
	c.render(q, status, "error", http.StatusText(status), errorView{Status: status, Message: msg})
}

// unreachable reports an error of a database that cannot be reached: the client's
// ErrUnavailable, or, for the console's own reads, the driver's failure to connect or
// a broken connection.
func unreachable(err error) bool {
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.Is(err, kagzi.ErrUnavailable) || errors.As(err, &ce) || errors.As(err, &ne) ||
		pgconn.Timeout(err) || errors.Is(err, io.ErrUnexpectedEOF)
}

type errorView struct {
	Status  int
	Message string
}

// flashes are the messages a redirect after an action asks its page to show.
var flashes = map[string]string{
	"cancel":  "Cancel requested.",
	"rerun":   "The run was made PENDING again.",
	"signal":  "Signal sent.",
	"pause":   "Schedule paused.",
	"resume":  "Schedule resumed.",
	"trigger": "Schedule triggered: a run was started.",
	"fork":    "Forked: this is the new run.",
}
