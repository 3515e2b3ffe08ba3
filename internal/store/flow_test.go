package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi/internal/testdb"
)

// A claim of a type with a concurrency limit takes at most the limit's room: the limit
// less the runs holding its slots, but the claiming worker's finishing runs; the runs
// it claims hold slots.
func TestAClaimOfATypeLimitedTypeTakesNoMoreThanTheLimitsRoom(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, concurrency) VALUES ('default', 'wf', 3)`); err != nil {
		t.Fatal(err)
	}
	ids := make([]uuid.UUID, 10)
	inputs := make([][]byte, 10)
	for i := range ids {
		ids[i], inputs[i] = uuid.Must(uuid.NewV7()), []byte(`1`)
	}
	if err := InsertRuns(ctx, pool, "default", "wf", nil, ids, inputs, make([][]byte, 10), time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	c := testClaimer("wf")
	c.Floors, c.KeyFloors = NewFloors(), NewFloors()
	first, _, err := ClaimRuns(ctx, pool, c, 10)
	if err != nil || len(first) != 3 {
		t.Fatalf("the first claim got %d runs (%v), want the limit's 3", len(first), err)
	}
	for _, r := range first {
		if !r.HoldsSlot {
			t.Fatalf("a run claimed under the limit holds no slot")
		}
	}
	if again, _, err := ClaimRuns(ctx, pool, c, 10); err != nil || len(again) != 0 {
		t.Fatalf("a claim while the limit is full got %d runs (%v), want none", len(again), err)
	}
	// One of the holders is finishing (its function returned): its slot is the
	// worker's to give to its next run.
	c.Finishing = [][16]byte{first[0].RunID}
	if next, _, err := ClaimRuns(ctx, pool, c, 10); err != nil || len(next) != 1 {
		t.Fatalf("a claim with one holder finishing got %d runs (%v), want 1", len(next), err)
	}
}

// A worker whose claims found its type limited (Claimer.Limited) locks the type in the
// claim's setup and claims through claimLimitedSQL: the same room as kagzi.claim's
// (the limit less the holders, the worker's finishing runs not counted), counted
// after the lock, so that a claim that committed while it waited for the lock is
// counted; a type whose limit was removed is claimed without slots and forgotten.
func TestAClaimOfAKnownLimitedTypeLocksItInItsSetupAndCountsWhatCommittedMeanwhile(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, concurrency) VALUES ('default', 'wf', 4)`); err != nil {
		t.Fatal(err)
	}
	ids := make([]uuid.UUID, 20)
	inputs := make([][]byte, len(ids))
	for i := range ids {
		ids[i], inputs[i] = uuid.Must(uuid.NewV7()), []byte(`1`)
	}
	if err := InsertRuns(ctx, pool, "default", "wf", nil, ids, inputs, make([][]byte, len(ids)), time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	c := testClaimer("wf")
	c.Floors, c.KeyFloors, c.Limited = NewFloors(), NewFloors(), map[string]bool{}
	first, _, err := ClaimRuns(ctx, conn, c, 10)
	if err != nil || len(first) != 4 || !first[0].HoldsSlot {
		t.Fatalf("the first claim got %d runs (%v), want the limit's 4 holding slots", len(first), err)
	}
	if !c.Limited["wf"] {
		t.Fatal("the claimer did not learn that the type is limited")
	}
	if again, _, err := ClaimRuns(ctx, conn, c, 10); err != nil || len(again) != 0 {
		t.Fatalf("a claim while the limit is full got %d runs (%v), want none", len(again), err)
	}
	c.Finishing = [][16]byte{first[0].RunID, first[1].RunID}
	next, _, err := ClaimRuns(ctx, conn, c, 10)
	if err != nil || len(next) != 2 || !next[0].HoldsSlot || !next[1].HoldsSlot {
		t.Fatalf("a claim with two holders finishing got %d runs (%v), want 2 holding slots", len(next), err)
	}
	var generic int64
	if err := conn.QueryRow(ctx, `SELECT generic_plans FROM pg_prepared_statements WHERE statement = $1`,
		claimLimitedSQL).Scan(&generic); err != nil || generic != 2 {
		t.Fatalf("the short way of a limited type ran %d times with its generic plan (%v), want 2", generic, err)
	}

	// Those four finish; another claimer (a worker elsewhere) takes one slot and commits
	// while this claim waits for the type's lock: the claim must count it.
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'COMPLETED', finished_at = now(), holds_type_slot = false
		WHERE run_id = ANY($1)`, []uuid.UUID{first[0].RunID, first[1].RunID, first[2].RunID, first[3].RunID}); err != nil {
		t.Fatal(err)
	}
	c.Finishing = nil
	other, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	if _, err := other.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('kagzi.flow.type|default|wf', 0))`); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(ctx, `UPDATE kagzi.runs SET status = 'RUNNING', holds_type_slot = true, started_at = now(),
		available_at = now() + interval '1 minute' WHERE run_id = $1`, ids[19]); err != nil {
		t.Fatal(err)
	}
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		claimed, _, err := ClaimRuns(ctx, conn, c, 10)
		done <- result{len(claimed), err}
	}()
	time.Sleep(100 * time.Millisecond) // the claim most likely waits for the lock by now
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil || r.n != 1 {
		t.Fatalf("the claim after another one committed got %d runs (%v), want the 1 room left", r.n, r.err)
	}
	var holders int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.runs WHERE holds_type_slot AND status = 'RUNNING'`).Scan(&holders); err != nil || holders != 4 {
		t.Fatalf("%d runs hold the type's slots (%v), want the limit's 4", holders, err)
	}

	// The limit is removed: the next claim takes runs without slots and forgets it.
	if _, err := pool.Exec(ctx, `DELETE FROM kagzi.flow_limits`); err != nil {
		t.Fatal(err)
	}
	free, _, err := ClaimRuns(ctx, conn, c, 3)
	if err != nil || len(free) != 3 || free[0].HoldsSlot {
		t.Fatalf("a claim after the limit was removed got %d runs (%v), want 3 holding no slot", len(free), err)
	}
	if c.Limited["wf"] {
		t.Fatal("the claimer still takes the type for limited")
	}
}

// A busy worker has hundreds of finishing runs (up to 8 a slot), and its claims leave
// them out of every count of holders: the array is hashed once a claim, not searched
// for each holder (4,000 holders and 8,000 finishing runs: 4 ms a count against 125).
// Checked in the plans of kagzi.claim's count of a type's holders, of
// kagzi.claim_keyed's count of a key's, and of the limited types' short way.
func TestTheClaimsCountsOfHoldersHashTheFinishingRuns(t *testing.T) {
	t.Parallel()
	pool, url := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, concurrency) VALUES ('default', 'wf', 100);
		INSERT INTO kagzi.flow_limits (namespace, workflow_type, key_concurrency) VALUES ('default', 'wk', 1)`); err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{"wf", "wk"} {
		ids := make([]uuid.UUID, 20)
		inputs := make([][]byte, len(ids))
		for i := range ids {
			ids[i], inputs[i] = uuid.Must(uuid.NewV7()), []byte(`1`)
		}
		if typ == "wf" {
			if err := InsertRuns(ctx, pool, "default", typ, nil, ids, inputs, make([][]byte, len(ids)), time.Time{}, nil); err != nil {
				t.Fatal(err)
			}
			continue
		}
		for i := range ids {
			if err := InsertManyRuns(ctx, pool, ManyRuns{Namespace: "default", WorkflowType: typ, IDs: ids[i : i+1],
				Inputs: inputs[i : i+1], Carriers: make([][]byte, 1), FlowKey: fmt.Sprintf("k%d", i%4)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	finishing := make([][16]byte, 50)
	for i := range finishing {
		finishing[i] = uuid.New()
	}
	plans := nestedPlans(t, url, func(conn *pgx.Conn) {
		limited := testClaimer("wf")
		limited.Floors, limited.KeyFloors, limited.Limited, limited.Finishing = NewFloors(), NewFloors(), map[string]bool{}, finishing
		keyed := testClaimer("wk")
		keyed.Finishing = finishing
		for range 2 { // kagzi.claim's way, then the short way
			if got, _, err := ClaimRuns(ctx, conn, limited, 3); err != nil || len(got) != 3 {
				t.Fatalf("a claim of the limited type got %d runs (%v), want 3", len(got), err)
			}
		}
		if got, _, err := ClaimRuns(ctx, conn, keyed, 10); err != nil || len(got) != 4 {
			t.Fatalf("a claim of the keyed type got %d runs (%v), want one of each of its 4 keys", len(got), err)
		}
	})
	counts := map[string]int{}
	for _, plan := range plans {
		for what, marks := range map[string][]string{
			"kagzi.claim's count of a type's holders": {"r.holds_type_slot AND r.status = 'RUNNING'", "Query Text: SELECT count(*)"},
			"claim_keyed's count of a key's holders":  {"h.flow_key = k.k", "count(*)::integer"},
			"the short way's count of holders":        {"WITH lims AS MATERIALIZED", "holds_type_slot"},
		} {
			if !strings.Contains(plan, marks[0]) || !strings.Contains(plan, marks[1]) {
				continue
			}
			counts[what]++
			if !strings.Contains(plan, "hashed SubPlan") {
				t.Errorf("%s does not hash the finishing runs:\n%s", what, plan)
			}
		}
	}
	for _, what := range []string{"kagzi.claim's count of a type's holders", "claim_keyed's count of a key's holders",
		"the short way's count of holders"} {
		if counts[what] == 0 {
			t.Errorf("no plan of %s was logged", what)
		}
	}
}

// Every key a claim visits that has a concurrency limit is locked until the claim
// commits, an entry each in PostgreSQL's shared lock table (6,400 by default, for every
// session of the database). The walk beyond the ring's cap after a key's place was
// freed visits up to 1,000 more keys: it locks only those with room, not the full ones.
func TestAClaimsWalkBeyondTheRingLocksOnlyTheKeysWithRoom(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, key_concurrency) VALUES ('default', 'wk', 1)`); err != nil {
		t.Fatal(err)
	}
	// 1,000 keys, each with a sleeping holder and a queued run; key k0500's holder
	// has just finished.
	if _, err := pool.Exec(ctx, `
		INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input, available_at, started_at, flow_key)
		SELECT gen_random_uuid(), 'default', 'h' || g, 'wk', CASE WHEN g = 500 THEN 'COMPLETED' ELSE 'SLEEPING' END, '1',
			now() + interval '1 hour', now() - interval '1 minute', 'k' || lpad(g::text, 4, '0')
		FROM generate_series(0, 999) g;
		INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input, available_at, flow_key)
		SELECT gen_random_uuid(), 'default', 'q' || g, 'wk', 'PENDING', '1', now() - interval '1 second',
			'k' || lpad(g::text, 4, '0')
		FROM generate_series(0, 999) g;
		ANALYZE kagzi.runs`); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	c := testClaimer("wk")
	c.Versions = []string{""}
	c.KeysFreed = map[string]bool{"wk": true}
	claimed, _, err := ClaimRuns(ctx, tx, c, 10)
	if err != nil || len(claimed) != 1 || claimed[0].ConcurrencyKey != "k0500" {
		t.Fatalf("the claim got %d runs (%v), want the queued run of the freed key k0500", len(claimed), err)
	}
	var locks int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).Scan(&locks); err != nil {
		t.Fatal(err)
	}
	// The ring's visit: the room (10) plus 16 keys, locked; beyond it, the one key
	// with room.
	if locks > 10+16+1 {
		t.Fatalf("the claim holds %d advisory locks, want at most %d: the keys of its ring and the one with room", locks, 10+16+1)
	}
	if cursor := c.Cursors["wk"]; cursor < "k0500" {
		t.Fatalf("the cursor after the walk is %q, want one past the keys walked (k0500 or later)", cursor)
	}
}

// A claim of 2,000 slots visited the room plus 16 keys of the ring, and locked each:
// now at most 500, so that a few large workers' claims at once stay far from filling
// PostgreSQL's lock table.
func TestAClaimLocksAtMostFiveHundredKeys(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, key_concurrency) VALUES ('default', 'wk', 1);
		INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input, available_at, flow_key)
		SELECT gen_random_uuid(), 'default', 'q' || g, 'wk', 'PENDING', '1', now() - interval '1 second',
			'k' || lpad(g::text, 4, '0')
		FROM generate_series(0, 1999) g;
		ANALYZE kagzi.runs`); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	c := testClaimer("wk")
	c.Versions = []string{""}
	claimed, _, err := ClaimRuns(ctx, tx, c, 2000)
	if err != nil || len(claimed) != 500 {
		t.Fatalf("a claim of 2,000 over 2,000 free keys got %d runs (%v), want the 500 keys it may visit", len(claimed), err)
	}
	var locks int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).Scan(&locks); err != nil || locks > 500 {
		t.Fatalf("the claim holds %d advisory locks (%v), want at most 500", locks, err)
	}
}

