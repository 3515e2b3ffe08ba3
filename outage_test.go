package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

// cluster is a throwaway PostgreSQL cluster of the test's own, which the test may
// stop and start again (the shared test server must stay up). It is built the way
// scripts/pg.sh builds one: initdb with trust auth, fsync off, listening on
// 127.0.0.1 only, run as the "postgres" (or "nobody") user when the test runs as
// root, since initdb refuses to run as root.
type cluster struct {
	t      *testing.T
	bindir string
	dir    string
	port   int
	runAs  string
	URL    string
	opts   []string // more server settings, "name=value"
}

// pgBindir finds a directory holding initdb and pg_ctl, or fails the test saying
// how to provide one: a test that needs its own cluster must not pass by skipping.
func pgBindir(t *testing.T) string {
	t.Helper()
	var candidates []string
	if d := os.Getenv("KAGZI_PG_BINDIR"); d != "" {
		candidates = append(candidates, d)
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		candidates = append(candidates, strings.TrimSpace(string(out)))
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			candidates = append(candidates, filepath.Dir(r))
		}
		candidates = append(candidates, filepath.Dir(p))
	}
	versions, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Sort(sort.Reverse(sort.StringSlice(versions)))
	candidates = append(candidates, versions...)
	for _, d := range candidates {
		if isExecutable(filepath.Join(d, "initdb")) && isExecutable(filepath.Join(d, "pg_ctl")) {
			return d
		}
	}
	t.Fatalf("this test needs PostgreSQL's initdb and pg_ctl to run a throwaway cluster it can stop, and found none "+
		"(looked in %v): install the PostgreSQL server package, or set KAGZI_PG_BINDIR to the directory holding them", candidates)
	return ""
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// freePort returns a TCP port nothing listens on at the moment.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// newCluster initdbs and starts a cluster, stopped and deleted when the test ends,
// with the server settings opts ("name=value") besides the usual ones.
func newCluster(t *testing.T, opts ...string) *cluster {
	t.Helper()
	c := &cluster{t: t, bindir: pgBindir(t), port: freePort(t), opts: opts}
	c.makeDir()
	c.run("initdb", "-D", c.data(), "--auth=trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync")
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
	c.Start()
	t.Cleanup(func() { c.pgctl("stop", "-m", "immediate", "-w") })
	return c
}

// makeDir makes the cluster's directory, owned by the user the server runs as.
func (c *cluster) makeDir() {
	t := c.t
	t.Helper()
	dir, err := os.MkdirTemp("", "kagzi-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	c.dir = dir
	t.Cleanup(func() { os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		for _, name := range []string{"postgres", "nobody"} {
			if u, err := user.Lookup(name); err == nil {
				uid, _ := strconv.Atoi(u.Uid)
				gid, _ := strconv.Atoi(u.Gid)
				if err := os.Chown(dir, uid, gid); err != nil {
					t.Fatal(err)
				}
				c.runAs = name
				break
			}
		}
		if c.runAs == "" {
			t.Fatal("running as root, and there is neither a 'postgres' nor a 'nobody' user to run initdb as")
		}
	}
}

// Replica makes a streaming replica of the cluster (pg_basebackup -R, a hot standby)
// and starts it; it is stopped and deleted when the test ends.
func (c *cluster) Replica() *cluster {
	t := c.t
	t.Helper()
	r := &cluster{t: t, bindir: c.bindir, port: freePort(t), opts: c.opts}
	r.makeDir()
	r.run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(c.port), "-U", "postgres", "-D", r.data(),
		"-R", "-X", "stream", "--checkpoint=fast", "--no-sync")
	r.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", r.port)
	r.Start()
	t.Cleanup(func() { r.pgctl("stop", "-m", "immediate", "-w") })
	return r
}

func (c *cluster) data() string { return filepath.Join(c.dir, "data") }

// run runs a PostgreSQL program of bindir (as runAs, if set) and fails the test
// with its output if it fails.
func (c *cluster) run(program string, args ...string) {
	c.t.Helper()
	if out, err := c.command(program, args...).CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "postgres.log"))
		c.t.Fatalf("%s %v: %v\n%s\npostgres.log:\n%s", program, args, err, out, log)
	}
}

