package kagzi_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

var replicaGreet = kagzi.Define("replica-greet", func(ctx *kagzi.Context, name string) (string, error) {
	return kagzi.Step(ctx, "greet", func(context.Context) (string, error) { return "hello " + name, nil })
})

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
	client, err := kagzi.NewClient(pool, kagzi.Config{ReadPool: replica, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	time.Sleep(7 * time.Second) // past the 5 s silence threshold
	page, err := client.ListWorkers(ctx, kagzi.WorkerFilter{})
	if err != nil || len(page.Workers) != 1 || page.Workers[0].Status != kagzi.WorkerOffline {
		t.Fatalf("ListWorkers from the caught-up replica: %+v, %v; want the silent worker OFFLINE", page, err)
	}
}
