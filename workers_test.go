package kagzi_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/schema"
	"github.com/kagzi/kagzi/internal/testdb"
	"github.com/kagzi/kagzi/migrations"
)

func TestWorkerRegistersHeartbeatsAndGoesOfflineWhenItStops(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	cfg := fastWorker()
	cfg.ID = "worker-a"
	cfg.Labels = map[string]string{"region": "eu"}
	stop := runWorker(t, e.client, cfg, greet)
	eventually(t, "the worker to register", func() bool {
		_, err := e.client.GetWorker(ctx, "worker-a")
		return err == nil
	})
	run, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a heartbeat to report the completed run", func() bool {
		w, err := e.client.GetWorker(ctx, "worker-a")
		return err == nil && w.CompletedTotal == 1
	})
	w, err := e.client.GetWorker(ctx, "worker-a")
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	if w.Status != kagzi.WorkerOnline || w.Hostname != host || w.PID != os.Getpid() || w.Version != kagzi.Version ||
		w.Labels["region"] != "eu" || fmt.Sprint(w.WorkflowTypes) != "[greet]" || w.MaxConcurrent != 10 ||
		w.HeartbeatInterval != cfg.HeartbeatInterval || w.StoppedAt != nil {
		t.Fatalf("registry row %+v", w)
	}
	stop()
	w, err = e.client.GetWorker(ctx, "worker-a")
	if err != nil || w.Status != kagzi.WorkerOffline || w.StoppedAt == nil {
		t.Fatalf("after Run returned: %+v, %v; want OFFLINE with a stop time", w, err)
	}
}

func TestAStoppedWorkerStaysOfflineThoughItsLastHeartbeatRacedItsStop(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	// A heartbeat every 5 ms is often in flight when the worker
	// stops; a beat answered after the worker's OFFLINE would bring it back ONLINE.
	cfg := fastWorker()
	cfg.HeartbeatInterval = 5 * time.Millisecond
	for i := 0; i < 20; i++ {
		cfg.ID = fmt.Sprintf("racer-%d", i)
		stop := runWorker(t, e.client, cfg, greet)
		eventually(t, "the worker to beat", func() bool {
			w, err := e.client.GetWorker(ctx, cfg.ID)
			return err == nil && w.Status == kagzi.WorkerOnline && w.LastHeartbeatAt.After(w.StartedAt)
		})
		stop()
		time.Sleep(20 * time.Millisecond) // a beat left in flight would land here
		w, err := e.client.GetWorker(ctx, cfg.ID)
		if err != nil || w.Status != kagzi.WorkerOffline || w.StoppedAt == nil {
			t.Fatalf("worker %s after Run returned: %+v, %v; want OFFLINE with a stop time", cfg.ID, w, err)
		}
	}
}

func TestAWorkerStoppedAsSoonAsItStartsStaysOffline(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	// Stopped as soon as it registered, often before its liveness lock's key is
	// recorded (the keeper takes the lock on a connection of its own first): a
	// recording after the worker's OFFLINE would bring it back ONLINE.
	cfg := fastWorker()
	for i := 0; i < 20; i++ {
		cfg.ID = fmt.Sprintf("brief-%d", i)
		stop := runWorker(t, e.client, cfg, greet)
		eventually(t, "the worker to register", func() bool {
			_, err := e.client.GetWorker(ctx, cfg.ID)
			return err == nil
		})
		stop()
		time.Sleep(50 * time.Millisecond) // a recording left in flight would land here
		w, err := e.client.GetWorker(ctx, cfg.ID)
		if err != nil || w.Status != kagzi.WorkerOffline || w.StoppedAt == nil {
			t.Fatalf("worker %s after Run returned: %+v, %v; want OFFLINE with a stop time", cfg.ID, w, err)
		}
	}
}

func TestWorkerIsDrainingWhileItShutsDown(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	inStep := make(chan struct{})
	release := make(chan struct{})
	wf := kagzi.Define("drain-me", func(ctx *kagzi.Context, _ int) (int, error) {
		return kagzi.Step(ctx, "s", func(context.Context) (int, error) {
			close(inStep)
			<-release
			return 1, nil
		})
	})
	cfg := fastWorker()
	cfg.ID = "drainer"
	cfg.DrainTimeout = 10 * time.Second
	stop := runWorker(t, e.client, cfg, wf)
	if _, err := kagzi.Start(ctx, e.client, wf, 0); err != nil {
		t.Fatal(err)
	}
	<-inStep
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	eventually(t, "the worker to be DRAINING", func() bool {
		w, err := e.client.GetWorker(ctx, "drainer")
		return err == nil && w.Status == kagzi.WorkerDraining
	})
	close(release)
	<-stopped
	if w, err := e.client.GetWorker(ctx, "drainer"); err != nil || w.Status != kagzi.WorkerOffline {
		t.Fatalf("after the drain: %+v, %v; want OFFLINE", w, err)
	}
}

