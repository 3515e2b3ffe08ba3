package kagzi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi/internal/committer"
	"github.com/kagzi/kagzi/internal/notifier"
	"github.com/kagzi/kagzi/internal/schema"
	"github.com/kagzi/kagzi/internal/store"
)

// Version is this library's version, recorded by every worker it registers.
const Version = "0.1.0"

// DefaultNamespace is the namespace of a Config that names none.
const DefaultNamespace = "default"

// DefaultMaxPayloadSize is the largest encoded input or output a Config allows by default.
const DefaultMaxPayloadSize = 1 << 20

// Config configures a Client.
type Config struct {
	// Namespace isolates tenants: every read and write of the client is confined to
	// it. Default "default".
	Namespace string
	// Logger receives Kagzi's logs. Default slog.Default(). Payloads are never logged.
	Logger *slog.Logger
	// MaxPayloadSize is the largest JSON-encoded input or output, in bytes (with a
	// Codec, once encoded). Larger ones are rejected with ErrInvalidArgument. Default
	// DefaultMaxPayloadSize.
	MaxPayloadSize int
	// Retention is how long finished runs (COMPLETED, FAILED, CANCELLED) of the
	// namespace are kept, with their steps, attempts, signals and events. Default
	// DefaultRetention; a negative value keeps them for ever. Each namespace (client)
	// has its own. Archived runs (see ArchiveAfter) go a day's partition at a time,
	// once the day is past the longest Retention of the namespaces sharing the
	// database; a namespace with a shorter one deletes its own older runs in small
	// batches (docs/evolving-workflows.md, "Retention and the history"). A worker
	// records its namespace's Retention in kagzi.history_retention, where it holds
	// while the namespace's workers are stopped, however long: delete the row of a
	// namespace that is gone for good.
	Retention time.Duration
	// ArchiveAfter is how long a finished run stays in the live tables before the
	// workers of this client move it, with its steps, attempts, signals, events and
	// listing entry, into the history: tables partitioned by the day it finished,
	// which retention drops a partition at a time. Every read (GetRun, Wait, ListRuns,
	// steps, signals, events, the console) finds archived runs as before; a rerun moves
	// the run back. Default DefaultArchiveAfter; a negative value archives nothing
	// (finished runs stay in the live tables until Retention deletes them row by row).
	ArchiveAfter time.Duration
	// Hooks observe starts, executions, step attempts, sleeps, signals and claims of
	// the client and its workers, for tracing and metrics (see the kagziotel package)
	// or tests (kagzitest). Default none; see Hooks.
	Hooks Hooks
	// ScheduleClock is the time the client's schedule calls (CreateSchedule,
	// UpdateSchedule, ResumeSchedule, TriggerSchedule) compute a schedule's next tick
	// and a trigger's tick from. Default time.Now; a test that moves its workers'
	// WorkerConfig.Clock sets the same here (kagzitest does).
	ScheduleClock func() time.Time
	// Codec transforms payloads (inputs, outputs, signals, events) before they reach
	// PostgreSQL: compression, encryption. MaxPayloadSize then applies to the encoded
	// payload. Default none: payloads are stored as JSON. See Codec.
	Codec Codec

	// DirectConnConfig configures the one connection the client opens outside its
	// pool: its LISTEN connection, on which its workers also hold their liveness
	// locks. Both are session state, so this connection must reach PostgreSQL itself
	// (the primary), not a pooler in transaction mode such as PgBouncer's
	// pool_mode=transaction, which would take them to whichever server connection it
	// lends next. Default: the pool's ConnConfig (right when the pool connects to
	// PostgreSQL directly). See docs/deployment.md.
	DirectConnConfig *pgx.ConnConfig
	// DisableDirectConn makes the client open no connection outside its pool, for
	// deployments where only a pooler is reachable. Nothing LISTENs then: workers
	// poll (WorkerConfig.PollInterval defaults to 1s instead of 5s), Wait looks at
	// its run every second at most, schedulers look every PollInterval, and workers
	// hold no liveness lock, so the runs of a process that died wait for their lease
	// (WorkerConfig.LeaseDuration) instead of being taken over within a ReapInterval.
	// It cannot be combined with DirectConnConfig.
	DisableDirectConn bool
	// ReadPool, when set, serves the client's listings and the console's pages:
	// ListRuns, ListWorkers, ListSchedules, ListSignals, ListEvents, QueueStats and
	// the reads of package ui, typically from a streaming replica (hot standby).
	// They may then lag the primary by the replication delay. Everything that must
	// read its own writes or the latest state stays on the pool: starts, Wait, GetRun,
	// GetRunByWorkflowID, ListSteps, GetWorker, GetSchedule, Health, claims, the bulk
	// operations (which list the runs they change) and every write. Default: the pool.
	ReadPool *pgxpool.Pool
	// MaxConnections, when positive, is the most connections the client may open:
	// its pool's MaxConns plus its direct connection (none with DisableDirectConn).
	// Workers share the client's connections and add none. NewClient returns
	// ErrInvalidArgument when the configuration needs more, so that a process
	// started with too large a pool fails at once instead of meeting "too many
	// connections" under load. ReadPool's connections, to another server, are not
	// counted. Default 0: not checked. See docs/deployment.md for the arithmetic.
	MaxConnections int
}

