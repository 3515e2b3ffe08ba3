package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

// The test binary, started with fleetPoolEnv set, runs one worker process of a fleet
// instead of the tests (see TestMain): its pool goes through a PgBouncer, its direct
// connection to PostgreSQL itself.
const (
	fleetPoolEnv   = "KAGZI_TEST_FLEET_POOL"   // the pool's URL (through PgBouncer)
	fleetDirectEnv = "KAGZI_TEST_FLEET_DIRECT" // the direct connection's URL
	fleetExecEnv   = "KAGZI_TEST_FLEET_EXEC"   // "describe": QueryExecModeCacheDescribe
)

// fleetJob's step returns the pid of the process that ran it.
var fleetJob = kagzi.Define("fleet-job", func(ctx *kagzi.Context, n int) (int, error) {
	if _, err := kagzi.Step(ctx, "first", func(context.Context) (int, error) { return n, nil }); err != nil {
		return 0, err
	}
	return kagzi.Step(ctx, "pid", func(context.Context) (int, error) { return os.Getpid(), nil })
})

// fleetMaxConns is each fleet process's pool size, and fleetConnections the most
// connections a process may open (Config.MaxConnections): that pool and the direct
// connection.
const (
	fleetMaxConns    = 2
	fleetConnections = fleetMaxConns + 1
)

