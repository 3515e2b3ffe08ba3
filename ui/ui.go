// Package ui is Kagzi's operator console: an http.Handler that shows a namespace's
// runs, their step timelines, workers, schedules and queues, and, when allowed, acts
// on them. Mount it under any prefix of your own mux:
//
//	mux.Handle("/kagzi/", http.StripPrefix("/kagzi", ui.Handler(client, ui.Options{})))
//
// or serve it from the command line: kagzi ui --addr 127.0.0.1:8080.
//
// Pages are rendered on the server (html/template); charts and timelines are SVG
// drawn in Go; the little JavaScript there is (an auto-refresh toggle) and the
// stylesheet are embedded: the console needs no network access beyond its own
// address, and no build step. The package uses the standard library only.
//
// # Pages
//
// Overview (each workflow type's unfinished runs by status, runs finished in the
// last hour, a per-minute chart of starts and ends, queue depth and the age of the
// oldest claimable run, types with claimable runs and no live worker, stuck runs);
// Runs (filters, keyset pages, auto-refresh, bulk actions); a run (its timeline of
// steps, attempts, sleeps, signal waits and children, its input, output and error,
// its lease, its signals, events and the actions taken on it); Workers; Schedules
// (next fire times, last fires and their runs); Audit (every action taken).
//
// # Reads stay cheap
//
// Every page reads bounded index ranges, whatever the number of runs: counts are
// capped and shown as "at least" (≥) when they reach the cap; see
// docs/console.md and the page timings at a million runs in docs/performance.md.
//
// # Actions, authorization and CSRF
//
// The console is read-only unless Options.Actions is set and Options.Authorize
// allows the action: cancel, rerun or fork a run, send it a signal, pause, resume or
// trigger a schedule, and cancel or rerun everything a runs filter matches (a page
// shows how many runs match before anything happens). Every action is recorded,
// with who took it (as Authorize names them), in the table kagzi.console_audit,
// shown on the Audit page and on each run's page. Forms carry a CSRF token tied to
// a per-browser session cookie (SameSite=Strict, HttpOnly); a POST without the
// right token, or from another origin, is refused.
//
// # Namespaces
//
// A handler serves its client's namespace. Options.Namespaces lets it serve others,
// each through a client of its own, for the requests Options.Authorize allows; no
// page or action ever mixes namespaces.
package ui

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/kagzi/kagzi"
)

// Action names what a request asks to do, for Options.Authorize.
type Action string

// The actions. ActionRead is every page; the others are POSTs.
const (
	ActionRead           Action = "read"
	ActionCancel         Action = "cancel"
	ActionRerun          Action = "rerun"
	ActionFork           Action = "fork"
	ActionSignal         Action = "signal"
	ActionPauseSchedule  Action = "pause"
	ActionResumeSchedule Action = "resume"
	ActionTrigger        Action = "trigger"
	ActionBulkCancel     Action = "bulk-cancel"
	ActionBulkRerun      Action = "bulk-rerun"
)

// Access is what a request asks for: an action in a namespace.
type Access struct {
	Namespace string
	Action    Action
}

// Options configure the console. The zero value serves the client's namespace
// read-only to whoever reaches the handler: put your own authentication in front of
// it, or set Authorize.
type Options struct {
	// Title names the console in its header and page titles; default "Kagzi".
	Title string
	// HidePayloads hides run inputs and outputs, step outputs, signal payloads and
	// event values: only their size shows. Error messages still show.
	HidePayloads bool
	// Actions enables the console's actions. Each still needs Authorize to allow it:
	// without Authorize, the console stays read-only.
	Actions bool
	// Authorize is asked before every request with what it asks for (reading a page
	// counts as ActionRead) and returns who the caller is, recorded with each action
	// in the audit log, and whether the request is allowed. A refused request gets
	// 403 Forbidden. Nil: reading the client's namespace is allowed, nothing else.
	Authorize func(r *http.Request, a Access) (who string, allowed bool)
	// Namespaces returns a client for another namespace than the handler's client's
	// (create them with the same Config, but for Namespace; the console caches one
	// per namespace). Nil: the console serves its client's namespace only. A request
	// for another namespace also needs Authorize to allow it.
	Namespaces func(namespace string) (*kagzi.Client, error)
	// RefreshInterval is how often a page with auto-refresh turned on reloads;
	// default 5 s.
	RefreshInterval time.Duration
	// CSRFKey signs the forms' CSRF tokens. Default: a random key per Handler, so
	// tokens last as long as the process. Give every process that serves the console
	// behind one address the same key (32 random bytes).
	CSRFKey []byte
	// Logger receives errors of the console's pages. Default slog.Default().
	Logger *slog.Logger
}

// Handler returns the console for the client's namespace. Mount it at the root of a
// path prefix with http.StripPrefix; every link it renders is relative, so any
// prefix works.
func Handler(client *kagzi.Client, opts Options) http.Handler {
	return newConsole(client, opts)
}