// DefaultRetention is how long finished runs are kept unless Config.Retention says otherwise.
const DefaultRetention = 30 * 24 * time.Hour

// DefaultArchiveAfter is how long finished runs stay in the live tables unless
// Config.ArchiveAfter says otherwise.
const DefaultArchiveAfter = 15 * time.Minute

// Client starts, reads and cancels runs in one namespace. It is safe for concurrent
// use; create one per namespace and share it. Make it with NewClient: every method
// (and function taking a Client) that can fail refuses a nil Client, or a zero one,
// with an error wrapping ErrInvalidArgument; the others return their zero value
// (Close does nothing).
type Client struct {
	// id tells this client's registration as a waiter for run ends from others'
	// (see waiters.go).
	id        uuid.UUID
	waiter    waiterRegistration
	waitPoll  time.Duration // how long Wait waits for news before its second look (doubling to 5 s)
	looks     runLooks      // the waits' batched looks at their runs (waiters.go)
	pool      *pgxpool.Pool
	read      *pgxpool.Pool   // Config.ReadPool, or pool
	direct    *pgx.ConnConfig // Config.DirectConnConfig; nil: the pool's
	noDirect  bool            // Config.DisableDirectConn
	ns        string
	logger    *slog.Logger
	retention time.Duration
	// archiveAfter: Config.ArchiveAfter.
	archiveAfter time.Duration
	payloads     // Config.Codec and MaxPayloadSize
	notifier     *notifier.Notifier
	sender       *notifier.Sender     // notifies workers of committed starts, coalesced
	starts       *committer.Committer // batches concurrent Start statements into shared commits
	// startsInFlight counts the client's Start calls under way (see startRun).
	startsInFlight atomic.Int32
	hooks          Hooks // nil: none (Config.Hooks)
	scheduleClock  func() time.Time
	// noWorkerWarned holds the workflow types StartByName warned about (see warnNoWorker).
	noWorkerWarned sync.Map
	// limitedTypes holds the workflow types an eager start found limited (see eager.go).
	limitedTypes sync.Map

	mu      sync.Mutex
	workers map[*Worker]struct{} // this process's running workers, for Health
}

// addWorker adds a starting worker to the client's running workers; one whose id
// another of them has is ErrAlreadyExists.
func (c *Client) addWorker(w *Worker) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.workers == nil {
		c.workers = map[*Worker]struct{}{}
	}
	for o := range c.workers {
		if o.cfg.ID == w.cfg.ID {
			return fmt.Errorf("kagzi: worker %s: %w: another running worker of this client has its id "+
				"(worker ids must be unique among running workers)", w.cfg.ID, ErrAlreadyExists)
		}
	}
	c.workers[w] = struct{}{}
	return nil
}

func (c *Client) removeWorker(w *Worker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.workers, w)
}

// supportedExecMode refuses a pool whose statements would send their arguments
// without their types (pgx's QueryExecModeExec and QueryExecModeSimpleProtocol):
// Kagzi passes uuids, arrays and JSON objects that pgx can encode only once the
// server described the statement's parameters.
func supportedExecMode(p *pgxpool.Pool) (err error) {
	if p == nil {
		return nil
	}
	defer func() {
		if recover() != nil { // a Pool not made by pgxpool (its zero value) has no Config
			err = nil
		}
	}()
	switch m := p.Config().ConnConfig.DefaultQueryExecMode; m {
	case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol:
		return invalidArgument("the pool's DefaultQueryExecMode %v is not supported: use pgx.QueryExecModeCacheStatement "+
			"(the default) or, through a pooler that cannot keep prepared statements, pgx.QueryExecModeCacheDescribe "+
			"(default_query_exec_mode=cache_describe in the DSN)", m)
	}
	return nil
}