// Found from outside: a worker taken for dead (its sessions terminated) kept retrying
// the end of a run whose function returned, while another worker took that run over;
// its claims left the run out of the holders (p_finishing) and admitted the next run
// of its key (limit 1) beside it. A finishing run is left out only while it is still
// locked by the claiming worker under a lease that has not passed; for type limits
// through kagzi.claim and claimLimitedSQL, for key limits through claim_keyed.
func TestAFinishingRunThatAnotherWorkerTookOverStillCountsAmongTheHolders(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	takeOver := func(id [16]byte) {
		t.Helper()
		if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET locked_by = 'other', lease_epoch = lease_epoch + 1,
			available_at = now() + interval '1 minute' WHERE run_id = $1`, uuid.UUID(id)); err != nil {
			t.Fatal(err)
		}
	}

	// A type limit of 1, through kagzi.claim and then the short way.
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, concurrency) VALUES ('default', 'wf', 1)`); err != nil {
		t.Fatal(err)
	}
	ids := make([]uuid.UUID, 4)
	inputs := make([][]byte, len(ids))
	for i := range ids {
		ids[i], inputs[i] = uuid.Must(uuid.NewV7()), []byte(`1`)
	}
	if err := InsertRuns(ctx, pool, "default", "wf", nil, ids, inputs, make([][]byte, len(ids)), time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	for _, short := range []bool{false, true} {
		c := testClaimer("wf")
		c.Floors, c.KeyFloors = NewFloors(), NewFloors()
		if short {
			c.Limited = map[string]bool{"wf": true}
		}
		first, _, err := ClaimRuns(ctx, pool, c, 10)
		if err != nil || len(first) != 1 {
			t.Fatalf("short %t: the first claim got %d runs (%v), want the limit's 1", short, len(first), err)
		}
		takeOver(first[0].RunID)
		c.Finishing = [][16]byte{first[0].RunID}
		if next, _, err := ClaimRuns(ctx, pool, c, 10); err != nil || len(next) != 0 {
			t.Fatalf("short %t: a claim whose finishing run another worker took over got %d runs (%v), want none", short, len(next), err)
		}
		if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'COMPLETED', finished_at = now(), holds_type_slot = false
			WHERE run_id = $1`, uuid.UUID(first[0].RunID)); err != nil {
			t.Fatal(err)
		}
	}

	// A key limit of 1.
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, key_concurrency) VALUES ('default', 'wk', 1);
		INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input, available_at, flow_key)
		SELECT gen_random_uuid(), 'default', 'q' || g, 'wk', 'PENDING', '1', now() - interval '1 second' * (10 - g), 'k'
		FROM generate_series(0, 2) g`); err != nil {
		t.Fatal(err)
	}
	c := testClaimer("wk")
	c.Versions = []string{""}
	first, _, err := ClaimRuns(ctx, pool, c, 10)
	if err != nil || len(first) != 1 {
		t.Fatalf("the first keyed claim got %d runs (%v), want the key's 1", len(first), err)
	}
	takeOver(first[0].RunID)
	c.Finishing = [][16]byte{first[0].RunID}
	c.KeysFreed = map[string]bool{"wk": true}
	if next, _, err := ClaimRuns(ctx, pool, c, 10); err != nil || len(next) != 0 {
		t.Fatalf("a keyed claim whose finishing run another worker took over got %d runs (%v), want none", len(next), err)
	}
}

// A renewal that checked a slot holder's lease just before it ended and commits after
// it keeps the slot: a claim in between, which reads the row as it was (the lease
// passed, the renewal not committed), still counts the holder for a grace past its
// lease end (slotGraceSQL), so the limit is not exceeded once the renewal commits.
// Checked for the lease renewal and the heartbeat, through kagzi.claim and the short
// way of a known limited type, and for an eager start.
func TestARenewalInFlightAtALeasesEndKeepsTheSlotFromAClaim(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, concurrency) VALUES ('default', 'wf', 1)`); err != nil {
		t.Fatal(err)
	}
	ids := make([]uuid.UUID, 6)
	inputs := make([][]byte, len(ids))
	for i := range ids {
		ids[i], inputs[i] = uuid.Must(uuid.NewV7()), []byte(`1`)
	}
	if err := InsertRuns(ctx, pool, "default", "wf", nil, ids, inputs, make([][]byte, len(ids)), time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	renewals := map[string]func(tx pgx.Tx, f Fence) error{
		"renewal": func(tx pgx.Tx, f Fence) error {
			_, err := RenewLease(ctx, tx, f, time.Minute)
			return err
		},
		"heartbeat": func(tx pgx.Tx, f Fence) error {
			res, err := Heartbeat(ctx, tx, WorkerBeat{Namespace: "default", WorkerID: "w"}, []Fence{f}, time.Minute)
			if err == nil && (len(res) != 1 || !res[0].Extended) {
				err = fmt.Errorf("the heartbeat extended %v", res)
			}
			return err
		},
	}
	for _, how := range []string{"renewal", "heartbeat"} {
		for _, short := range []bool{false, true} {
			c := testClaimer("wf")
			c.Floors, c.KeyFloors = NewFloors(), NewFloors()
			first, _, err := ClaimRuns(ctx, pool, c, 10)
			if err != nil || len(first) != 1 {
				t.Fatalf("%s, short %t: the first claim got %d runs (%v), want the limit's 1", how, short, len(first), err)
			}
			holder := first[0].Fence
			// The lease ends in 300 ms; the renewal checks it now and commits after it.
			if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET available_at = now() + interval '300 milliseconds' WHERE run_id = $1`,
				uuid.UUID(holder.RunID)); err != nil {
				t.Fatal(err)
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := renewals[how](tx, holder); err != nil {
				t.Fatalf("%s, short %t: the %s before the lease's end: %v", how, short, how, err)
			}
			time.Sleep(500 * time.Millisecond)
			other := testClaimer("wf")
			other.WorkerID = "other"
			other.Floors, other.KeyFloors = NewFloors(), NewFloors()
			if short {
				other.Limited = map[string]bool{"wf": true}
			}
			got, _, err := ClaimRuns(ctx, pool, other, 10)
			if err != nil || len(got) != 0 {
				t.Errorf("%s, short %t: a claim while the %s was in flight got %d runs (%v), want none", how, short, how, len(got), err)
			}
			n := NewRun{RunID: uuid.Must(uuid.NewV7()), Namespace: "default", WorkflowType: "wf", Input: []byte(`1`),
				Eager: &Eager{WorkerID: "other", Lease: time.Minute, Version: "v1", Limited: true}}
			n.WorkflowID = n.RunID.String()
			n.Version = &n.Eager.Version
			if run, _, err := InsertRunChecked(ctx, pool, n); err != nil || run.Status != "PENDING" {
				t.Errorf("%s, short %t: an eager start while the %s was in flight: %s (%v), want PENDING", how, short, how, run.Status, err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			var holders int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.runs WHERE holds_type_slot AND status = 'RUNNING'
				AND available_at > now()`).Scan(&holders); err != nil || holders != 1 {
				t.Fatalf("%s, short %t: %d runs hold the slot of a limit of 1 (%v)", how, short, holders, err)
			}
			if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'COMPLETED', finished_at = now(), holds_type_slot = false
				WHERE status = 'RUNNING'`); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A concurrency limit set on a type counts its RUNNING runs whose lease passed too (a
// worker frozen past its lease, whose run nobody took over yet): they are marked as
// slot holders, so that their worker, waking, can neither renew nor record them while
// a claim admits another run in their place (found from outside: a frozen worker's run
// recorded beside the run a limit of 1 admitted).
func TestALimitSetWhileARunsLeaseHasPassedFencesThatRun(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	run := runningRun(t, pool, 1, false)
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET available_at = now() - interval '1 second' WHERE run_id = $1`, run); err != nil {
		t.Fatal(err)
	}
	one := 1
	if _, err := SetFlowLimits(ctx, pool, FlowLimits{Namespace: "default", WorkflowType: "wf", Concurrency: &one}); err != nil {
		t.Fatal(err)
	}
	if _, err := RenewLease(ctx, pool, Fence{RunID: run, Epoch: 1}, time.Minute); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("the renewal of a run whose lease passed before the limit was set: %v, want ErrLeaseLost", err)
	}
}

// A lapsed holder of a type slot counts for slotGraceSQL past its lease's end, and then
// its slot is free, which nothing announces: NextWake gives that time to the workers of
// the type (found from outside: a frozen worker's slot went to another run 5 s after
// its lease's end, at the next poll, instead of 2).
func TestNextWakeIsWhenALapsedSlotHoldersGraceEnds(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, concurrency) VALUES ('default', 'wf', 1)`); err != nil {
		t.Fatal(err)
	}
	run := runningRun(t, pool, 1, false)
	var leaseEnd time.Time
	if err := pool.QueryRow(ctx, `UPDATE kagzi.runs SET holds_type_slot = true, available_at = now() - interval '500 milliseconds'
		WHERE run_id = $1 RETURNING available_at`, run).Scan(&leaseEnd); err != nil {
		t.Fatal(err)
	}
	ids := []uuid.UUID{uuid.Must(uuid.NewV7())}
	if err := InsertRuns(ctx, pool, "default", "wf", nil, ids, [][]byte{[]byte(`1`)}, make([][]byte, 1), time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	c := testClaimer("wf")
	c.Versions = []string{""}
	c.WorkerID = "other"
	c.Floors, c.KeyFloors = NewFloors(), NewFloors()
	next, err := NextWake(ctx, pool, c)
	if err != nil || next == nil || !next.Equal(leaseEnd.Add(2*time.Second)) {
		t.Fatalf("NextWake = %v, %v; want the lapsed holder's lease end + 2 s, %v", next, err, leaseEnd.Add(2*time.Second))
	}
}

// A renewal that waited for its run's row lock (a caller's transaction that signalled
// the run holds it: a signal updates the run's row) checks the lease when it gets the
// lock, not when it began: a check made before the lease ended, passed after the wait,
// kept a run whose slot a claim had given to another past the grace (found by a review:
// two runs in the slots of a limit of 1).
func TestARenewalThatWaitedForItsRunsRowChecksTheLeaseWhenItGetsTheRow(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, concurrency) VALUES ('default', 'wf', 1)`); err != nil {
		t.Fatal(err)
	}
	ids := []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())}
	if err := InsertRuns(ctx, pool, "default", "wf", nil, ids, [][]byte{[]byte(`1`), []byte(`1`)}, make([][]byte, 2), time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	c := testClaimer("wf")
	c.Floors, c.KeyFloors = NewFloors(), NewFloors()
	first, _, err := ClaimRuns(ctx, pool, c, 10)
	if err != nil || len(first) != 1 {
		t.Fatalf("first claim: %d, %v", len(first), err)
	}
	holder := first[0].Fence
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET available_at = now() + interval '500 milliseconds' WHERE run_id = $1`,
		uuid.UUID(holder.RunID)); err != nil {
		t.Fatal(err)
	}
	user, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer user.Rollback(ctx)
	if _, err := SendSignal(ctx, user, SignalSend{Namespace: "default", RunID: holder.RunID, Name: "s", Payload: []byte(`1`)}); err != nil {
		t.Fatal(err)
	}
	renewed := make(chan error, 1)
	go func() { _, err := RenewLease(ctx, pool, holder, time.Minute); renewed <- err }()
	time.Sleep(3500 * time.Millisecond) // past the lease's end and the grace
	other := testClaimer("wf")
	other.WorkerID = "other"
	other.Floors, other.KeyFloors = NewFloors(), NewFloors()
	if got, _, err := ClaimRuns(ctx, pool, other, 10); err != nil || len(got) != 1 {
		t.Fatalf("a claim past the holder's grace got %d runs (%v), want its slot", len(got), err)
	}
	if err := user.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-renewed; !errors.Is(err, ErrLeaseLost) {
		t.Errorf("the renewal that waited past the lease's end: %v, want ErrLeaseLost", err)
	}
	var holders int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.runs WHERE holds_type_slot AND status = 'RUNNING'
		AND available_at > now()`).Scan(&holders); err != nil || holders != 1 {
		t.Fatalf("%d runs hold live slots of a limit of 1 (%v)", holders, err)
	}
}

// The prune deletes only rate windows that count no start any more: a window begun a
// day ago holds, in its last slots, starts made up to 1.1 periods after it, which
// count for a period (found from outside: a window of a 24-hour rate was pruned a day
// after it began while it held a start made an hour before, and two runs began at once).
func TestThePruneKeepsRateWindowsThatStillCountStarts(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	const day = int64(24 * time.Hour / time.Millisecond)
	for _, w := range []struct {
		key    string
		age    string
		period *int64
	}{
		{"day-old-window-of-a-day", "25 hours", ptr(day)},
		{"two-days-old-window-of-a-day", "2 days", ptr(day)},
		{"old-window-of-no-recorded-period", "25 hours", nil},
		{"long-gone-window-of-a-day", "3 days", ptr(day)},
		{"day-old-window-of-an-hour", "25 hours", ptr(int64(time.Hour / time.Millisecond))},
		{"day-old-window-of-an-hour-whose-limit-is-now-a-day", "25 hours", ptr(int64(time.Hour / time.Millisecond))},
	} {
		if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_rates (namespace, workflow_type, flow_key, window_start, slots, period_ms)
			VALUES ('default', 'wf', $1, now() - $2::interval, '{0,0,0,0,0,0,0,0,0,0,1}', $3)`, w.key, w.age, w.period); err != nil {
			t.Fatal(err)
		}
	}
	// The type's key rate is a day now (a key's window: flow_key not empty); the
	// window of the key named for it has not been cut again since.
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, key_rate, key_rate_period_ms)
		VALUES ('default', 'wf', 1, $1)`, day); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE kagzi.flow_rates SET workflow_type = 'other' WHERE flow_key <> 'day-old-window-of-an-hour-whose-limit-is-now-a-day'`); err != nil {
		t.Fatal(err)
	}
	if _, err := PruneFlowRates(ctx, pool, "default"); err != nil {
		t.Fatal(err)
	}
	var kept []string
	if err := pool.QueryRow(ctx, `SELECT array_agg(flow_key ORDER BY flow_key) FROM kagzi.flow_rates`).Scan(&kept); err != nil {
		t.Fatal(err)
	}
	want := []string{"day-old-window-of-a-day", "day-old-window-of-an-hour-whose-limit-is-now-a-day",
		"old-window-of-no-recorded-period", "two-days-old-window-of-a-day"}
	if fmt.Sprint(kept) != fmt.Sprint(want) {
		t.Fatalf("kept %v, want %v", kept, want)
	}
}

func ptr[T any](v T) *T { return &v }

// A claim that read the limits before a period changed cuts the window back to the old
// period after a claim under the new one cut it: the starts the longer period still
// counts are not lost on the way (found in review: a 1 hour limit admitted a second
// start after a claim of the old 1 second period).
func TestARateWindowCutToAShorterPeriodAndBackStillCountsItsStarts(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	// One start 2 to 8 minutes ago, in a window of a 1 hour period (its tenth slot).
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_rates (namespace, workflow_type, flow_key, window_start, slots, period_ms)
		VALUES ('default', 'wf', '', now() - interval '62 minutes', '{0,0,0,0,0,0,0,0,0,1,0}', 3600000)`); err != nil {
		t.Fatal(err)
	}
	room := func(periodMs int64) int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT kagzi.flow_rate_room('default', 'wf', '', 1, $1)`, periodMs).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := room(3600000); n != 0 {
		t.Fatalf("room under 1 an hour with a start 8 minutes ago: %d, want 0", n)
	}
	room(1000) // a claim with the limits of before: 1 a second
	if n := room(3600000); n != 0 {
		t.Fatalf("room under 1 an hour again, after a cut to a second: %d, want 0 (the start is still counted)", n)
	}
}
