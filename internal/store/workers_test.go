package store

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

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

// Found in a chaos run: two workers that each looked stale to the other each locked
// the other's row to mark it OFFLINE and waited for their own: every beat deadlocked
// (or timed out) for as long as they kept looking stale, and their runs' leases ran out.
func TestAHeartbeatDoesNotWaitForItsOwnRowThatAnotherBeatIsMarkingOffline(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		if _, err := RegisterWorker(ctx, pool, WorkerRow{Namespace: "default", WorkerID: id, WorkflowTypes: []string{"t"},
			WorkflowVersions: []string{""}, MaxConcurrent: 1, HeartbeatInterval: time.Second}, nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	// Both stopped beating a while ago, as seen from each other.
	if _, err := pool.Exec(ctx, `UPDATE kagzi.workers SET last_heartbeat_at = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	// Worker a's beat, not yet committed: it refreshed its own row and marked b OFFLINE.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := Heartbeat(ctx, tx, WorkerBeat{Namespace: "default", WorkerID: "a"}, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	// Worker b's beat goes through meanwhile: it neither waits for its own row, held by
	// a's beat, nor for a's.
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := Heartbeat(bctx, pool, WorkerBeat{Namespace: "default", WorkerID: "b"}, nil, time.Hour); err != nil {
		t.Fatalf("b's beat while a's held b's row: %v, want it through without waiting", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// b's next beat, its row free again, brings it back ONLINE.
	if _, err := Heartbeat(ctx, pool, WorkerBeat{Namespace: "default", WorkerID: "b"}, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	w, err := GetWorker(ctx, pool, "default", "b")
	if err != nil || w.Status != "ONLINE" {
		t.Fatalf("b after its next beat: %+v, %v; want ONLINE", w, err)
	}
}

// Found from outside: a live worker whose sessions were terminated looked dead (its
// liveness lock released) and was reaped, but its runs were only made claimable: it
// went on executing them, its heartbeat renewed their leases and its writes were
// accepted, while no concurrency limit counted them in between. A reap fences them.
func TestAReapFencesTheRunsItFreesSoTheirWorkerIfAliveCanNeitherWriteNorRenewThem(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	deadWorker(t, pool)
	run := runningRun(t, pool, 1, false) // locked by w, epoch 1
	r, err := ReapDeadWorkers(ctx, pool, "default", "me", 1)
	if err != nil || r.Workers != 1 || r.Runs != 1 {
		t.Fatalf("reap: %+v, %v; want worker w and its run", r, err)
	}
	res, err := Heartbeat(ctx, pool, WorkerBeat{Namespace: "default", WorkerID: "w"}, []Fence{{RunID: run, Epoch: 1}}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 0 {
		t.Fatalf("the reaped worker's heartbeat still holds its run: %+v", res)
	}
	var claimable bool
	if err := pool.QueryRow(ctx, `SELECT available_at <= now() FROM kagzi.runs WHERE run_id = $1`, run).Scan(&claimable); err != nil || !claimable {
		t.Fatalf("the reaped run is claimable: %t (%v)", claimable, err)
	}
}

// A worker registering under the id of an earlier process frees that process's runs
// as a reap does, fenced: were that process still alive (a paused VM, two processes
// given one fixed id), its heartbeat must not renew them.
func TestRegisteringUnderAnEarlierProcesssIDFencesTheRunsItFrees(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	run := runningRun(t, pool, 1, false) // locked by w, epoch 1
	if _, err := RegisterWorker(ctx, pool, WorkerRow{Namespace: "default", WorkerID: "w", WorkflowTypes: []string{"wf"},
		WorkflowVersions: []string{""}, MaxConcurrent: 1, HeartbeatInterval: time.Second}, nil, 0); err != nil {
		t.Fatal(err)
	}
	res, err := Heartbeat(ctx, pool, WorkerBeat{Namespace: "default", WorkerID: "w"}, []Fence{{RunID: run, Epoch: 1}}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 0 {
		t.Fatalf("the earlier process's heartbeat still holds its run: %+v", res)
	}
}

// A run freed by a reap (its worker's sessions ended) or by a registration under its
// worker's id gives its type slot back at once: the free fences it (no renewal of it
// can be in flight), so the claims' grace past a lapsed holder's lease end
// (slotGraceSQL) is not for it; the claim that takes it over holds the slot again.
func TestARunFreedByAReapOrARegistrationGivesItsTypeSlotBackAtOnce(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, concurrency) VALUES ('default', 'wf', 1)`); err != nil {
		t.Fatal(err)
	}
	for _, how := range []string{"reap", "registration"} {
		if _, err := pool.Exec(ctx, `DELETE FROM kagzi.workers; DELETE FROM kagzi.runs;
			INSERT INTO kagzi.workers (namespace, worker_id, hostname, pid, version,
			workflow_types, max_concurrent, heartbeat_interval_ms, status, active_runs, liveness_key)
			VALUES ('default', 'w', 'h', 1, 'v', '{wf}', 10, 1000, 'ONLINE', 1, 4242)`); err != nil {
			t.Fatal(err)
		}
		run := runningRun(t, pool, 1, false) // locked by w, epoch 1
		if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET holds_type_slot = true WHERE run_id = $1`, run); err != nil {
			t.Fatal(err)
		}
		freeDeadWorkersRun(t, pool, how)
		for _, short := range []bool{false, true} {
			c := testClaimer("wf")
			c.Versions = []string{""}
			c.WorkerID = "other"
			c.Floors, c.KeyFloors = NewFloors(), NewFloors()
			if short {
				c.Limited = map[string]bool{"wf": true}
			}
			got, _, err := ClaimRuns(ctx, pool, c, 10)
			if err != nil || len(got) != 1 || got[0].RunID != run || !got[0].HoldsSlot {
				t.Fatalf("%s, short %t: a claim right after the free got %+v (%v), want the freed run, holding the slot",
					how, short, got, err)
			}
			if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET available_at = now(), lease_epoch = lease_epoch + 1,
				holds_type_slot = false WHERE run_id = $1`, run); err != nil { // freed again, for the short way
				t.Fatal(err)
			}
		}
	}
}