func TestSilentWorkersAreMarkedOfflineAndPrunedByTheOthers(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	for _, q := range []string{
		`INSERT INTO kagzi.workers (namespace, worker_id, hostname, pid, version, workflow_types, max_concurrent,
			heartbeat_interval_ms, status, last_heartbeat_at)
		 VALUES ('default', 'dead', 'h', 1, 'v', '{greet}', 1, 100, 'ONLINE', now() - interval '1 minute')`,
		`INSERT INTO kagzi.workers (namespace, worker_id, hostname, pid, version, workflow_types, max_concurrent,
			heartbeat_interval_ms, status, last_heartbeat_at, stopped_at)
		 VALUES ('default', 'long-gone', 'h', 2, 'v', '{greet}', 1, 100, 'OFFLINE', now() - interval '3 days',
			now() - interval '2 days')`,
		`INSERT INTO kagzi.workers (namespace, worker_id, hostname, pid, version, workflow_types, max_concurrent,
			heartbeat_interval_ms, status, last_heartbeat_at)
		 VALUES ('other-ns', 'dead-elsewhere', 'h', 3, 'v', '{greet}', 1, 100, 'ONLINE', now() - interval '1 minute')`,
	} {
		if _, err := e.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	runWorker(t, e.client, fastWorker(), greet)
	eventually(t, "a heartbeat to expire the silent worker", func() bool {
		w, err := e.client.GetWorker(ctx, "dead")
		return err == nil && w.Status == kagzi.WorkerOffline && w.StoppedAt != nil
	})
	eventually(t, "a heartbeat to prune the long-gone worker", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.workers WHERE worker_id = 'long-gone'`) == 0
	})
	if s := countRows(t, e.pool, `SELECT count(*) FROM kagzi.workers WHERE worker_id = 'dead-elsewhere' AND status = 'ONLINE'`); s != 1 {
		t.Fatal("a worker of another namespace was expired: namespaces must not cross")
	}
}

func TestListWorkersFiltersAndPages(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	for i := range 5 {
		cfg := fastWorker()
		cfg.ID = fmt.Sprintf("w-%d", i)
		if i%2 == 0 {
			runWorker(t, e.client, cfg, greet)
		} else {
			runWorker(t, e.client, cfg, threeSteps)
		}
	}
	eventually(t, "five workers to register", func() bool {
		p, err := e.client.ListWorkers(ctx, kagzi.WorkerFilter{})
		return err == nil && len(p.Workers) == 5
	})
	var ids []string
	token := ""
	for {
		p, err := e.client.ListWorkers(ctx, kagzi.WorkerFilter{PageSize: 2, PageToken: token, Statuses: []kagzi.WorkerStatus{kagzi.WorkerOnline}})
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range p.Workers {
			ids = append(ids, w.ID)
		}
		if token = p.NextPageToken; token == "" {
			break
		}
	}
	if fmt.Sprint(ids) != "[w-0 w-1 w-2 w-3 w-4]" {
		t.Fatalf("paged ids %v", ids)
	}
	p, err := e.client.ListWorkers(ctx, kagzi.WorkerFilter{WorkflowType: "greet"})
	if err != nil || len(p.Workers) != 3 {
		t.Fatalf("workers of type greet: %+v, %v; want 3", p, err)
	}
	other := newClient(t, e.pool, "elsewhere")
	if p, err := other.ListWorkers(ctx, kagzi.WorkerFilter{}); err != nil || len(p.Workers) != 0 {
		t.Fatalf("another namespace sees %d workers", len(p.Workers))
	}
	_, err = e.client.GetWorker(ctx, "nobody")
	mustErrorIs(t, err, kagzi.ErrNotFound)
	_, err = e.client.ListWorkers(ctx, kagzi.WorkerFilter{Statuses: []kagzi.WorkerStatus{"ASLEEP"}})
	mustErrorIs(t, err, kagzi.ErrInvalidArgument)
}

func TestHealthReportsDatabaseSchemaLocalWorkersAndPendingTypesWithoutWorker(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	cfg := fastWorker()
	cfg.ID = "healthy"
	runWorker(t, e.client, cfg, greet)
	if _, err := e.client.StartByName(ctx, "orphan-type", 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a heartbeat", func() bool {
		h := e.client.Health(ctx)
		return len(h.Workers) == 1 && !h.Workers[0].LastHeartbeat.IsZero()
	})
	h := e.client.Health(ctx)
	if !h.Healthy() || !h.DatabaseOK || !h.SchemaCurrent || h.SchemaVersion == 0 ||
		h.Workers[0].ID != "healthy" || h.Workers[0].Status != kagzi.WorkerOnline ||
		fmt.Sprint(h.PendingTypesWithoutWorker) != "[orphan-type]" {
		t.Fatalf("health %+v", h)
	}

	unmigrated, err := pgxpool.New(ctx, testdb.NewEmpty(t))
	if err != nil {
		t.Fatal(err)
	}
	defer unmigrated.Close()
	if h := newClient(t, unmigrated, "").Health(ctx); h.Healthy() || !h.DatabaseOK || h.SchemaCurrent {
		t.Fatalf("health of an unmigrated database: %+v", h)
	}
	closed, err := pgxpool.New(ctx, e.url)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, closed, "")
	closed.Close()
	if h := c.Health(ctx); h.Healthy() || h.DatabaseOK || h.DatabaseError == "" {
		t.Fatalf("health over a closed pool: %+v", h)
	}

	// A read pool that does not answer is reported, and leaves the process healthy.
	deadRead, err := pgxpool.New(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?connect_timeout=2", freePort(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer deadRead.Close()
	withRead, err := kagzi.NewClient(e.pool, kagzi.Config{ReadPool: deadRead, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer withRead.Close()
	if h := withRead.Health(ctx); !h.Healthy() || !strings.Contains(h.ReadPoolError, "unavailable") {
		t.Fatalf("health with a read pool that does not answer: %+v, want healthy with the read pool's error", h)
	}
	if h := e.client.Health(ctx); h.ReadPoolError != "" {
		t.Fatalf("health of a client without a read pool reports %q", h.ReadPoolError)
	}
	// A read pool that accepts and never answers (a dropped route) spends at most its
	// own second, not the probe's deadline: the primary is still checked (found by a
	// review: the primary was reported down).
	hungRead, err := pgxpool.New(ctx, "postgres://postgres@"+silentServer(t)+"/postgres?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer hungRead.Close()
	withHung, err := kagzi.NewClient(e.pool, kagzi.Config{ReadPool: hungRead, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer withHung.Close()
	probe, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if h := withHung.Health(probe); !h.Healthy() || !h.DatabaseOK || h.ReadPoolError == "" {
		t.Fatalf("health with a read pool that never answers: %+v, want healthy with the read pool's error", h)
	}
}

func TestConcurrentHealthChecksAnswerWithinASecondWhileTheMigrationLockIsHeld(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	// Another process migrating holds the migration lock (the session lock Migrate
	// takes, goose's) on a connection of its own.
	migrating, err := e.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer migrating.Release()
	if _, err := migrating.Exec(ctx, `SELECT pg_advisory_lock($1)`, schema.LockID); err != nil {
		t.Fatal(err)
	}
	defer migrating.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, schema.LockID)

	reports := make([]*kagzi.HealthReport, 8)
	took := make([]time.Duration, len(reports))
	var wg sync.WaitGroup
	for i := range reports {
		wg.Go(func() {
			probe, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			began := time.Now()
			reports[i] = e.client.Health(probe)
			took[i] = time.Since(began)
		})
	}
	wg.Wait()
	for i, h := range reports {
		if !h.DatabaseOK || !h.SchemaCurrent || h.DatabaseError != "" || h.SchemaVersion == 0 {
			t.Errorf("health check %d (took %v) with a 1s deadline: %+v; want a healthy database with a current schema", i, took[i], h)
		}
	}
}

func TestHealthOfANeverMigratedDatabaseIsVersionZeroAndCreatesNothing(t *testing.T) {
	t.Parallel()
	ctx := waitCtx(t)
	pool, err := pgxpool.New(ctx, testdb.NewEmpty(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	h := newClient(t, pool, "").Health(ctx)
	if !h.DatabaseOK || h.DatabaseError != "" || h.SchemaVersion != 0 || h.LatestSchemaVersion == 0 || h.SchemaCurrent {
		t.Fatalf("health of a never-migrated database: %+v; want the database OK at schema version 0 of %d, not current",
			h, h.LatestSchemaVersion)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, migrations.Schema); n != 0 {
		t.Fatalf("Health created the %s schema", migrations.Schema)
	}
	// The schema without goose's version table in it: still version 0, and still nothing created.
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+migrations.Schema); err != nil {
		t.Fatal(err)
	}
	if h := newClient(t, pool, "").Health(ctx); !h.DatabaseOK || h.DatabaseError != "" || h.SchemaVersion != 0 || h.SchemaCurrent {
		t.Fatalf("health of a database with an empty kagzi schema: %+v; want the database OK at schema version 0", h)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, migrations.Schema); n != 0 {
		t.Fatalf("Health created %d tables (goose's version table?)", n)
	}
}

func TestWorkerStopsWithErrClosedWhenItsPoolIsClosed(t *testing.T) {
	e := newEnv(t)
	pool, err := pgxpool.New(context.Background(), e.url)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, pool, "")
	w, err := kagzi.NewWorker(c, fastWorker(), greet)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(waitCtx(t)) }()
	eventually(t, "the worker to register", func() bool {
		_, err := e.client.GetWorker(context.Background(), w.ID())
		return err == nil
	})
	pool.Close()
	select {
	case err := <-done:
		mustErrorIs(t, err, kagzi.ErrClosed)
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after its pool was closed")
	}
}

func TestRunsCompleteWhileEveryDatabaseConnectionIsTerminatedRepeatedly(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	runWorker(t, e.client, fastWorker(), threeSteps)
	second := newClient(t, e.pool, "")
	runWorker(t, second, fastWorker(), threeSteps)
	admin, err := pgxpool.New(ctx, testdb.WithDatabase(testdb.ServerURL(), "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var dbName string
	if err := e.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&dbName); err != nil {
		t.Fatal(err)
	}
	var runs []*kagzi.Run[int]
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 200 {
			run, err := kagzi.Start(ctx, e.client, threeSteps, i, kagzi.WithID(fmt.Sprint("t-", i)))
			for err != nil && ctx.Err() == nil { // a start can hit a terminated connection: retry it (idempotent)
				time.Sleep(20 * time.Millisecond)
				run, err = kagzi.Start(ctx, e.client, threeSteps, i, kagzi.WithID(fmt.Sprint("t-", i)))
			}
			mu.Lock()
			runs = append(runs, run)
			mu.Unlock()
		}
	}()
	terminations := 0
	for range 5 {
		time.Sleep(150 * time.Millisecond)
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid()) t`, dbName).Scan(&n); err != nil {
			t.Fatal(err)
		}
		terminations += n
	}
	wg.Wait()
	if terminations == 0 {
		t.Fatal("no connection was terminated: the test tested nothing")
	}
	for i, run := range runs {
		var out int
		var err error
		for range 50 { // Wait itself may hit a terminated connection
			if out, err = run.Wait(ctx); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		if out != i+3 {
			t.Fatalf("run %d: output %d, want %d", i, out, i+3)
		}
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE status <> 'COMPLETED'`); n != 0 {
		t.Fatalf("%d runs did not complete after %d connection terminations", n, terminations)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.steps`); n != 3*len(runs) {
		t.Fatalf("%d recorded steps for %d runs of 3 steps: a step was recorded twice or lost", n, len(runs))
	}
}

func TestASecondRunningWorkerWithTheIDOfAnotherOfItsClientIsRefused(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	cfg := fastWorker()
	cfg.ID = "billing"
	runWorker(t, e.client, cfg, greet)
	eventually(t, "the first worker registered", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.workers WHERE worker_id = 'billing' AND status = 'ONLINE'`) == 1
	})
	second, err := kagzi.NewWorker(e.client, cfg, greet)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	mustErrorIs(t, second.Run(rctx), kagzi.ErrAlreadyExists)
	// The first goes on.
	run, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: "still"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

// A rolling deploy migrates first: the previous release runs beside a newer schema,
// and its readiness probes must not take it out.
func TestHealthOfASchemaALaterReleaseMigratedIsHealthyAndSaysSo(t *testing.T) {
	t.Parallel()
	ctx := waitCtx(t)
	pool, err := pgxpool.New(ctx, testdb.NewEmpty(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := kagzi.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, pool, "")
	latest := c.Health(ctx).LatestSchemaVersion
	if _, err := pool.Exec(ctx, `INSERT INTO `+migrations.VersionTable+` (version_id, is_applied) VALUES ($1, true)`,
		latest+1); err != nil {
		t.Fatal(err)
	}
	h := c.Health(ctx)
	if !h.Healthy() || !h.SchemaNewer || h.SchemaCurrent || h.SchemaVersion != latest+1 || h.LatestSchemaVersion != latest {
		t.Fatalf("health beside a newer schema: %+v (healthy %v); want healthy, SchemaNewer, version %d of %d",
			h, h.Healthy(), latest+1, latest)
	}
}

func TestHealthOfAnUnreachableDatabaseStillTellsTheLatestSchemaVersion(t *testing.T) {
	t.Parallel()
	ctx := waitCtx(t)
	pool, err := pgxpool.New(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	h := newClient(t, pool, "").Health(ctx)
	if h.DatabaseOK || h.Healthy() || h.LatestSchemaVersion == 0 {
		t.Fatalf("health of an unreachable database: %+v; want not OK, with the build's latest schema version", h)
	}
}

func TestRunOfAWorkerAlreadyRunningIsAnInvalidArgument(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	w, _ := startWorker(t, e.client, fastWorker(), greet)
	eventually(t, "the worker to run", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.workers WHERE status = 'ONLINE'`) == 1
	})
	mustErrorIs(t, w.Run(ctx), kagzi.ErrInvalidArgument)
}
