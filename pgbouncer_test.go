package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/store"
	"github.com/kagzi/kagzi/internal/testdb"
)

// pgbouncer is a PgBouncer of the test's own, in transaction pooling mode, in front
// of one PostgreSQL server; it is stopped when the test ends.
type pgbouncer struct {
	port    int
	version [2]int // major, minor
	// PreparedStatements tells whether this PgBouncer keeps protocol-level prepared
	// statements across its server connections (1.21 and later, with
	// max_prepared_statements set, as newPgBouncer sets it).
	PreparedStatements bool
}

// pgbouncerPath finds the pgbouncer program, or fails the test saying how to install
// it: a deployment test must not pass by skipping.
func pgbouncerPath(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/local/bin/pgbouncer"} {
		if isExecutable(p) {
			return p
		}
	}
	t.Fatal("this test needs PgBouncer and found none (looked in $PATH and /usr/sbin): install it, " +
		"e.g. `apt-get install -y pgbouncer` on Debian or Ubuntu (scripts/test does as root), `brew install pgbouncer` on macOS")
	return ""
}

// newPgBouncer starts a PgBouncer with pool_mode=transaction on a free port in front
// of the PostgreSQL server at host:port, with serverConns server connections per
// database and user at most. Every database name is forwarded as it is.
func newPgBouncer(t *testing.T, host string, port, serverConns int, extraSettings ...string) *pgbouncer {
	t.Helper()
	bin := pgbouncerPath(t)
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", bin, err, out)
	}
	m := regexp.MustCompile(`(\d+)\.(\d+)`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("%s --version printed no version: %s", bin, out)
	}
	b := &pgbouncer{port: freePort(t)}
	b.version[0], _ = strconv.Atoi(m[1])
	b.version[1], _ = strconv.Atoi(m[2])
	b.PreparedStatements = b.version[0] > 1 || b.version[1] >= 21

	dir, err := os.MkdirTemp("", "kagzi-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
max_client_conn = 2000
default_pool_size = %d
max_db_connections = %d
server_reset_query =
ignore_startup_parameters = extra_float_digits
admin_users = postgres
logfile = %s
pidfile = %s
`, host, port, b.port, filepath.Join(dir, "users.txt"), serverConns, serverConns,
		filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	if b.PreparedStatements {
		ini += "max_prepared_statements = 200\n"
	}
	for _, line := range extraSettings {
		ini += line + "\n"
	}
	for name, content := range map[string]string{"pgbouncer.ini": ini, "users.txt": `"postgres" ""` + "\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	if os.Geteuid() == 0 { // PgBouncer refuses to run as root
		u, err := user.Lookup("postgres")
		if err != nil {
			u, err = user.Lookup("nobody")
		}
		if err != nil {
			t.Fatal("running as root, and there is neither a 'postgres' nor a 'nobody' user to run pgbouncer as")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := pgx.Connect(context.Background(), b.url("pgbouncer"))
		if err == nil {
			conn.Close(context.Background())
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			t.Fatalf("pgbouncer does not answer on port %d: %v\n%s", b.port, err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return b
}

// url is the URL of database through the PgBouncer.
func (b *pgbouncer) url(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", b.port, database)
}

// poolConfig is the configuration of an application's pool through the PgBouncer:
// pgx's default statement cache (named prepared statements, kept per connection)
// only when the PgBouncer keeps prepared statements across its server connections;
// else statements are described once per connection and executed unnamed
// (QueryExecModeCacheDescribe), which any transaction pooler passes through.
func (b *pgbouncer) poolConfig(t *testing.T, database string) *pgxpool.Config {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.url(database))
	if err != nil {
		t.Fatal(err)
	}
	if !b.PreparedStatements {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "kagzi-pooled"
	return cfg
}

// Workflows of the PgBouncer tests.
var (
	pgbChild = kagzi.Define("pgb-child", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Step(ctx, "double", func(context.Context) (int, error) { return 2 * n, nil })
	})
	pgbOrder = kagzi.Define("pgb-order", func(ctx *kagzi.Context, n int) (string, error) {
		a, err := kagzi.Step(ctx, "first", func(context.Context) (int, error) { return n + 1, nil })
		if err != nil {
			return "", err
		}
		// Longer than MaxInProcessSleep: the run is suspended and woken by its timer.
		if err := ctx.Sleep("pause", 300*time.Millisecond); err != nil {
			return "", err
		}
		child, err := kagzi.StartChild(ctx, "child", pgbChild, a)
		if err != nil {
			return "", err
		}
		b, err := child.Get()
		if err != nil {
			return "", err
		}
		word, err := kagzi.WaitSignal[string](ctx, "go", time.Minute)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%d-%s", b, word), nil
	})
	pgbStuck = kagzi.Define("pgb-stuck", func(ctx *kagzi.Context, _ int) (string, error) {
		return kagzi.WaitSignal[string](ctx, "never", time.Hour)
	})
	pgbTick = kagzi.Define("pgb-tick", func(ctx *kagzi.Context, _ int) (int, error) {
		return kagzi.Step(ctx, "tick", func(context.Context) (int, error) { return 1, nil })
	})
)

func TestEveryPartOfKagziWorksThroughPgBouncerInTransactionModeWithADirectConnectionForListenAndLiveness(t *testing.T) {
	t.Parallel()
	db := testdb.NewEmpty(t)
	u, _ := url.Parse(db)
	b := newPgBouncer(t, "127.0.0.1", 5432, 5)
	direct, err := pgx.ParseConfig(db)
	if err != nil {
		t.Fatal(err)
	}
	direct.RuntimeParams["application_name"] = "kagzi-direct"
	runThroughPgBouncer(t, b, strings.TrimPrefix(u.Path, "/"), kagzi.Config{DirectConnConfig: direct})

	// The session state lives on the direct connection, and only there: every
	// worker's liveness lock is held by it, and the pool's sessions hold none.
	ctx := waitCtx(t)
	server := testdbPool(t, db)
	// The other client (closed) has left: one direct session for the client, its
	// LISTEN and its two workers' liveness locks. (On a loaded box the closed client's
	// session can still be ending, with its worker's lock: wait for it to go.)
	eventually(t, "one direct session", func() bool {
		return countRows(t, server, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'kagzi-direct' AND datname = current_database()`) == 1
	})
	var workers, heldByDirect, heldElsewhere int
	if err := server.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM kagzi.workers WHERE status = 'ONLINE' AND liveness_key IS NOT NULL),
			count(*) FILTER (WHERE a.application_name = 'kagzi-direct'),
			count(*) FILTER (WHERE a.application_name IS DISTINCT FROM 'kagzi-direct')
		FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`).
		Scan(&workers, &heldByDirect, &heldElsewhere); err != nil {
		t.Fatal(err)
	}
	if workers != 2 || heldByDirect != 2 || heldElsewhere != 0 {
		t.Fatalf("%d live workers record a liveness key; %d advisory locks held by the direct session, %d by others; want 2, 2, 0",
			workers, heldByDirect, heldElsewhere)
	}
}

func TestEveryPartOfKagziWorksThroughPgBouncerAloneWhenTheClientHasNoDirectConnection(t *testing.T) {
	t.Parallel()
	db := testdb.NewEmpty(t)
	u, _ := url.Parse(db)
	b := newPgBouncer(t, "127.0.0.1", 5432, 5)
	runThroughPgBouncer(t, b, strings.TrimPrefix(u.Path, "/"), kagzi.Config{DisableDirectConn: true})

	// Polling did the LISTEN connection's work, and no worker holds a liveness lock.
	ctx := waitCtx(t)
	server := testdbPool(t, db)
	var keys, locks, sessions int
	if err := server.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM kagzi.workers WHERE liveness_key IS NOT NULL),
			(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
				AND database = (SELECT oid FROM pg_database WHERE datname = current_database())),
			(SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
				AND application_name IS DISTINCT FROM 'kagzi-pooled' AND backend_type = 'client backend')`).
		Scan(&keys, &locks, &sessions); err != nil {
		t.Fatal(err)
	}
	if keys != 0 || locks != 0 || sessions != 0 {
		t.Fatalf("%d workers record a liveness key, %d advisory locks are held, %d sessions bypass the pooler; want none", keys, locks, sessions)
	}
}

