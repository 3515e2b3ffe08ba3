package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/testdb"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashWorkerEnv) != "" {
		os.Exit(runCrashWorker())
	}
	if os.Getenv(aheadHelperEnv) != "" {
		os.Exit(runAheadHelper())
	}
	if os.Getenv(fleetPoolEnv) != "" {
		os.Exit(runFleetWorker())
	}
	os.Exit(m.Run())
}

// quietLogger keeps the test output for failures: set KAGZI_TEST_LOG=1 to see logs.
func quietLogger() *slog.Logger {
	if os.Getenv("KAGZI_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type env struct {
	pool   *pgxpool.Pool
	url    string
	client *kagzi.Client
}

// newEnv gives the test its own migrated database and a client in the default namespace.
func newEnv(t *testing.T) *env {
	t.Helper()
	t.Parallel()
	pool, url := testdb.NewPool(t)
	return &env{pool: pool, url: url, client: newClient(t, pool, "")}
}

func newClient(t *testing.T, pool *pgxpool.Pool, namespace string) *kagzi.Client {
	t.Helper()
	c, err := kagzi.NewClient(pool, kagzi.Config{Namespace: namespace, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// fastWorker is a worker config with short leases so recovery tests run quickly.
func fastWorker() kagzi.WorkerConfig {
	return kagzi.WorkerConfig{
		LeaseDuration:     time.Second,
		HeartbeatInterval: 250 * time.Millisecond,
		PollInterval:      500 * time.Millisecond,
		DrainTimeout:      2 * time.Second,
	}
}

// runWorker runs a worker until the test ends (or stop is called) and returns stop,
// which waits for Run to return.
func runWorker(t *testing.T, c *kagzi.Client, cfg kagzi.WorkerConfig, wfs ...kagzi.Definition) (stop func()) {
	t.Helper()
	_, stop = startWorker(t, c, cfg, wfs...)
	return stop
}

// startWorker is runWorker that also returns the worker, for its counters.
func startWorker(t testing.TB, c *kagzi.Client, cfg kagzi.WorkerConfig, wfs ...kagzi.Definition) (*kagzi.Worker, func()) {
	t.Helper()
	w, err := kagzi.NewWorker(c, cfg, wfs...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("worker.Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return w, stop
}

func waitCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it holds, failing the test after 20 seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventuallyWithin(t, 20*time.Second, what, cond)
}

// eventuallyWithin is eventually with its own limit, for waits whose length grows with
// the box's load (e.g. many subprocesses starting under the race detector).
func eventuallyWithin(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func runStatus(t *testing.T, c *kagzi.Client, runID string) kagzi.RunStatus {
	t.Helper()
	info, err := c.GetRun(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	return info.Status
}

func countRows(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func mustErrorIs(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("got error %v, want one that wraps %v", err, target)
	}
}

// failingStep fails its first n attempts with err, then returns "ok".
func failingStep(n int32, err error) (func(context.Context) (string, error), *atomic.Int32) {
	var calls atomic.Int32
	return func(context.Context) (string, error) {
		if calls.Add(1) <= n {
			return "", err
		}
		return "ok", nil
	}, &calls
}

func stepsOf(t *testing.T, c *kagzi.Client, runID string) []kagzi.StepInfo {
	t.Helper()
	steps, err := c.ListSteps(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	return steps
}

// roundTrips counts the round trips a pool makes: each query, and each pipelined
// batch as one. It also keeps the statements so tests can classify them.
type roundTrips struct {
	n   atomic.Int64
	mu  sync.Mutex
	sql []string
	// done holds the queries (not batches) that have ended: their results were read.
	done []string
}

type tracedSQL struct{}

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	r.mu.Lock()
	r.sql = append(r.sql, d.SQL)
	r.mu.Unlock()
	return context.WithValue(ctx, tracedSQL{}, d.SQL)
}

func (r *roundTrips) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if sql, ok := ctx.Value(tracedSQL{}).(string); ok {
		r.mu.Lock()
		r.done = append(r.done, sql)
		r.mu.Unlock()
	}
}

func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	var sqls []string
	for _, q := range d.Batch.QueuedQueries {
		sqls = append(sqls, q.SQL)
	}
	r.mu.Lock()
	r.sql = append(r.sql, "BATCH["+strings.Join(sqls, "; ")+"]")
	r.mu.Unlock()
	return ctx
}

func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (r *roundTrips) count(substr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return countContaining(r.sql, substr)
}

// countDone counts the queries containing substr whose results were read.
func (r *roundTrips) countDone(substr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return countContaining(r.done, substr)
}

func countContaining(sqls []string, substr string) int {
	n := 0
	for _, s := range sqls {
		if strings.Contains(s, substr) {
			n++
		}
	}
	return n
}

func tracedPool(tb testing.TB, url string) (*pgxpool.Pool, *roundTrips) {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	rt := &roundTrips{}
	cfg.ConnConfig.Tracer = rt
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool, rt
}

// processState returns the state letter of a process (R, S, T for stopped, ...).
func processState(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) state ...: comm may hold spaces, so read after its closing paren.
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return fields[0]
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// atOnce records how many workflow functions run at once, in all and per concurrency
// key, and the most there ever were: the limits' exactness, seen from the workflows.
type atOnce struct {
	mu            sync.Mutex
	running, most map[string]int // by key; "" for all
}

// enter records a function of key ("": none) beginning; the returned func, its end.
func (a *atOnce) enter(key string) (leave func()) {
	keys := []string{""}
	if key != "" {
		keys = append(keys, key)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.running == nil {
		a.running, a.most = map[string]int{}, map[string]int{}
	}
	for _, k := range keys {
		a.running[k]++
		a.most[k] = max(a.most[k], a.running[k])
	}
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, k := range keys {
			a.running[k]--
		}
	}
}

// check fails t if more than typeLimit functions ran at once, or more than keyLimit
// of one key.
func (a *atOnce) check(t *testing.T, typeLimit, keyLimit int) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, m := range a.most {
		if k == "" && m > typeLimit {
			t.Errorf("%d runs of the type ran at once, limit %d", m, typeLimit)
		}
		if k != "" && m > keyLimit {
			t.Errorf("%d runs of %s ran at once, key limit %d", m, k, keyLimit)
		}
	}
}

// leaseTo makes the run RUNNING under worker's lease for an hour, as a claim by a
// worker that then died or froze would leave it (nothing executes it).
func leaseTo(t *testing.T, e *env, runID, worker string) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), `UPDATE kagzi.runs SET status = 'RUNNING', locked_by = $2,
		lease_epoch = lease_epoch + 1, available_at = now() + interval '1 hour', started_at = now()
		WHERE run_id = $1`, runID, worker); err != nil {
		t.Fatal(err)
	}
}

// silentServer listens on a local port, accepts connections and never answers them (a
// server behind a dropped route), until the test ends; it returns the address.
func silentServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // accepted, never answered
		}
	}()
	return l.Addr().String()
}