// A registration under the id of a worker whose liveness lock a live session holds
// (two processes given one id) tells so, for the warning; one under the id of a dead
// process, or of the registering worker's own key, does not.
func TestRegisteringUnderALiveWorkersIDTellsThatItWasLive(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	row := WorkerRow{Namespace: "default", WorkerID: "w", WorkflowTypes: []string{"wf"},
		WorkflowVersions: []string{""}, MaxConcurrent: 1, HeartbeatInterval: time.Second}
	if _, err := RegisterWorker(ctx, pool, row, nil, 0); err != nil {
		t.Fatal(err)
	}
	pconn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn := pconn.Hijack() // the other process's session
	const key = 77
	if ok, err := LockLiveness(ctx, conn, key); err != nil || !ok {
		t.Fatalf("lock: %v %v", ok, err)
	}
	if err := SetLivenessKey(ctx, pool, "default", "w", key); err != nil {
		t.Fatal(err)
	}
	if live, err := RegisterWorker(ctx, pool, row, nil, key); err != nil || live {
		t.Fatalf("registering with its own key: live %v, %v (want false)", live, err)
	}
	if err := SetLivenessKey(ctx, pool, "default", "w", key); err != nil {
		t.Fatal(err)
	}
	if live, err := RegisterWorker(ctx, pool, row, nil, 78); err != nil || !live {
		t.Fatalf("registering under a live worker's id: live %v, %v (want true)", live, err)
	}
	if err := SetLivenessKey(ctx, pool, "default", "w", key); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx) // its session, and the lock, end
	eventuallyStore(t, "a registration after the session ended not told live", func() bool {
		live, err := RegisterWorker(ctx, pool, row, nil, 79)
		if err == nil && !live {
			return true
		}
		_ = SetLivenessKey(ctx, pool, "default", "w", key)
		return false
	})
}

