package store

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/kagzi/kagzi/internal/testdb"
)

func TestAHeartbeatDoesNotWaitForARunWhoseRowIsBeingWrittenAndKeepsItHeld(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	busy := runningRun(t, pool, 1, false)
	free := runningRun(t, pool, 1, false)
	taken := runningRun(t, pool, 2, false) // claimed again since: epoch 1 is stale
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// Another transaction writes the busy run (the worker's own committer ending it,
	// say) and has not committed yet.
	if _, err := tx.Exec(ctx, `UPDATE kagzi.runs SET updated_at = now() WHERE run_id = $1`, busy); err != nil {
		t.Fatal(err)
	}
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := Heartbeat(bctx, pool, WorkerBeat{Namespace: "default", WorkerID: "w"},
		[]Fence{{RunID: busy, Epoch: 1}, {RunID: free, Epoch: 1}, {RunID: taken, Epoch: 1}}, time.Hour)
	if err != nil {
		t.Fatalf("heartbeat: %v (it waited for the busy row?)", err)
	}
	got := map[uuid.UUID]bool{}
	for _, r := range res {
		got[r.RunID] = r.Extended
	}
	if ext, ok := got[busy]; !ok || ext {
		t.Fatalf("busy run in result: %t, extended: %t; want held, not extended", ok, ext)
	}
	if ext, ok := got[free]; !ok || !ext {
		t.Fatalf("free run in result: %t, extended: %t; want extended", ok, ext)
	}
	if _, ok := got[taken]; ok {
		t.Fatal("a run held under another epoch came back as held")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var inAnHour bool
	if err := pool.QueryRow(ctx, `SELECT available_at > now() + interval '50 minutes' FROM kagzi.runs WHERE run_id = $1`,
		free).Scan(&inAnHour); err != nil || !inAnHour {
		t.Fatalf("free run's lease extended by an hour: %t (%v)", inAnHour, err)
	}
	if err := pool.QueryRow(ctx, `SELECT available_at > now() + interval '50 minutes' FROM kagzi.runs WHERE run_id = $1`,
		busy).Scan(&inAnHour); err != nil || inAnHour {
		t.Fatalf("busy run's lease extended: %t (%v), want its old end", inAnHour, err)
	}
}

func TestAReapTellsWhetherAnotherLiveWorkerReportedRunsInHand(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	worker := func(id, status string, active int) {
		t.Helper()
		if _, err := pool.Exec(ctx, `INSERT INTO kagzi.workers (namespace, worker_id, hostname, pid, version,
			workflow_types, max_concurrent, heartbeat_interval_ms, status, active_runs)
			VALUES ('default', $1, 'h', 1, 'v', '{wf}', 10, 1000, $2, $3)`, id, status, active); err != nil {
			t.Fatal(err)
		}
	}
	busy := func() bool {
		t.Helper()
		r, err := ReapDeadWorkers(ctx, pool, "default", "me", 1)
		b := r.Busy
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	worker("me", "ONLINE", 5) // the reaper's own runs are not a peer's
	worker("idle", "ONLINE", 0)
	worker("gone", "OFFLINE", 3) // an OFFLINE worker's last count is not runs in hand
	if busy() {
		t.Fatal("busy with only the reaper itself, an idle worker and an OFFLINE one holding runs")
	}
	worker("peer", "ONLINE", 2)
	if !busy() {
		t.Fatal("not busy while another live worker reported runs in hand")
	}
}