func TestAWorkerWarnsWhenItsDirectConnectionGoesThroughATransactionPooler(t *testing.T) {
	t.Parallel()
	db := testdb.NewEmpty(t)
	u, _ := url.Parse(db)
	// Round robin: each transaction of a client on the next server session, as a
	// busy pooler would hand them out.
	b := newPgBouncer(t, "127.0.0.1", 5432, 4, "server_round_robin = 1")
	ctx := waitCtx(t)
	pool, err := pgxpool.NewWithConfig(ctx, b.poolConfig(t, strings.TrimPrefix(u.Path, "/")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := kagzi.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	// No DirectConnConfig: the direct connection is made from the pool's
	// configuration, through the pooler (the misconfiguration deployment.md warns of).
	pooled := &messages{}
	c, err := kagzi.NewClient(pool, kagzi.Config{Logger: slog.New(pooled)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	runWorker(t, c, fastWorker(), pgbTick)
	// A client whose direct connection is the server's own: no such warning.
	direct, err := pgx.ParseConfig(db)
	if err != nil {
		t.Fatal(err)
	}
	right := &messages{}
	c2, err := kagzi.NewClient(pool, kagzi.Config{Namespace: "right", DirectConnConfig: direct, Logger: slog.New(right)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c2.Close)
	runWorker(t, c2, fastWorker(), pgbTick)
	const warning = "does not keep its session"
	eventually(t, "the warning that the direct connection does not keep its session", func() bool {
		return pooled.contains(warning)
	})
	// The well configured client's workers have reaped several times by now.
	time.Sleep(3 * time.Second)
	if right.contains(warning) {
		t.Fatalf("a client with a direct connection of its own warned that it does not keep its session")
	}
}

// messages is a slog.Handler that keeps the messages of warnings.
type messages struct {
	mu   sync.Mutex
	msgs []string
}

func (m *messages) Enabled(context.Context, slog.Level) bool { return true }

func (m *messages) Handle(_ context.Context, rec slog.Record) error {
	if rec.Level >= slog.LevelWarn {
		m.mu.Lock()
		m.msgs = append(m.msgs, rec.Message)
		m.mu.Unlock()
	}
	return nil
}

func (m *messages) WithAttrs([]slog.Attr) slog.Handler { return m }
func (m *messages) WithGroup(string) slog.Handler      { return m }

func (m *messages) contains(s string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.ContainsFunc(m.msgs, func(msg string) bool { return strings.Contains(msg, s) })
}

// testdbPool is a pool straight to the database (not through a pooler), for the
// test's own looks at the server.
func testdbPool(t *testing.T, db string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// runThroughPgBouncer migrates database through b and runs workflows end to end with
// a client configured by cfg whose pool goes through b: starts (alone, in the
// application's transaction), steps, a durable sleep, a child, a signal, a cancel, a
// schedule, Wait from another client, listings and Health. It leaves two workers
// running until the test ends.
func runThroughPgBouncer(t *testing.T, b *pgbouncer, database string, cfg kagzi.Config) {
	t.Helper()
	ctx := waitCtx(t)
	pcfg := b.poolConfig(t, database)
	pcfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := kagzi.Migrate(ctx, pool); err != nil {
		t.Fatalf("Migrate through PgBouncer: %v", err)
	}
	if err := kagzi.Migrate(ctx, pool); err != nil { // current: nothing to do
		t.Fatalf("Migrate again through PgBouncer: %v", err)
	}
	cfg.Logger = quietLogger()
	client, err := kagzi.NewClient(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	wcfg := fastWorker()
	wcfg.PollInterval = 200 * time.Millisecond // without LISTEN, polling finds the runs
	runWorker(t, client, wcfg, pgbOrder, pgbChild, pgbStuck, pgbTick)
	runWorker(t, client, wcfg, pgbOrder, pgbChild, pgbStuck, pgbTick)
	eventually(t, "both workers to be registered", func() bool {
		page, err := client.ListWorkers(ctx, kagzi.WorkerFilter{})
		return err == nil && len(page.Workers) == 2
	})

	// A start alone, and one in the application's transaction.
	var runs []*kagzi.Run[string]
	run, err := kagzi.Start(ctx, client, pgbOrder, 1, kagzi.WithID("order-1"))
	if err != nil {
		t.Fatal(err)
	}
	runs = append(runs, run)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	run, err = kagzi.StartTx(ctx, tx, client, pgbOrder, 2, kagzi.WithID("order-2"))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	runs = append(runs, run)
	again, err := kagzi.Start(ctx, client, pgbOrder, 1, kagzi.WithID("order-1"))
	if err != nil || !again.AlreadyExists || again.RunID != runs[0].RunID {
		t.Fatalf("a second start of order-1 = %+v, %v; want the first run", again, err)
	}

	// Each run waits for its signal after its step, sleep and child.
	for _, r := range runs {
		eventually(t, "run "+r.RunID+" to wait for its signal", func() bool { return hasStep(t, client, r.RunID, "go#1") })
		if err := client.Signal(ctx, r.RunID, "go", "now"); err != nil {
			t.Fatal(err)
		}
		if page, err := client.ListSignals(ctx, r.RunID, kagzi.ListOptions{}); err != nil || len(page.Signals) != 1 {
			t.Fatalf("ListSignals: %v, %v; want the signal sent", page, err)
		}
	}
	// Waited for from another client (the end reaches it by NOTIFY, or by its looks).
	other, err := kagzi.NewClient(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"4-now", "6-now"} {
		out, err := kagzi.RunOf[string](other, runs[i].RunID).Wait(ctx)
		if err != nil || out != want {
			t.Fatalf("run %d = %q, %v; want %q", i+1, out, err, want)
		}
	}
	other.Close()

	// A cancel reaches a waiting run.
	stuck, err := kagzi.Start(ctx, client, pgbStuck, 0)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the stuck run to be claimed", func() bool { return hasStep(t, client, stuck.RunID, "never#1") })
	if err := client.Cancel(ctx, stuck.RunID); err != nil {
		t.Fatal(err)
	}
	if _, err := stuck.Wait(ctx); !errors.Is(err, kagzi.ErrCancelled) {
		t.Fatalf("the cancelled run's Wait = %v, want ErrCancelled", err)
	}

	// A schedule fires.
	if _, err := client.CreateSchedule(ctx, kagzi.Schedule{ID: "every-second", WorkflowType: "pgb-tick",
		Cron: "* * * * * *", Seconds: true, Input: 0}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the schedule to fire a run that completes", func() bool {
		page, err := client.ListRuns(ctx, kagzi.RunFilter{ScheduleID: "every-second", Statuses: []kagzi.RunStatus{kagzi.StatusCompleted}})
		if err != nil {
			t.Fatal(err)
		}
		return len(page.Runs) > 0
	})
	if err := client.DeleteSchedule(ctx, "every-second"); err != nil {
		t.Fatal(err)
	}

	// Listings and reads.
	page, err := client.ListRuns(ctx, kagzi.RunFilter{WorkflowType: "pgb-order"})
	if err != nil || len(page.Runs) != 2 {
		t.Fatalf("ListRuns of pgb-order: %v, %v; want 2 runs", page, err)
	}
	children, err := client.ListRuns(ctx, kagzi.RunFilter{WorkflowType: "pgb-child", Statuses: []kagzi.RunStatus{kagzi.StatusCompleted}})
	if err != nil || len(children.Runs) != 2 {
		t.Fatalf("ListRuns of completed children: %v, %v; want 2 runs", children, err)
	}
	if _, err := client.ListSchedules(ctx, kagzi.ScheduleFilter{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.QueueStats(ctx); err != nil {
		t.Fatal(err)
	}
	if h := client.Health(ctx); !h.Healthy() {
		t.Fatalf("Health through PgBouncer: %+v", h)
	}

	// The history: a client that archives at once moves the finished runs into it
	// (creating today's partitions), reads find them there, and an old day's
	// partitions are detached CONCURRENTLY and dropped, all through the pooler.
	acfg := cfg
	acfg.ArchiveAfter = time.Millisecond
	archiver, err := kagzi.NewClient(pool, acfg)
	if err != nil {
		t.Fatal(err)
	}
	defer archiver.Close()
	awcfg := wcfg
	awcfg.PruneInterval = 50 * time.Millisecond
	stopArchiver := runWorker(t, archiver, awcfg, pgbOrder, pgbChild, pgbStuck, pgbTick)
	defer stopArchiver()
	eventually(t, "the finished runs to move into the history", func() bool {
		var live, archived int
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM kagzi.runs WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED')),
			(SELECT count(*) FROM kagzi.runs_history)`).Scan(&live, &archived); err != nil {
			t.Fatal(err)
		}
		return live == 0 && archived >= 5
	})
	if page, err := client.ListRuns(ctx, kagzi.RunFilter{WorkflowType: "pgb-order"}); err != nil || len(page.Runs) != 2 {
		t.Fatalf("ListRuns of archived pgb-order runs: %v, %v; want 2 runs", page, err)
	}
	if out, err := kagzi.RunOf[string](client, runs[0].RunID).Wait(ctx); err != nil || out != "4-now" {
		t.Fatalf("Wait on an archived run: %q, %v", out, err)
	}
	old := time.Now().Add(-400 * 24 * time.Hour)
	if err := store.EnsureHistoryPartitions(ctx, pool, old, old); err != nil {
		t.Fatalf("creating history partitions through PgBouncer: %v", err)
	}
	// (The workers may drop them first: the default Retention is 30 days.)
	if _, err := store.DropHistoryBefore(ctx, pool, time.Now().Add(-300*24*time.Hour)); err != nil {
		t.Fatalf("dropping history partitions through PgBouncer: %v", err)
	}
	eventually(t, "the history partitions of a day 400 days ago to be dropped", func() bool {
		return countRows(t, pool, `SELECT count(*) FROM pg_class WHERE relnamespace = 'kagzi'::regnamespace
			AND relname LIKE '%\_p`+old.UTC().Format("20060102")+`'`) == 0
	})
}

// hasStep tells whether the run recorded (or is waiting in) the step key.
func hasStep(t *testing.T, c *kagzi.Client, runID, key string) bool {
	t.Helper()
	steps, err := c.ListSteps(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		if s.Key == key {
			return true
		}
	}
	return false
}

// Through PgBouncer, a PostgreSQL that is down reaches the client as PgBouncer's own
// error, SQLSTATE 08P01 ("pgbouncer cannot connect to server", "server login has been
// failing"): Start returns ErrUnavailable and Run.Wait rides the outage out, as they
// do without a pooler (found from outside: both returned the error untyped, Wait
// after 4 s of a 90 s context).
func TestThroughPgBouncerADatabaseOutageIsUnavailableAndAWaitRidesItOut(t *testing.T) {
	t.Parallel()
	pg := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg.MigratedPool(ctx).Close()
	port, _ := strconv.Atoi(strings.TrimPrefix(pg.URL[strings.LastIndex(pg.URL, ":"):strings.LastIndex(pg.URL, "/")], ":"))
	// A query on a client connection waits for a server up to query_wait_timeout, then
	// fails; a new client connection fails at once while logins to the server fail
	// (server_login_retry: the default 15 s).
	b := newPgBouncer(t, "127.0.0.1", port, 3, "query_wait_timeout = 2")
	pcfg := b.poolConfig(t, "postgres")
	pcfg.MaxConns = 3
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c, err := kagzi.NewClient(pool, kagzi.Config{DisableDirectConn: true, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	run, err := kagzi.Start(ctx, c, greet, greetIn{Name: "pooled"}) // no worker yet: it waits PENDING
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		out, err := run.Wait(ctx)
		if err == nil && out.Greeting != "hello pooled" {
			err = fmt.Errorf("output %+v", out)
		}
		done <- err
	}()
	pg.pgctl("stop", "-m", "fast", "-w") // a restart's stop: the server ends its sessions
	// query_wait_timeout on the pool's connections, then "server login has been failing".
	for i := range 3 {
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		_, err := kagzi.Start(sctx, c, greet, greetIn{Name: fmt.Sprint("during-", i)})
		cancel()
		if !errors.Is(err, kagzi.ErrUnavailable) {
			t.Fatalf("Start %d through PgBouncer while PostgreSQL is down: %v, want ErrUnavailable", i, err)
		}
		time.Sleep(700 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("the Wait returned while PostgreSQL was down: %v", err)
	case <-time.After(2 * time.Second): // Wait looks every second without a direct connection
	}
	pg.Start()
	runWorker(t, c, fastWorker(), greet)
	if err := <-done; err != nil {
		t.Fatalf("the Wait across the outage: %v; want the run's result", err)
	}
}