func (c *cluster) command(program string, args ...string) *exec.Cmd {
	path := filepath.Join(c.bindir, program)
	var cmd *exec.Cmd
	if c.runAs != "" {
		cmd = exec.Command("runuser", append([]string{"-u", c.runAs, "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	cmd.Dir = c.dir
	return cmd
}

// pgctl runs pg_ctl for the cluster, ignoring its failure (for cleanups).
func (c *cluster) pgctl(args ...string) {
	_ = c.command("pg_ctl", append([]string{"-D", c.data()}, args...)...).Run()
}

// Start starts the cluster and waits until it accepts connections. fsync is off (the
// operating system keeps what a crashed server wrote), but commits wait for their WAL
// write: with synchronous_commit off, Crash lost the last committed migration.
func (c *cluster) Start() {
	c.t.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off", c.port, c.dir)
	for _, o := range c.opts {
		opts += " -c " + o
	}
	c.run("pg_ctl", "-D", c.data(), "-l", filepath.Join(c.dir, "postgres.log"), "-w", "-t", "60", "-o", opts, "start")
}

// MigratedPool opens a pool to the cluster, closed when the test ends, and migrates
// the database.
func (c *cluster) MigratedPool(ctx context.Context) *pgxpool.Pool {
	c.t.Helper()
	pool, err := pgxpool.New(ctx, c.URL)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(pool.Close)
	if err := kagzi.Migrate(ctx, pool); err != nil {
		c.t.Fatal(err)
	}
	return pool
}

// Log returns what the server logged so far.
func (c *cluster) Log() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "postgres.log"))
	return string(b)
}

// Crash stops the cluster at once, as a crash or a power cut would (no shutdown
// checkpoint; connections are cut).
func (c *cluster) Crash() {
	c.t.Helper()
	c.run("pg_ctl", "-D", c.data(), "-m", "immediate", "-w", "stop")
}

func TestStartDuringADatabaseOutageReturnsUnavailableAndTheSameWithIDWorksAfterwards(t *testing.T) {
	t.Parallel()
	pg := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := pg.MigratedPool(ctx)
	c := newClient(t, pool, "")
	defer c.Close()
	// A start before the outage leaves connections in the pool, which the outage cuts.
	if _, err := kagzi.Start(ctx, c, greet, greetIn{Name: "before"}); err != nil {
		t.Fatal(err)
	}

	pg.Crash()
	// The first starts meet the pool's cut connections (outcome unknown to the
	// client), the next ones a refused connection (the start was never sent).
	sawNotCommitted := false
	for i := range 8 {
		_, err := kagzi.Start(ctx, c, greet, greetIn{Name: "during"}, kagzi.WithID("order-1"))
		if !errors.Is(err, kagzi.ErrUnavailable) {
			t.Fatalf("start %d during the outage: %v, want an error wrapping ErrUnavailable", i+1, err)
		}
		var u *kagzi.UnavailableError
		if !errors.As(err, &u) {
			t.Fatalf("start %d during the outage: %T %v, want an *UnavailableError", i+1, err, err)
		}
		want := "the start did not commit"
		if u.MayHaveCommitted {
			want = "the start may have committed; starting again with the same WithID is safe and returns the run if it did"
		}
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("start %d: %q does not say %q", i+1, err, want)
		}
		t.Logf("start %d during the outage: %v", i+1, err)
		if !u.MayHaveCommitted {
			sawNotCommitted = true
			break
		}
	}
	if !sawNotCommitted {
		t.Fatal("every start during the outage said it may have committed; a refused connection proves it did not")
	}

	// A client whose pool never reached the server: nothing can have been sent.
	cold, err := pgxpool.New(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer cold.Close()
	_, err = kagzi.Start(ctx, newClient(t, cold, ""), greet, greetIn{Name: "cold"}, kagzi.WithID("order-2"))
	var u *kagzi.UnavailableError
	if !errors.As(err, &u) || u.MayHaveCommitted || !errors.Is(err, kagzi.ErrUnavailable) {
		t.Fatalf("start on a pool that never connected: %v, want an *UnavailableError that did not commit", err)
	}

	pg.Start()
	run, err := kagzi.Start(ctx, c, greet, greetIn{Name: "after"}, kagzi.WithID("order-1"))
	if err != nil {
		t.Fatalf("start with the same WithID after the outage: %v", err)
	}
	again, err := kagzi.Start(ctx, c, greet, greetIn{Name: "again"}, kagzi.WithID("order-1"))
	if err != nil || !again.AlreadyExists || again.RunID != run.RunID {
		t.Fatalf("second start of order-1: %+v, %v; want the run %s with AlreadyExists", again, err, run.RunID)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM kagzi.runs WHERE workflow_id = 'order-1'`); n != 1 {
		t.Fatalf("%d runs of workflow id order-1, want 1", n)
	}
}

// Found from outside: a worker started while the database was unreachable worked once
// it came back, but never registered, so the registry, RequireWorker and the quick
// takeover of its runs after its death (its liveness key) did not know it.
func TestAWorkerStartedDuringAnOutageRegistersAndRecordsItsLivenessKeyOnceTheDatabaseIsBack(t *testing.T) {
	t.Parallel()
	pg := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	setup, err := pgxpool.New(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	if err := kagzi.Migrate(ctx, setup); err != nil {
		t.Fatal(err)
	}
	setup.Close()
	pg.Crash()
	pool, err := pgxpool.New(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c := newClient(t, pool, "")
	defer c.Close()
	cfg := fastWorker()
	cfg.ID = "started-in-outage"
	_, stop := startWorker(t, c, cfg, greet)
	defer stop()
	time.Sleep(2 * cfg.HeartbeatInterval) // beats that fail: the database is down
	pg.Start()
	eventually(t, "the worker to register with its liveness key", func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.workers
			WHERE worker_id = 'started-in-outage' AND status = 'ONLINE' AND liveness_key IS NOT NULL`).Scan(&n)
		return err == nil && n == 1
	})
	if _, err := kagzi.Start(ctx, c, greet, greetIn{Name: "after"}, kagzi.RequireWorker()); err != nil {
		t.Fatalf("a start that requires a live worker, with the worker registered: %v", err)
	}
}