// NewClient returns a client over pool. The pool is the application's own: Kagzi
// borrows connections from it for its queries, and opens one more connection of its
// own, outside the pool (see Config.DirectConnConfig), to LISTEN for notifications
// while anything waits for them, on which the client's workers also hold their
// liveness locks. A client holds at most the pool's MaxConns plus that one
// connection, whatever its workers and their MaxConcurrent: a run holds no
// connection while it executes, only for each statement (see Connections).
//
// Invalid configuration returns ErrInvalidArgument.
func NewClient(pool *pgxpool.Pool, cfg Config) (*Client, error) {
	if pool == nil {
		return nil, invalidArgument("nil pool")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if err := validName("namespace", cfg.Namespace); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxPayloadSize < 0 {
		return nil, invalidArgument("negative MaxPayloadSize %d", cfg.MaxPayloadSize)
	}
	if cfg.MaxPayloadSize == 0 {
		cfg.MaxPayloadSize = DefaultMaxPayloadSize
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.ArchiveAfter == 0 {
		cfg.ArchiveAfter = DefaultArchiveAfter
	}
	for _, p := range []*pgxpool.Pool{pool, cfg.ReadPool} {
		if err := supportedExecMode(p); err != nil {
			return nil, err
		}
	}
	if d := cfg.DirectConnConfig; d != nil && (d.Host == "" || d.Port == 0) {
		// pgx.ConnectConfig panics on a configuration ParseConfig did not make, in
		// the listener's goroutine; one made by it always names a host and a port.
		return nil, invalidArgument("DirectConnConfig names no host or port: make it with pgx.ParseConfig")
	}
	if cfg.DisableDirectConn && cfg.DirectConnConfig != nil {
		return nil, invalidArgument("DirectConnConfig with DisableDirectConn: give the direct connection's configuration, or say there is none")
	}
	if cfg.MaxConnections < 0 {
		return nil, invalidArgument("negative MaxConnections %d", cfg.MaxConnections)
	}
	if v := reflect.ValueOf(cfg.Hooks); cfg.Hooks != nil && v.Kind() == reflect.Pointer && v.IsNil() {
		// A nil *T in the interface (a constructor's result whose error was ignored):
		// every hook call would panic.
		return nil, invalidArgument("Hooks is a nil %T: leave Hooks nil for none", cfg.Hooks)
	}
	if cfg.MaxConnections > 0 && connections(pool, cfg.DisableDirectConn) > cfg.MaxConnections {
		n := connections(pool, cfg.DisableDirectConn)
		fix := "lower the pool's MaxConns (pool_max_conns)"
		if pool.Config().MaxConns <= 1 {
			// The pool cannot shrink: only the direct connection can go (notifications
			// and the liveness lock with it, see DisableDirectConn).
			fix = "raise MaxConnections, or set DisableDirectConn"
		}
		return nil, invalidArgument("the client needs up to %d connections (the pool's MaxConns %d + %d direct), more than MaxConnections %d: %s",
			n, pool.Config().MaxConns, n-int(pool.Config().MaxConns), cfg.MaxConnections, fix)
	}
	c := &Client{id: uuid.New(), waitPoll: 250 * time.Millisecond, pool: pool, read: pool, ns: cfg.Namespace,
		waiter: waiterRegistration{turn: make(chan struct{}, 1)},
		logger: cfg.Logger, retention: cfg.Retention, archiveAfter: cfg.ArchiveAfter,
		payloads: payloads{codec: cfg.Codec, maxBytes: cfg.MaxPayloadSize, logger: cfg.Logger}}
	if cfg.ReadPool != nil {
		c.read = cfg.ReadPool
	}
	c.sender = notifier.NewSender(pool, store.Channel, cfg.Logger)
	// Starts that commit on their own share commits when they come together (group
	// commit, as the workers' step records do). Its two goroutines run while starts
	// come, and end when none came for startsIdle: a client nothing uses any more
	// holds no goroutine, and is collected with everything it holds.
	c.starts = committer.New(pool, 256)
	c.starts.RunOnDemand(2, startsIdle)
	if cfg.DisableDirectConn {
		c.noDirect = true
		c.notifier = notifier.New(nil, store.Channel, cfg.Logger)
	} else {
		if cfg.DirectConnConfig != nil {
			c.direct = cfg.DirectConnConfig.Copy()
		}
		c.notifier = notifier.New(c.connectDirect, store.Channel, cfg.Logger)
	}
	c.hooks = guardHooks(cfg.Hooks, cfg.Logger)
	c.scheduleClock = cfg.ScheduleClock
	if c.scheduleClock == nil {
		c.scheduleClock = time.Now
	}
	return c, nil
}

// startsIdle is how long the goroutines that share starts' commits wait for a start
// before they end (a variable for the tests).
var startsIdle = 10 * time.Second

// connections is what a client over pool may open at most: the pool's MaxConns and
// its direct connection.
func connections(pool *pgxpool.Pool, noDirect bool) int {
	n := int(pool.Config().MaxConns)
	if !noDirect {
		n++
	}
	return n
}

// usable refuses a nil Client, or one not made by NewClient (a zero value, which has
// no pool), with ErrInvalidArgument naming the call op. Every exported method that
// can fail calls it first: a nil check, on every path.
func (c *Client) usable(op string) error {
	if c == nil || c.pool == nil {
		return invalidArgument("%s: a nil or zero Client (make one with NewClient)", op)
	}
	return nil
}

// Connections returns the most connections the client opens: its pool's MaxConns,
// plus 1 for its direct connection (the LISTEN connection, which also holds its
// workers' liveness locks) unless Config.DisableDirectConn. Its workers add none.
// Config.ReadPool's connections are not counted. A process's share of the server's
// max_connections is the sum over its clients (clients sharing a pool count its
// MaxConns once); see docs/deployment.md. A nil or zero Client opens none: 0.
func (c *Client) Connections() int {
	if c.usable("Connections") != nil {
		return 0
	}
	return connections(c.pool, c.noDirect)
}

// connectDirect opens the client's direct connection (not the pool's): the LISTEN
// connection, which also holds its workers' liveness locks. Its configuration is
// Config.DirectConnConfig, or the pool's.
func (c *Client) connectDirect(ctx context.Context) (conn *pgx.Conn, err error) {
	cfg := c.direct
	if cfg == nil {
		cfg = c.pool.Config().ConnConfig
	}
	cfg = cfg.Copy()
	// The listener interrupts its waits for notifications to serve the liveness
	// locks: a cancelled wait must only set a read deadline, never send a cancel
	// request, which could cancel the connection's next statement instead.
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	defer func() {
		// pgx panics on a configuration ParseConfig did not make; NewClient refuses
		// the ones it can tell, and this keeps any other from crashing the process.
		if r := recover(); r != nil {
			conn, err = nil, fmt.Errorf("kagzi: the direct connection's configuration: %v", r)
		}
	}()
	return pgx.ConnectConfig(ctx, cfg)
}

// Close closes the client's LISTEN connection, which otherwise stays open for 30
// seconds after the last worker or Wait using it stopped (retrying to connect, all
// that time, to a database that went away), and ends the goroutines that share its
// starts' commits (which otherwise end after 10 seconds without a start). It returns
// once they and the goroutine that listened have ended: the client then holds no
// goroutine and no connection of its own (starts made meanwhile keep their
// goroutines busy: Close waits for them at most a second, and they end once the
// starts stop). Call it once the client's workers have
// stopped: it stops the listening under them too (their notifications and liveness
// locks), whoever still uses it. The pool is the application's and stays open. A
// closed client may be used again: the connection and the goroutines come back when
// needed. Close of a nil or zero Client, which holds nothing, does nothing.
func (c *Client) Close() {
	if c.usable("Close") != nil {
		return
	}
	c.notifier.Close()
	c.starts.EndIdle()
}

// Namespace returns the client's namespace ("" for a nil or zero Client, which has
// none).
func (c *Client) Namespace() string {
	if c.usable("Namespace") != nil {
		return ""
	}
	return c.ns
}

// Migrate applies Kagzi's schema migrations (the goose files in the migrations
// package) to the database of pool. It applies them itself, as goose would (Kagzi
// does not depend on goose): the goose CLI sees the result as migrated, and Migrate
// accepts a database the goose CLI migrated. It is safe to call from many processes
// at once (an advisory lock serialises them, on the key goose's provider locks with
// its Postgres session locker, taken per migration in the migration's transaction;
// a caller waits for it as long as ctx allows) and does nothing when the schema is
// current. A migration whose table another transaction holds (a long transaction
// that read it) does not queue every other statement on the table behind it: its
// lock waits time out after a second and it is tried again, every few seconds, until
// it applies or ctx ends (bound ctx to bound the wait). It leaves no session state, so
// pool may go through PgBouncer in transaction mode. Kagzi's tables
// live in the "kagzi" schema; goose's version table for them is
// migrations.VersionTable, so it never clashes with the application's own.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if pool == nil {
		return invalidArgument("nil pool")
	}
	return dbError("kagzi: migrate", schema.Up(ctx, pool))
}

// validName checks a namespace, workflow type or workflow id: 1 to 255 bytes of
// valid UTF-8 without control characters (C0, DEL and C1: unicode.IsControl).
func validName(what, s string) error {
	switch {
	case s == "":
		return invalidArgument("empty %s", what)
	case len(s) > 255:
		return invalidArgument("%s longer than 255 bytes", what)
	case !utf8.ValidString(s):
		return invalidArgument("%s %q is not valid UTF-8", what, s)
	case strings.ContainsFunc(s, unicode.IsControl):
		return invalidArgument("%s %q contains a control character", what, s)
	}
	return nil
}

// poolClosed reports whether the application closed the client's pool. pgxpool has
// no such query: a closed pool holds no connection, and an Acquire from it fails at
// once with "closed pool" without touching the network; an open pool with no
// connection opens one (which it keeps for the next statement).
func (c *Client) poolClosed() bool {
	if c.pool.Stat().TotalConns() > 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return errors.Is(dbError("", err), ErrClosed)
	}
	conn.Release()
	return false
}