// A run freed by a reap is work begun: it takes back its place in the queue, and the
// claims take it before the runs started after it. Freed at now(), a run of a type at
// its concurrency limit waited behind the whole backlog (28 s after a kill -9 with 9
// runs queued).
func TestARunFreedByAReapIsClaimedBeforeTheRunsStartedAfterIt(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	deadWorker(t, pool)
	begun := runningRun(t, pool, 1, false) // locked by w, the dead worker
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET created_at = now() - interval '20 seconds',
		started_at = now() - interval '1 second' WHERE run_id = $1`, begun); err != nil {
		t.Fatal(err)
	}
	queued := uuid.New() // started after it, queued since (and claimable before the reap)
	if err := InsertRuns(ctx, pool, "default", "wf", nil, []uuid.UUID{queued}, [][]byte{[]byte(`1`)}, [][]byte{nil},
		time.Now().Add(-10*time.Second), nil); err != nil {
		t.Fatal(err)
	}
	if r, err := ReapDeadWorkers(ctx, pool, "default", "me", 1); err != nil || r.Runs != 1 {
		t.Fatalf("reap: %+v, %v; want the dead worker's run", r, err)
	}
	claimer := Claimer{Namespace: "default", Types: []string{"wf"}, Versions: []string{""}, WorkerID: "other",
		Lease: time.Minute, Cursors: map[string]string{}}
	claimed, _, err := ClaimRuns(ctx, pool, claimer, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(claimed) != 1 || claimed[0].RunID != begun {
		t.Fatalf("the claim of one run took %+v, want the run begun before the queued one (%s)", claimed, begun)
	}
}

// deadWorker registers worker w, ONLINE with a liveness key no session holds: a
// reap finds it dead.
func deadWorker(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `INSERT INTO kagzi.workers (namespace, worker_id, hostname, pid,
		version, workflow_types, max_concurrent, heartbeat_interval_ms, status, active_runs, liveness_key)
		VALUES ('default', 'w', 'h', 1, 'v', '{wf}', 10, 1000, 'ONLINE', 1, 4242)`); err != nil {
		t.Fatal(err)
	}
}

// A reap, and a registration under a dead worker's id, stamp the epoch they gave a
// freed run on its record of executing alone (the root package's runs alone), and on
// no other step: the claim that takes the run over tells that reap from a claim that
// never ran it.
func TestAReapStampsTheEpochItGaveOnTheRecordOfARunAlone(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	stamp := func(run uuid.UUID, key string) (reaped *int64) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT (output->>'reaped')::bigint FROM kagzi.steps WHERE run_id = $1 AND step_key = $2`,
			run, key).Scan(&reaped); err != nil {
			t.Fatal(err)
		}
		return reaped
	}
	for _, by := range []string{"reap", "registration"} {
		run := runningRun(t, pool, 1, false) // locked by w, epoch 1
		for _, key := range []string{"kagzi#alone", "step#1"} {
			if err := RecordMarker(ctx, pool, ResultStep{Fence: Fence{RunID: run, Epoch: 1}, Key: key,
				Output: []byte(`{"alone": true, "takeovers": 1, "epoch": 1}`)}); err != nil {
				t.Fatal(err)
			}
		}
		if by == "reap" {
			deadWorker(t, pool)
		}
		freeDeadWorkersRun(t, pool, by)
		if got := stamp(run, "kagzi#alone"); got == nil || *got != 2 {
			t.Fatalf("after a %s the record of the run alone says reaped %v, want epoch 2", by, got)
		}
		if got := stamp(run, "step#1"); got != nil {
			t.Fatalf("after a %s another step says reaped %v", by, *got)
		}
		if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'COMPLETED', locked_by = NULL WHERE run_id = $1`, run); err != nil {
			t.Fatal(err)
		}
	}
}

// A parked run is PENDING and claimable only after the delay; Ancestors walks a run's
// parents up to the root.
func TestAParkedRunWaitsItsDelayAndAncestorsWalkUpToTheRoot(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	run := runningRun(t, pool, 1, false)
	if err := ParkRuns(ctx, pool, []Fence{{RunID: run, Epoch: 1}}, time.Hour); err != nil {
		t.Fatal(err)
	}
	var status string
	var later bool
	if err := pool.QueryRow(ctx, `SELECT status, available_at > now() + interval '59 minutes' FROM kagzi.runs WHERE run_id = $1`,
		run).Scan(&status, &later); err != nil || status != "PENDING" || !later {
		t.Fatalf("the parked run: %s, claimable in an hour %v (%v)", status, later, err)
	}
	parent, child := runningRun(t, pool, 1, false), runningRun(t, pool, 1, false)
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET parent_run_id = $2 WHERE run_id = $1`, parent, run); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET parent_run_id = $2 WHERE run_id = $1`, child, parent); err != nil {
		t.Fatal(err)
	}
	got, err := Ancestors(ctx, pool, child)
	if err != nil || len(got) != 2 || got[0] != parent || got[1] != run {
		t.Fatalf("the child's ancestors: %v, %v; want its parent then the root", got, err)
	}
	if got, err := Ancestors(ctx, pool, run); err != nil || len(got) != 0 {
		t.Fatalf("the root's ancestors: %v, %v; want none", got, err)
	}
}

// freeDeadWorkersRun frees the one run of worker w, whose process died: by a reap
// (how "reap"; w's liveness lock must be free), or by a worker registering under w's
// id (any other how).
func freeDeadWorkersRun(t *testing.T, pool *pgxpool.Pool, how string) {
	t.Helper()
	ctx := context.Background()
	if how == "reap" {
		if r, err := ReapDeadWorkers(ctx, pool, "default", "me", 1); err != nil || r.Runs != 1 {
			t.Fatalf("reap: %+v, %v", r, err)
		}
		return
	}
	if _, err := RegisterWorker(ctx, pool, WorkerRow{Namespace: "default", WorkerID: "w", WorkflowTypes: []string{"wf"},
		WorkflowVersions: []string{""}, MaxConcurrent: 1, HeartbeatInterval: time.Second}, nil, 0); err != nil {
		t.Fatal(err)
	}
}

// Found from outside: a worker restarted under its fixed id took over its previous
// process's row with that process's liveness key, whose lock no session held, and a
// look for dead workers before the new process recorded its own key took it for dead
// and freed the runs it had just claimed (their bodies ran twice, a takeover counted).
func TestRegisteringUnderADeadProcesssIDLeavesNoKeyALookForDeadWorkersWouldReap(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	row := WorkerRow{Namespace: "default", WorkerID: "pod-0", WorkflowTypes: []string{"wf"},
		WorkflowVersions: []string{""}, MaxConcurrent: 1, HeartbeatInterval: time.Second}
	if _, err := RegisterWorker(ctx, pool, row, nil, 0); err != nil {
		t.Fatal(err)
	}
	if err := SetLivenessKey(ctx, pool, "default", "pod-0", 91); err != nil { // the dead process's: nobody locks it
		t.Fatal(err)
	}
	if _, err := RegisterWorker(ctx, pool, row, nil, 92); err != nil { // the new process, before it locks 92
		t.Fatal(err)
	}
	if r, err := ReapDeadWorkers(ctx, pool, "default", "me", 1); err != nil || r.Workers != 0 {
		t.Fatalf("reap after the new process registered: %+v, %v; want no worker taken for dead", r, err)
	}
	var status string
	if err := pool.QueryRow(ctx, `SELECT status FROM kagzi.workers WHERE worker_id = 'pod-0'`).Scan(&status); err != nil || status != "ONLINE" {
		t.Fatalf("status %q, %v; want ONLINE", status, err)
	}

	// A late registration (at a heartbeat) after the worker recorded its own key keeps
	// it: the worker stays one a look for dead workers can see die.
	if err := SetLivenessKey(ctx, pool, "default", "pod-0", 92); err != nil {
		t.Fatal(err)
	}
	if _, err := RegisterWorker(ctx, pool, row, nil, 92); err != nil {
		t.Fatal(err)
	}
	var key *int64
	if err := pool.QueryRow(ctx, `SELECT liveness_key FROM kagzi.workers WHERE worker_id = 'pod-0'`).Scan(&key); err != nil || key == nil || *key != 92 {
		t.Fatalf("liveness key %v, %v; want its own, 92", key, err)
	}
}
