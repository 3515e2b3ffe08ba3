package kagzi_test

import (
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/ui"
)

var replicaGreet = kagzi.Define("replica-greet", func(ctx *kagzi.Context, name string) (string, error) {
	return kagzi.Step(ctx, "greet", func(context.Context) (string, error) { return "hello " + name, nil })
})

// replicaHold runs until its worker stops: a healthy run that stays RUNNING, its lease
// extended by every heartbeat.
var replicaHold = kagzi.Define("replica-hold", func(ctx *kagzi.Context, n int) (int, error) {
	return kagzi.Step(ctx, "hold", func(c context.Context) (int, error) {
		<-c.Done()
		return 0, c.Err()
	})
})

// readerPool opens a pool on the standby as a role that may read Kagzi's tables but
// not the server's statistics (no pg_read_all_stats): it sees the WAL receiver's row
// without its status. The role is made on the primary and arrives by replication.
func readerPool(t *testing.T, ctx context.Context, primary *pgxpool.Pool, standby *cluster) *pgxpool.Pool {
	t.Helper()
	if _, err := primary.Exec(ctx, `CREATE ROLE kagzi_reader LOGIN;
		GRANT USAGE ON SCHEMA kagzi TO kagzi_reader;
		GRANT SELECT ON ALL TABLES IN SCHEMA kagzi TO kagzi_reader`); err != nil {
		t.Fatal(err)
	}
	reader, err := pgxpool.New(ctx, strings.Replace(standby.URL, "postgres@", "kagzi_reader@", 1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reader.Close)
	eventually(t, "the reader role to be replicated", func() bool { return reader.Ping(ctx) == nil })
	var privileged bool
	if err := reader.QueryRow(ctx, `SELECT pg_has_role('pg_read_all_stats', 'USAGE')`).Scan(&privileged); err != nil || privileged {
		t.Fatalf("the reader has pg_read_all_stats: %v, %v; want a role without it", privileged, err)
	}
	return reader
}

func TestListingsReadFromTheReadPoolReplicaWhileWritesAndFreshReadsStayOnThePrimary(t *testing.T) {
	t.Parallel()
	primary := newCluster(t, "wal_level=replica")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := primary.MigratedPool(ctx)
	standby := primary.Replica()
	replica, err := pgxpool.New(ctx, standby.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close()
	var recovering bool
	if err := replica.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&recovering); err != nil || !recovering {
		t.Fatalf("the replica is in recovery: %v, %v; want a hot standby", recovering, err)
	}
	client, err := kagzi.NewClient(pool, kagzi.Config{ReadPool: replica, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// Stopped before the deferred closes of its pool (else, on a loaded box, it can
	// notice the closed pool first and end with ErrClosed).
	defer runWorker(t, client, fastWorker(), replicaGreet)()

	// A run committed on the primary appears in ListRuns once replicated.
	first, err := kagzi.Start(ctx, client, replicaGreet, "first")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := first.Wait(ctx); err != nil || out != "hello first" {
		t.Fatalf("Wait = %q, %v", out, err)
	}
	eventually(t, "the completed run to be listed from the replica", func() bool {
		page, err := client.ListRuns(ctx, kagzi.RunFilter{Statuses: []kagzi.RunStatus{kagzi.StatusCompleted}})
		if err != nil {
			t.Fatal(err)
		}
		return len(page.Runs) == 1 && page.Runs[0].RunID == first.RunID
	})

	// With the replica's replay paused, a run started now is on the primary only:
	// GetRun (a fresh read) sees it, ListRuns (the replica) does not, and a bulk
	// cancel (which lists the runs it changes on the primary) finds it.
	if _, err := replica.Exec(ctx, `SELECT pg_wal_replay_pause()`); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the replay to pause", func() bool {
		var state string
		if err := replica.QueryRow(ctx, `SELECT pg_get_wal_replay_pause_state()`).Scan(&state); err != nil {
			t.Fatal(err)
		}
		return state == "paused"
	})
	late, err := kagzi.Start(ctx, client, replicaGreet, "late", kagzi.WithStartAt(time.Now().Add(time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := client.GetRun(ctx, late.RunID); err != nil || info.Status != kagzi.StatusPending {
		t.Fatalf("GetRun of the new run on the primary = %+v, %v; want it PENDING", info, err)
	}
	page, err := client.ListRuns(ctx, kagzi.RunFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Runs) != 1 || page.Runs[0].RunID != first.RunID {
		t.Fatalf("ListRuns while the replica's replay is paused lists %d runs, want only the replicated one", len(page.Runs))
	}
	// The worker goes on beating on the primary: the replica, its replay paused for
	// longer than the registry's silence threshold (5 s), judges the heartbeats it has
	// as of its data, and lists the worker ONLINE (found from outside: OFFLINE).
	time.Sleep(6 * time.Second)
	if workers, err := client.ListWorkers(ctx, kagzi.WorkerFilter{}); err != nil || len(workers.Workers) != 1 ||
		workers.Workers[0].Status != kagzi.WorkerOnline {
		t.Fatalf("ListWorkers from the paused replica = %+v, %v; want the live worker ONLINE", workers, err)
	}
	res, err := client.CancelRuns(ctx, kagzi.RunFilter{Statuses: []kagzi.RunStatus{kagzi.StatusPending}})
	if err != nil || res.Changed != 1 {
		t.Fatalf("CancelRuns of the pending runs = %+v, %v; want the new run cancelled (listed on the primary)", res, err)
	}
	if _, err := replica.Exec(ctx, `SELECT pg_wal_replay_resume()`); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the cancelled run to be listed from the replica", func() bool {
		page, err := client.ListRuns(ctx, kagzi.RunFilter{Statuses: []kagzi.RunStatus{kagzi.StatusCancelled}})
		if err != nil {
			t.Fatal(err)
		}
		return len(page.Runs) == 1 && page.Runs[0].RunID == late.RunID
	})
	// The other listings read the replica too, and work on a read-only server.
	if workers, err := client.ListWorkers(ctx, kagzi.WorkerFilter{}); err != nil || len(workers.Workers) != 1 {
		t.Fatalf("ListWorkers from the replica = %v, %v; want the worker", workers, err)
	}
	if _, err := client.ListSchedules(ctx, kagzi.ScheduleFilter{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.ListSignals(ctx, first.RunID, kagzi.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.ListEvents(ctx, first.RunID, kagzi.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.QueueStats(ctx); err != nil {
		t.Fatal(err)
	}
}

// A replica that replayed everything it received judges the workers' silence by the
// clock: with every worker dead the primary commits nothing, the last replayed commit
// stays behind, and judging by it kept a dead worker ONLINE on the replica for as long
// as the primary stayed idle (found by a review).
func TestACaughtUpReplicaListsAWorkerSilentPastTheThresholdOffline(t *testing.T) {
	t.Parallel()
	primary := newCluster(t, "wal_level=replica")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := primary.MigratedPool(ctx)
	standby := primary.Replica()
	replica, err := pgxpool.New(ctx, standby.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close()
	// The last heartbeat of a worker that then died (no stop recorded, no reaper).
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.workers (namespace, worker_id, hostname, pid, version,
		workflow_types, max_concurrent, heartbeat_interval_ms, status, active_runs)
		VALUES ('default', 'dead', 'h', 1, 'v', '{wf}', 10, 1000, 'ONLINE', 0)`); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the worker to be replicated", func() bool {
		var n int
		_ = replica.QueryRow(ctx, `SELECT count(*) FROM kagzi.workers`).Scan(&n)
		return n == 1
	})
	// A role without pg_read_all_stats does not see whether the WAL receiver streams,
	// only that it runs: that counts as streaming, and the replica as current.
	reader := readerPool(t, ctx, pool, standby)
	for name, readPool := range map[string]*pgxpool.Pool{"superuser": replica, "without pg_read_all_stats": reader} {
		client, err := kagzi.NewClient(pool, kagzi.Config{ReadPool: readPool, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		eventually(t, "the worker to be silent past the 5 s threshold by the clock", func() bool {
			var silent bool
			_ = readPool.QueryRow(ctx, `SELECT now() > max(last_heartbeat_at) + interval '6 seconds' FROM kagzi.workers`).Scan(&silent)
			return silent
		})
		page, err := client.ListWorkers(ctx, kagzi.WorkerFilter{})
		if err != nil || len(page.Workers) != 1 || page.Workers[0].Status != kagzi.WorkerOffline {
			t.Fatalf("ListWorkers from the caught-up replica (%s): %+v, %v; want the silent worker OFFLINE", name, page, err)
		}
	}
}

// A replica cut off its primary (a partition, a primary that is down) replays all it
// received and then receives nothing: its receive and replay positions are equal, as a
// caught-up replica's are, but its data stops at its last replayed commit. Judged by
// the clock, it listed a worker that went on beating on the primary OFFLINE ~6 s after
// the cut (found from outside); judged as of its data, it lists it ONLINE, read by a
// role that sees the WAL receiver's status and by one that does not.
func TestAReplicaCutOffItsPrimaryListsALiveWorkerOnline(t *testing.T) {
	t.Parallel()
	primary := newCluster(t, "wal_level=replica")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := primary.MigratedPool(ctx)
	standby := primary.Replica()
	replica, err := pgxpool.New(ctx, standby.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close()
	reader := readerPool(t, ctx, pool, standby)
	clients := map[string]*kagzi.Client{}
	for name, readPool := range map[string]*pgxpool.Pool{"superuser": replica, "without pg_read_all_stats": reader} {
		client, err := kagzi.NewClient(pool, kagzi.Config{ReadPool: readPool, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		clients[name] = client
	}
	client := clients["superuser"]
	w, stop := startWorker(t, client, fastWorker(), replicaGreet)
	defer stop()
	eventually(t, "the worker to be listed from the replica", func() bool {
		page, err := client.ListWorkers(ctx, kagzi.WorkerFilter{})
		return err == nil && len(page.Workers) == 1
	})

	// Point the replica at a port nothing listens on: the startup process restarts its
	// WAL receiver with the new setting, which cannot connect.
	if _, err := replica.Exec(ctx, fmt.Sprintf(`ALTER SYSTEM SET primary_conninfo = 'host=127.0.0.1 port=%d user=postgres'`,
		freePort(t))); err != nil {
		t.Fatal(err)
	}
	if _, err := replica.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the replica's WAL receiver to stop streaming", func() bool {
		var streaming bool
		if err := replica.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_wal_receiver WHERE status = 'streaming')`).
			Scan(&streaming); err != nil {
			t.Fatal(err)
		}
		return !streaming
	})
	eventually(t, "the worker's last replicated heartbeat to be past the 5 s silence threshold by the clock", func() bool {
		var silent bool
		if err := replica.QueryRow(ctx, `SELECT now() > max(last_heartbeat_at) + interval '6 seconds' FROM kagzi.workers`).
			Scan(&silent); err != nil {
			t.Fatal(err)
		}
		return silent
	})
	for name, c := range clients {
		page, err := c.ListWorkers(ctx, kagzi.WorkerFilter{})
		if err != nil || len(page.Workers) != 1 || page.Workers[0].Status != kagzi.WorkerOnline {
			t.Errorf("ListWorkers from the cut-off replica (%s) = %+v, %v; want the live worker ONLINE", name, page, err)
		}
	}
	if info, err := client.GetWorker(ctx, w.ID()); err != nil || info.Status != kagzi.WorkerOnline {
		t.Fatalf("GetWorker on the primary = %+v, %v; want the worker ONLINE (it goes on beating)", info, err)
	}
}

// A replica whose replay is behind judges leases as of its data. With its replay
// paused until every lease it holds has passed by the clock, QueueStats (kagziotel's
// gauges) read from it counted healthy RUNNING runs, heartbeated on the primary, as
// ready, and the console's overview listed them as stuck (found from outside): they
// are running, and none is stuck.
func TestALaggingReplicaCountsHealthyRunsRunningNotReadyOrStuck(t *testing.T) {
	t.Parallel()
	primary := newCluster(t, "wal_level=replica")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := primary.MigratedPool(ctx)
	standby := primary.Replica()
	replica, err := pgxpool.New(ctx, standby.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close()
	client, err := kagzi.NewClient(pool, kagzi.Config{ReadPool: replica, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	cfg := fastWorker()
	cfg.LeaseDuration = 5 * time.Second // beats every 250 ms: a loaded box does not lose the leases
	defer runWorker(t, client, cfg, replicaHold)()
	var runs []string
	for i := range 3 {
		run, err := kagzi.Start(ctx, client, replicaHold, i)
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, run.RunID)
	}
	eventually(t, "the replica to list the runs RUNNING", func() bool {
		page, err := client.ListRuns(ctx, kagzi.RunFilter{Statuses: []kagzi.RunStatus{kagzi.StatusRunning}})
		return err == nil && len(page.Runs) == 3
	})

	if _, err := replica.Exec(ctx, `SELECT pg_wal_replay_pause()`); err != nil {
		t.Fatal(err)
	}
	defer replica.Exec(context.Background(), `SELECT pg_wal_replay_resume()`)
	eventually(t, "the replay to pause", func() bool {
		var state string
		if err := replica.QueryRow(ctx, `SELECT pg_get_wal_replay_pause_state()`).Scan(&state); err != nil {
			t.Fatal(err)
		}
		return state == "paused"
	})
	eventually(t, "every lease the replica holds to pass by the clock", func() bool {
		var passed bool
		if err := replica.QueryRow(ctx, `SELECT now() > max(available_at) FROM kagzi.runs WHERE status = 'RUNNING'`).
			Scan(&passed); err != nil {
			t.Fatal(err)
		}
		return passed
	})

	stats, err := client.QueueStats(ctx)
	if err != nil || len(stats) != 1 || stats[0].Running != 3 || stats[0].Ready != 0 || stats[0].OldestReady != 0 {
		t.Errorf("QueueStats from the lagging replica = %+v, %v; want the 3 runs running, none ready", stats, err)
	}
	rec := httptest.NewRecorder()
	ui.Handler(client, ui.Options{}).ServeHTTP(rec, httptest.NewRequest("GET", "/n/default/", nil))
	body, _ := io.ReadAll(rec.Result().Body)
	_, stuck, _ := strings.Cut(string(body), `id="stuck"`)
	if rec.Code != 200 || !strings.Contains(stuck, "None: no run is RUNNING past its lease") {
		t.Errorf("the console's overview from the lagging replica (%d) lists stuck runs; want none:\n%s", rec.Code, stuck)
	}
	for _, id := range runs {
		if info, err := client.GetRun(ctx, id); err != nil || info.Status != kagzi.StatusRunning {
			t.Fatalf("GetRun on the primary = %+v, %v; want the run RUNNING", info, err)
		}
	}
}