// Found in review: a worker that registered late, at a heartbeat, made the runs it was
// executing claimable as if a previous process had left them, and another worker ran
// their steps again.
func TestAWorkerRegisteringLateKeepsTheRunsItExecutes(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	// The registry refuses the worker at its start, as an unreachable database would.
	if _, err := e.pool.Exec(ctx, `
		CREATE TABLE refuse_registry (on_ boolean NOT NULL);
		INSERT INTO refuse_registry VALUES (true);
		CREATE FUNCTION refuse_registry() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF (SELECT on_ FROM refuse_registry) THEN RAISE EXCEPTION 'registry unavailable'; END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse_registry BEFORE INSERT OR UPDATE ON kagzi.workers
			FOR EACH ROW EXECUTE FUNCTION refuse_registry();`); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	release := make(chan struct{})
	wf := kagzi.Define("late-registered", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Step(ctx, "slow", func(c context.Context) (int, error) {
			calls.Add(1)
			select {
			case <-release:
			case <-c.Done():
				return 0, c.Err()
			}
			return n, nil
		})
	})
	cfg := fastWorker()
	cfg.ID = "late"
	runWorker(t, e.client, cfg, wf)
	run, err := kagzi.Start(ctx, e.client, wf, 7)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the step to run", func() bool { return calls.Load() == 1 })
	var holder string
	if err := e.pool.QueryRow(ctx, `SELECT locked_by FROM kagzi.runs WHERE run_id = $1`, run.RunID).Scan(&holder); err != nil || holder != "late" {
		t.Fatalf("the run is held by %q (%v), want the worker that could not register", holder, err)
	}
	other := newClient(t, e.pool, "")
	otherCfg := fastWorker()
	otherCfg.ID = "other"
	runWorker(t, other, otherCfg, wf) // would take a run that is freed
	if _, err := e.pool.Exec(ctx, `UPDATE refuse_registry SET on_ = false`); err != nil {
		t.Fatal(err)
	}
	eventually(t, "both workers to register", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.workers WHERE status = 'ONLINE'`) == 2
	})
	time.Sleep(3 * fastWorker().PollInterval) // a freed run would be claimed by now
	close(release)
	if out, err := run.Wait(ctx); err != nil || out != 7 {
		t.Fatalf("the run: %d, %v", out, err)
	}
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 1 || info.Takeovers != 0 {
		t.Fatalf("the step ran %d times and the run was taken over %d times (held by %s), want once and never",
			calls.Load(), info.Takeovers, holder)
	}
}

// A Wait whose looks at its run meet a database that is down or restarting goes on
// looking until the run ends (found from outside: 21 of 40 Waits returned ErrUnavailable
// during a restart while their runs went on); a Wait whose context ends while the
// database is down says both.
func TestAWaitRidesOutADatabaseRestartAndReturnsTheRunsResult(t *testing.T) {
	t.Parallel()
	pg := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := pg.MigratedPool(ctx)
	c := newClient(t, pool, "")
	defer c.Close()
	run, err := kagzi.Start(ctx, c, greet, greetIn{Name: "through"}) // no worker yet: it waits PENDING
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		out greetOut
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := run.Wait(ctx)
		done <- result{out, err}
	}()
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	shortDone := make(chan error, 1)
	go func() {
		_, err := run.Wait(short)
		shortDone <- err
	}()
	time.Sleep(100 * time.Millisecond)
	pg.Crash()
	if err := <-shortDone; !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, kagzi.ErrUnavailable) {
		t.Errorf("a Wait whose deadline passed while the database was down: %v, want DeadlineExceeded and ErrUnavailable", err)
	}
	select {
	case r := <-done:
		t.Fatalf("the Wait returned while the database was down: %v, %v", r.out, r.err)
	case <-time.After(2 * time.Second):
	}
	pg.Start()
	runWorker(t, c, fastWorker(), greet)
	r := <-done
	if r.err != nil || r.out.Greeting != "hello through" {
		t.Fatalf("the Wait across the restart: %+v, %v; want the run's result", r.out, r.err)
	}
}