// runFleetWorker runs a worker until SIGTERM; its exit status tells whether it could.
func runFleetWorker() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	cfg, err := pgxpool.ParseConfig(os.Getenv(fleetPoolEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg.MaxConns = fleetMaxConns
	if os.Getenv(fleetExecEnv) == "describe" {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	direct, err := pgx.ParseConfig(os.Getenv(fleetDirectEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	client, err := kagzi.NewClient(pool, kagzi.Config{DirectConnConfig: direct, MaxConnections: fleetConnections,
		Logger: quietLogger()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer client.Close()
	// A lease long enough that a process starved of CPU among fifty (race-built, on a
	// loaded 2-core box) keeps its runs: takeovers are not what this test is about.
	w, err := kagzi.NewWorker(client, kagzi.WorkerConfig{MaxConcurrent: 20, LeaseDuration: 30 * time.Second,
		PollInterval: time.Second}, fleetJob)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := w.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func TestFiftyWorkerProcessesCompleteABatchOnAServerOfAHundredConnections(t *testing.T) {
	t.Parallel()
	const processes, runs, serverConns = 50, 500, 20
	pg := newCluster(t, "max_connections=100")
	b := newPgBouncer(t, "127.0.0.1", pg.port, serverConns)
	// Fifty processes built with the race detector start and work slowly on a loaded
	// 2-core box (their registration once took more than 20 s, the batch once more
	// than 20 s after it, while the rest of the suite ran): how long they take is not
	// what this test is about, so its waits share three minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	deadline, _ := ctx.Deadline()
	pool, err := pgxpool.New(ctx, pg.URL+"&pool_max_conns=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := kagzi.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	client, err := kagzi.NewClient(pool, kagzi.Config{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	// The server's connections, sampled while the fleet works.
	var peak atomic.Int64
	sampling, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sampling.Err() == nil {
			var n int64
			if err := pool.QueryRow(sampling, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'`).
				Scan(&n); err == nil && n > peak.Load() {
				peak.Store(n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	mode := "statement"
	if !b.PreparedStatements {
		mode = "describe"
	}
	var fleet []*exec.Cmd
	for range processes {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), fleetPoolEnv+"="+b.url("postgres"), fleetDirectEnv+"="+pg.URL, fleetExecEnv+"="+mode)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		fleet = append(fleet, cmd)
	}
	eventuallyWithin(t, time.Until(deadline)/2, "every process's worker to be registered", func() bool {
		return countRows(t, pool, `SELECT count(*) FROM kagzi.workers WHERE status = 'ONLINE'`) == processes
	})

	inputs := make([]int, runs)
	for i := range inputs {
		inputs[i] = i
	}
	if _, err := kagzi.StartMany(ctx, client, fleetJob, inputs); err != nil {
		t.Fatal(err)
	}
	eventuallyWithin(t, time.Until(deadline)-20*time.Second, "every run to complete", func() bool {
		return countRows(t, pool, `SELECT count(*) FROM kagzi.runs WHERE status = 'COMPLETED'`) == runs
	})
	stopSampling()
	<-sampled

	// None lost, none failed, each step recorded once; the fleet shared the work.
	if n := countRows(t, pool, `SELECT count(*) FROM kagzi.runs WHERE status <> 'COMPLETED'`); n != 0 {
		t.Fatalf("%d runs did not complete", n)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM kagzi.steps`); n != 2*runs {
		t.Fatalf("%d step records for %d runs of 2 steps", n, runs)
	}
	executors := countRows(t, pool, `SELECT count(DISTINCT output) FROM kagzi.steps WHERE step_key = 'pid#1'`)
	if executors < 2 {
		t.Fatalf("%d processes executed runs, want the fleet to share them", executors)
	}
	// Every process stops cleanly: none met an error it could not survive.
	for _, cmd := range fleet {
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}
	for i, cmd := range fleet {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("fleet process %d: %v", i, err)
		}
	}
	if log := pg.Log(); strings.Contains(log, "too many clients") || strings.Contains(log, "remaining connection slots") {
		t.Fatalf("the server refused connections:\n%s", log)
	}
	budget := int64(processes + serverConns + 2) // a direct connection per process, PgBouncer's, the test's pool
	if p := peak.Load(); p > budget {
		t.Fatalf("the server had %d connections at its peak, more than the budget %d", p, budget)
	}
	t.Logf("%d processes (pool MaxConns %d through PgBouncer, 1 direct connection each), %d runs: "+
		"peak %d server connections of max_connections 100; %d processes executed runs",
		processes, fleetMaxConns, runs, peak.Load(), executors)
}

func TestNewClientRefusesAConfigurationThatNeedsMoreConnectionsThanMaxConnectionsAndOpensNone(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://app@127.0.0.1:1/app?pool_max_conns=4")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	direct, err := pgx.ParseConfig("postgres://app@127.0.0.1:1/app")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  kagzi.Config
		want int // Connections; 0: refused
	}{
		{"the pool and the direct connection fit", kagzi.Config{MaxConnections: 5}, 5},
		{"the direct connection does not fit", kagzi.Config{MaxConnections: 4}, 0},
		{"no direct connection: the pool fits", kagzi.Config{MaxConnections: 4, DisableDirectConn: true}, 4},
		{"the pool does not fit", kagzi.Config{MaxConnections: 3, DisableDirectConn: true}, 0},
		{"not checked", kagzi.Config{DirectConnConfig: direct}, 5},
		{"negative", kagzi.Config{MaxConnections: -1}, 0},
		{"a direct connection's configuration and none", kagzi.Config{DirectConnConfig: direct, DisableDirectConn: true}, 0},
		// pgx panics on a ConnConfig ParseConfig did not make: refused, not a crash later.
		{"a direct connection's configuration not made by ParseConfig", kagzi.Config{DirectConnConfig: &pgx.ConnConfig{}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Logger = quietLogger()
			c, err := kagzi.NewClient(pool, tc.cfg)
			if tc.want == 0 {
				if !errors.Is(err, kagzi.ErrInvalidArgument) || c != nil {
					t.Fatalf("NewClient = %v, %v; want ErrInvalidArgument", c, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if n := c.Connections(); n != tc.want {
				t.Fatalf("Connections() = %d, want %d", n, tc.want)
			}
		})
	}
	// Nothing was opened (the server does not even exist).
	if n := pool.Stat().TotalConns(); n != 0 {
		t.Fatalf("%d connections opened", n)
	}
	// The refusal says what to change: a smaller pool, or, when the pool has one
	// connection already, the direct connection.
	one, err := pgxpool.New(context.Background(), "postgres://app@127.0.0.1:1/app?pool_max_conns=1")
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	for _, tc := range []struct {
		pool *pgxpool.Pool
		want string
	}{{pool, "lower the pool's MaxConns"}, {one, "or set DisableDirectConn"}} {
		_, err := kagzi.NewClient(tc.pool, kagzi.Config{MaxConnections: 1, Logger: quietLogger()})
		if !errors.Is(err, kagzi.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("pool of %d, MaxConnections 1: %v, want ErrInvalidArgument saying %q", tc.pool.Config().MaxConns, err, tc.want)
		}
	}
}

// Found from outside: deployment.md offered QueryExecModeExec for PgBouncer, under which
// starts, registrations, claims and heartbeats all failed to encode their arguments;
// NewClient now refuses the modes that send arguments without their types.
func TestNewClientRefusesAPoolWhoseExecModeSendsArgumentsWithoutTheirTypes(t *testing.T) {
	t.Parallel()
	for mode, refused := range map[string]bool{
		"exec": true, "simple_protocol": true, "cache_describe": false, "describe_exec": false, "cache_statement": false,
	} {
		pool, err := pgxpool.New(context.Background(), "postgres://app@127.0.0.1:1/app?default_query_exec_mode="+mode)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		c, err := kagzi.NewClient(pool, kagzi.Config{Logger: quietLogger()})
		if refused != errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("NewClient over a pool in %s mode: %v; refused %v", mode, err, refused)
		}
		if c != nil {
			c.Close()
		}
		other, err := pgxpool.New(context.Background(), "postgres://app@127.0.0.1:1/app")
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		c, err = kagzi.NewClient(other, kagzi.Config{Logger: quietLogger(), ReadPool: pool})
		if refused != errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("NewClient with a ReadPool in %s mode: %v; refused %v", mode, err, refused)
		}
		if c != nil {
			c.Close()
		}
	}
}
