package store

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kagzi/kagzi/internal/testdb"
)

func TestAClaimLoadsTheRecordedStepsOfTheRunsItClaimsAndOfNoOther(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	ids := []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())}
	inputs := [][]byte{[]byte(`1`), []byte(`2`), []byte(`3`)}
	if err := InsertRuns(ctx, pool, "default", "wf", nil, ids, inputs, make([][]byte, 3), time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	// The first two carry steps of an earlier execution: the first was claimed before
	// (as a run resumed after a sleep or a crash is), the second is a fork (its steps
	// were copied in before its first claim).
	for i, id := range ids[:2] {
		_, err := pool.Exec(ctx, `INSERT INTO kagzi.steps (run_id, step_key, name, kind, status, output, attempts)
			VALUES ($1, 'a#1', 'a', 'STEP', 'COMPLETED', $2, 1)`, id, inputs[i])
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET lease_epoch = 1 WHERE run_id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET forked_from_run_id = $2 WHERE run_id = $1`, ids[1], ids[2]); err != nil {
		t.Fatal(err)
	}
	seen := map[uuid.UUID]bool{}
	for claim := range 3 {
		claimed, _, err := ClaimRuns(ctx, pool, testClaimer("wf"), 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(claimed) != 1 {
			t.Fatalf("claim %d: got %d runs, want 1", claim, len(claimed))
		}
		c := claimed[0]
		seen[c.RunID] = true
		switch c.RunID {
		case ids[0], ids[1]:
			want := string(inputs[0])
			if c.RunID == ids[1] {
				want = string(inputs[1])
			}
			if len(c.Steps) != 1 || string(c.Steps["a#1"].Output) != want {
				t.Fatalf("claim %d: run %s has steps %+v, want a#1 with output %s", claim, c.RunID, c.Steps, want)
			}
		default:
			if len(c.Steps) != 0 {
				t.Fatalf("claim %d: fresh run got steps %+v", claim, c.Steps)
			}
		}
	}
	if len(seen) != 3 {
		t.Fatalf("claimed %d distinct runs, want 3", len(seen))
	}
	claimed, _, err := ClaimRuns(ctx, pool, testClaimer("wf"), 10)
	if err != nil || len(claimed) != 0 {
		t.Fatalf("a claim with nothing left got %d runs, %v", len(claimed), err)
	}
}

func TestALookupByWorkflowIDReadsItsTwoPartialIndexesEvenBeforeTheTableIsAnalyzed(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	// Thousands of unfinished runs, no statistics yet: the planner must still not
	// scan them all for one workflow id.
	_, err := pool.Exec(ctx, `INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input, available_at)
		SELECT gen_random_uuid(), 'default', 'id-' || i, 'wf', 'PENDING', '{}', now() FROM generate_series(1, 3000) i`)
	if err != nil {
		t.Fatal(err)
	}
	plan := func(sql string, args ...any) string {
		rows, err := pool.Query(ctx, "EXPLAIN "+sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		var out string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			out += line + "\n"
		}
		return out
	}
	for name, p := range map[string]string{
		"GetRunByWorkflowID": plan(`SELECT * FROM (`+newestByWorkflowIDSQL("$1", "$2", "true")+`) r`, "default", "id-7"),
		"Start": plan(insertRuns[notEager][1].sql, insertRuns[notEager][1].args(&NewRun{RunID: uuid.Must(uuid.NewV7()), Namespace: "default",
			WorkflowID: "id-7", WorkflowType: "wf", Input: []byte(`1`), ReuseNever: true})...),
	} {
		for _, index := range []string{"runs_one_active_per_workflow_id", "runs_finished_by_workflow_id"} {
			if !strings.Contains(p, index) {
				t.Errorf("%s does not read %s:\n%s", name, index, p)
			}
		}
		if strings.Contains(p, "runs_claimable") || strings.Contains(p, "Seq Scan on runs") {
			t.Errorf("%s scans unfinished runs beyond the workflow id's:\n%s", name, p)
		}
	}
}

// failingStepsLoad is the pool, except that loading a claim's recorded steps fails
// (as when the connection breaks between the claim and the load).
type failingStepsLoad struct{ DBTX }

var errStepsLoad = errors.New("connection lost while loading steps")

func (f failingStepsLoad) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if sql == claimedStepsSQL {
		return nil, errStepsLoad
	}
	return f.DBTX.Query(ctx, sql, args...)
}

func TestAClaimWhoseStepsCannotBeLoadedHandsItsRunsBackAtOnce(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	ids := []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())}
	if err := InsertRuns(ctx, pool, "default", "wf", nil, ids, [][]byte{[]byte(`1`), []byte(`2`)}, make([][]byte, 2), time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	// The first run was claimed before and has a step: the claim must load it.
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET lease_epoch = 1 WHERE run_id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	claimed, _, err := ClaimRuns(ctx, failingStepsLoad{pool}, testClaimer("wf"), 10)
	if !errors.Is(err, errStepsLoad) || claimed != nil {
		t.Fatalf("got %d runs and %v, want no run and the load's error", len(claimed), err)
	}
	var pending int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.runs WHERE status = 'PENDING' AND available_at <= now()
		AND locked_by IS NULL`).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	if pending != 2 {
		t.Fatalf("%d of 2 runs claimable again, want both handed back at once", pending)
	}
	claimed, _, err = ClaimRuns(ctx, pool, testClaimer("wf"), 10)
	if err != nil || len(claimed) != 2 {
		t.Fatalf("the next claim got %d runs, %v; want both", len(claimed), err)
	}
}

func TestAClaimUsesItsGenericPlanAndLeavesTheSessionsPlanSettingAlone(t *testing.T) {
	t.Parallel()
	pool, url := testdb.NewPool(t)
	ctx := context.Background()
	analyzedPendingRuns(t, pool, 500)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	const claims = 10
	for range claims {
		claimed, _, err := ClaimRuns(ctx, conn, testClaimer("wf"), 5)
		if err != nil || len(claimed) != 5 {
			t.Fatalf("claimed %d runs (%v), want 5", len(claimed), err)
		}
	}
	var generic, custom int64
	if err := conn.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements
		WHERE statement = $1`, claimSQL).Scan(&generic, &custom); err != nil {
		t.Fatal(err)
	}
	if generic != claims || custom != 0 {
		t.Fatalf("the claim ran %d times with its generic plan and %d with a custom one, want %d and 0", generic, custom, claims)
	}
	var mode string
	if err := conn.QueryRow(ctx, "SHOW plan_cache_mode").Scan(&mode); err != nil || mode != "auto" {
		t.Fatalf("plan_cache_mode is %q after the claims (%v), want auto", mode, err)
	}
	// The claim's statements (inside kagzi.claim) read runs through their indexes.
	for _, plan := range nestedPlans(t, url, func(conn *pgx.Conn) {
		for range claims {
			if _, _, err := ClaimRuns(ctx, conn, testClaimer("wf"), 5); err != nil {
				t.Fatal(err)
			}
		}
	}) {
		if strings.Contains(plan, "Seq Scan on runs") || strings.Contains(plan, "Bitmap Heap Scan on runs") {
			t.Fatalf("a statement of the claim scans runs:\n%s", plan)
		}
	}
}

// nestedPlans returns the plans of every statement that run makes a new connection to
// url execute, those inside functions included, as auto_explain logs them.
func nestedPlans(t *testing.T, url string, run func(conn *pgx.Conn)) []string {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var plans []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if strings.Contains(n.Message, "Query Text:") {
			mu.Lock()
			plans = append(plans, n.Message)
			mu.Unlock()
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, sql := range []string{"LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
		"SET auto_explain.log_nested_statements = on", "SET client_min_messages = log"} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	run(conn)
	mu.Lock()
	defer mu.Unlock()
	if len(plans) == 0 {
		t.Fatal("auto_explain logged no plan")
	}
	return plans
}

// testClaimer is the claimer of a worker "w" of the given types at version v1.
func testClaimer(types ...string) Claimer {
	versions := make([]string, len(types))
	for i := range versions {
		versions[i] = "v1"
	}
	return Claimer{Namespace: "default", Types: types, Versions: versions, WorkerID: "w", Lease: time.Minute,
		Cursors: map[string]string{}}
}

func TestAClaimMakesPostgresWarnNothing(t *testing.T) {
	t.Parallel()
	pool, url := testdb.NewPool(t)
	ctx := context.Background()
	analyzedPendingRuns(t, pool, 20)
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var notices []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		notices = append(notices, n.Severity+": "+n.Message)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	claimed, _, err := ClaimRuns(ctx, conn, testClaimer("wf"), 5)
	if err != nil || len(claimed) != 5 {
		t.Fatalf("claimed %d runs (%v), want 5", len(claimed), err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(notices) != 0 {
		t.Fatalf("a claim made Postgres send (and log) %q", notices)
	}
}

// The claim finds the types with queued keyed runs by one index probe per type. An
// EXISTS there was planned, generically, on the empty table the worker's first claim
// saw, as a hash semi-join over the namespace's whole key queue: with one key's
// 100,000 queued runs, every claim read them all (55 ms a claim, and a tenant's wait
// behind another's backlog went from 11 to 70 ms). What a claim reads must not grow
// with the queue.
func TestAClaimPlannedOnAnEmptyTableDoesNotReadTheWholeKeyQueueOnceItFills(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	c := testClaimer("wf")
	for range 6 { // the generic plans of this connection are made now, on an empty table
		if _, _, err := ClaimRuns(ctx, conn, c, 10); err != nil {
			t.Fatal(err)
		}
	}
	queue := func(n int) {
		ids := make([]uuid.UUID, n)
		inputs := make([][]byte, n)
		for i := range ids {
			ids[i], _ = uuid.NewV7()
			inputs[i] = []byte(`{}`)
		}
		for i := 0; i < n; i += 10_000 {
			j := min(i+10_000, n)
			if err := InsertManyRuns(ctx, pool, ManyRuns{Namespace: "default", WorkflowType: "wf", IDs: ids[i:j],
				Inputs: inputs[i:j], FlowKey: "tenant-a"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The buffers one claim touches, through the same connection and plans (rolled
	// back, so that each measure sees the same queue): the least of three, since a
	// claim that must reload the backend's catalog caches (reset when the suite's other
	// databases' DDL overflows the invalidation queue) counts those reads too.
	// scan: whether the claim walks the ring of keys with the skip scan, or reads the
	// queued keys from the key floor first (and falls back to the scan: 1,000 or more).
	claimBuffers := func(scan bool) float64 {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, genericPlanSQL); err != nil {
			t.Fatal(err)
		}
		var plan []map[string]any
		if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+claimSQL, c.Namespace, c.Types, c.Versions,
			[]string{""}, c.WorkerID, c.Lease.Milliseconds(), 10, [][16]byte{}, []*time.Time{nil}, []bool{false},
			[]*time.Time{nil}, []bool{scan}, 10).Scan(&plan); err != nil {
			t.Fatal(err)
		}
		top := plan[0]["Plan"].(map[string]any)
		return top["Shared Hit Blocks"].(float64) + top["Shared Read Blocks"].(float64)
	}
	buffers := func(scan bool) float64 {
		least := claimBuffers(scan)
		for range 2 {
			least = min(least, claimBuffers(scan))
		}
		return least
	}
	queue(1_000)
	small := [2]float64{buffers(true), buffers(false)}
	queue(49_000)
	large := [2]float64{buffers(true), buffers(false)}
	for i, how := range []string{"walking the keys with the skip scan", "reading the keys from the key floor"} {
		if large[i]-small[i] > 500 {
			t.Fatalf("a claim of 10 runs %s touched %.0f buffers with 1,000 runs queued in one key and %.0f with 50,000: it reads the queue",
				how, small[i], large[i])
		}
		t.Logf("a claim of 10 runs %s touched %.0f buffers with 1,000 runs queued in one key and %.0f with 50,000", how, small[i], large[i])
	}
}

func TestAClaimCountsTheConcurrencyKeysItPassedOverWhileAnotherClaimHeldThem(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, key_concurrency)
		VALUES ('default', 'wf', 1)`); err != nil {
		t.Fatal(err)
	}
	// The key's run is of version v2: a worker of v1 locks the key and cannot take it.
	v2 := "v2"
	id := uuid.Must(uuid.NewV7())
	if err := InsertManyRuns(ctx, pool, ManyRuns{Namespace: "default", WorkflowType: "wf", Version: &v2,
		IDs: []uuid.UUID{id}, Inputs: [][]byte{[]byte(`1`)}, Carriers: [][]byte{nil}, FlowKey: "customer-7"}); err != nil {
		t.Fatal(err)
	}
	holder := testClaimer("wf")
	other := testClaimer("wf")
	other.Versions = []string{v2}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	claimed, report, err := ClaimRuns(ctx, tx, holder, 5)
	if err != nil || len(claimed) != 0 || report.KeysPassed != 0 {
		t.Fatalf("the v1 claim: %d runs, %d keys passed over, %v; want none, none", len(claimed), report.KeysPassed, err)
	}
	// The v1 claim holds the key's lock until it commits: the v2 claim passes the key
	// over, and says so.
	claimed, report, err = ClaimRuns(ctx, pool, other, 5)
	if err != nil || len(claimed) != 0 || report.KeysPassed != 1 {
		t.Fatalf("the v2 claim while the key is held: %d runs, %d keys passed over, %v; want none, 1", len(claimed), report.KeysPassed, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	claimed, report, err = ClaimRuns(ctx, pool, other, 5)
	if err != nil || len(claimed) != 1 || claimed[0].RunID != id || report.KeysPassed != 0 {
		t.Fatalf("the v2 claim after the holder's commit: %d runs, %d keys passed over, %v; want the run, none", len(claimed), report.KeysPassed, err)
	}
}

// Both ways: kagzi.claim's, and claimLimitedSQL's (the claimer knows the type for
// limited from the start).
func TestALimitedTypesClaimReadsFromTheFloorAndReturnsTheNextOne(t *testing.T) {
	t.Parallel()
	t.Run("kagzi.claim", func(t *testing.T) { testLimitedFloor(t, nil) })
	t.Run("short way", func(t *testing.T) { testLimitedFloor(t, map[string]bool{"wf": true}) })
}

func testLimitedFloor(t *testing.T, limited map[string]bool) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, concurrency)
		VALUES ('default', 'wf', 2)`); err != nil {
		t.Fatal(err)
	}
	ids := make([]uuid.UUID, 4)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7())
	}
	if err := InsertRuns(ctx, pool, "default", "wf", nil, ids, [][]byte{[]byte(`1`), []byte(`2`), []byte(`3`), []byte(`4`)},
		make([][]byte, 4), time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	// The runs became claimable a minute apart, the last one a minute ago.
	for i, id := range ids {
		if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET available_at = now() - $2::int * interval '1 minute'
			WHERE run_id = $1`, id, 4-i); err != nil {
			t.Fatal(err)
		}
	}
	var at [4]time.Time
	for i, id := range ids {
		if err := pool.QueryRow(ctx, `SELECT available_at FROM kagzi.runs WHERE run_id = $1`, id).Scan(&at[i]); err != nil {
			t.Fatal(err)
		}
	}
	c := testClaimer("wf")
	c.Floors, c.Limited = NewFloors(), limited
	// The limit admits two: the read stopped at the second run, the floor a second
	// before it.
	claimed, _, err := ClaimRuns(ctx, pool, c, 10)
	if err != nil || len(claimed) != 2 || claimed[0].RunID != ids[0] || claimed[1].RunID != ids[1] {
		t.Fatalf("the first claim: %d runs, %v; want the first two", len(claimed), err)
	}
	floor, ok := c.Floors.Of("wf")
	if want := at[1].Add(-time.Second); !ok || !floor.Equal(want) {
		t.Fatalf("the floor after a full read: %v (set: %v), want %v", floor, ok, want)
	}
	// A run below the floor is not read until the floor is lowered to it (as a
	// notification or the probe does).
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'COMPLETED', finished_at = now()
		WHERE run_id = ANY($1)`, ids[:2]); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET available_at = now() - interval '1 hour' WHERE run_id = $1`, ids[3]); err != nil {
		t.Fatal(err)
	}
	claimed, _, err = ClaimRuns(ctx, pool, c, 10)
	if err != nil || len(claimed) != 1 || claimed[0].RunID != ids[2] {
		t.Fatalf("the claim from the floor: %d runs, %v; want the third run only", len(claimed), err)
	}
	// That read came back short: the floor is a second before the claim's now().
	if f, ok := c.Floors.Of("wf"); !ok || !f.After(at[3]) {
		t.Fatalf("the floor after a short read: %v (set: %v), want one after %v", f, ok, at[3])
	}
	lowered, err := ProbeBelowFloors(ctx, pool, c)
	if err != nil || !lowered {
		t.Fatalf("the probe: lowered %v, %v; want the floor lowered to the run below it", lowered, err)
	}
	claimed, _, err = ClaimRuns(ctx, pool, c, 10)
	if err != nil || len(claimed) != 1 || claimed[0].RunID != ids[3] {
		t.Fatalf("the claim after the probe: %d runs, %v; want the run that was below the floor", len(claimed), err)
	}
}

func TestAClaimCutShortByARateLimitSaysWhenTheWindowAdmitsAgainAndOneItDidNotCutDoesNot(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, rate, rate_period_ms)
		VALUES ('default', 'tight', 2, 60000), ('default', 'loose', 100, 60000)`); err != nil {
		t.Fatal(err)
	}
	for _, wt := range []string{"tight", "loose"} {
		ids := make([]uuid.UUID, 5)
		for i := range ids {
			ids[i] = uuid.Must(uuid.NewV7())
		}
		if err := InsertRuns(ctx, pool, "default", wt, nil, ids, [][]byte{[]byte(`1`), []byte(`2`), []byte(`3`), []byte(`4`), []byte(`5`)},
			make([][]byte, 5), time.Time{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	claimed, report, err := ClaimRuns(ctx, pool, testClaimer("tight"), 10)
	// The window of a minute admits again a minute after the claim, give or take a
	// tenth of it (its slots).
	if err != nil || len(claimed) != 2 || report.RateNext.Before(time.Now().Add(50*time.Second)) ||
		report.RateNext.After(time.Now().Add(70*time.Second)) {
		t.Fatalf("the claim of the rate-limited type: %d runs, %+v, %v; want 2 and the window's next admission in a minute", len(claimed), report, err)
	}
	claimed, report, err = ClaimRuns(ctx, pool, testClaimer("loose"), 10)
	if err != nil || len(claimed) != 5 || !report.RateNext.IsZero() {
		t.Fatalf("the claim the rate did not cut: %d runs, %+v, %v; want 5 and no hold", len(claimed), report, err)
	}
}

func TestAKeyedClaimReadsTheKeyQueueFromItsFloorAndReturnsTheNextOne(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	setLimit(t, pool, "key_concurrency", 1)
	// Two runs of key a, one of key b, started three, two and a half and two minutes ago.
	insert := func(key string, ago time.Duration) uuid.UUID {
		t.Helper()
		id := queueKeyed(t, pool, key, 1)[0]
		if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET available_at = now() - $2::bigint * interval '1 microsecond'
			WHERE run_id = $1`, id, ago.Microseconds()); err != nil {
			t.Fatal(err)
		}
		return id
	}
	a1, a2, b := insert("a", 3*time.Minute), insert("a", 150*time.Second), insert("b", 2*time.Minute)
	var a2At time.Time
	if err := pool.QueryRow(ctx, `SELECT available_at FROM kagzi.runs WHERE run_id = $1`, a2).Scan(&a2At); err != nil {
		t.Fatal(err)
	}
	c := testClaimer("wf")
	c.Floors, c.KeyFloors = NewFloors(), NewFloors()
	// Key a admits one: a2 stays queued. The claim's floor is a second before the
	// earliest run queued when it began (a1); the next claim's, a second before a2.
	claimed, _, err := ClaimRuns(ctx, pool, c, 10)
	if err != nil || len(claimed) != 2 || claimed[0].RunID != a1 || claimed[1].RunID != b {
		t.Fatalf("the first claim: %d runs, %v; want a1 and b", len(claimed), err)
	}
	if claimed, _, err := ClaimRuns(ctx, pool, c, 10); err != nil || len(claimed) != 0 {
		t.Fatalf("the claim while key a is full: %d runs, %v; want none", len(claimed), err)
	}
	floor, ok := c.KeyFloors.Of("wf")
	if want := a2At.Add(-time.Second); !ok || !floor.Equal(want) {
		t.Fatalf("the key queue's floor: %v (set: %v), want %v, a second before the queued run", floor, ok, want)
	}
	// a1 ends; a run of key d queued an hour ago (as a start that committed late) lies
	// below the floor: the claim takes a2, not d, until the floor is lowered (as the
	// start's notification or the probe does).
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'COMPLETED', finished_at = now() WHERE run_id = $1`, a1); err != nil {
		t.Fatal(err)
	}
	d := insert("d", time.Hour)
	claimed, _, err = ClaimRuns(ctx, pool, c, 10)
	if err != nil || len(claimed) != 1 || claimed[0].RunID != a2 {
		t.Fatalf("the claim from the key floor: %d runs, %v; want a2 only", len(claimed), err)
	}
	claimed, _, err = ClaimRuns(ctx, pool, c, 10)
	if err != nil || len(claimed) != 0 {
		t.Fatalf("the next claim from the key floor: %d runs, %v; want none", len(claimed), err)
	}
	// Nothing queued from the floor on: the floor is a second before the claim's now().
	if f, ok := c.KeyFloors.Of("wf"); !ok || f.Before(time.Now().Add(-time.Minute)) {
		t.Fatalf("the key queue's floor with nothing queued above it: %v (set: %v), want about a second ago", f, ok)
	}
	lowered, err := ProbeBelowFloors(ctx, pool, c)
	if err != nil || !lowered {
		t.Fatalf("the probe: lowered %v, %v; want the key queue's floor lowered to the run below it", lowered, err)
	}
	claimed, _, err = ClaimRuns(ctx, pool, c, 10)
	if err != nil || len(claimed) != 1 || claimed[0].RunID != d {
		t.Fatalf("the claim after the probe: %d runs, %v; want d, which was below the floor", len(claimed), err)
	}
}

func TestAClaimReadsTheRingOfKeysFromTheKeyFloorUntilABacklogMakesItScanTheKeyQueue(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	setLimit(t, pool, "key_concurrency", 1)
	queue := func(key string, n int) []uuid.UUID { return queueKeyed(t, pool, key, n) }
	c := testClaimer("wf")
	c.Floors, c.KeyFloors, c.KeyScans = NewFloors(), NewFloors(), map[string]bool{}
	claim := func(want ...uuid.UUID) {
		t.Helper()
		claimed, _, err := ClaimRuns(ctx, pool, c, 10)
		if err != nil || len(claimed) != len(want) {
			t.Fatalf("the claim: %d runs, %v; want %d", len(claimed), err, len(want))
		}
		for i, r := range claimed {
			if r.RunID != want[i] {
				t.Fatalf("the claim's run %d is %v, want %v", i, r.RunID, want[i])
			}
		}
	}
	// Few runs queued: the keys come from the key floor, and stay so.
	a, b := queue("a", 2), queue("b", 1)
	claim(a[0], b[0])
	if c.KeyScans["wf"] {
		t.Fatal("after a claim that found 3 runs queued, the next one scans the key queue; want it to read the keys from the floor")
	}
	// A backlog of 1,200 runs of key c: the read from the floor gives up at 1,000, the
	// claim walks the ring with the skip scan and takes c's head all the same, and the
	// next claim scans.
	backlog := queue("c", 1200)
	claim(backlog[0])
	if !c.KeyScans["wf"] {
		t.Fatal("after a claim that found 1,200 runs queued, the next one reads the keys from the floor; want it to scan")
	}
	// The backlog ends: nothing queued, and the next claim reads from the floor again.
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'CANCELLED', finished_at = now() WHERE flow_key IN ('a', 'b', 'c')`); err != nil {
		t.Fatal(err)
	}
	claim()
	if c.KeyScans["wf"] {
		t.Fatal("after a claim that found nothing queued, the next one scans the key queue; want it to read the keys from the floor")
	}
	// Runs queued after that are claimed from the floor, each key's head.
	d, e := queue("d", 2), queue("e", 1)
	claim(d[0], e[0])
}

func TestAClaimsSecondPassTakesMoreOnlyFromTheKeysThatGaveTheirWholeShare(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	setLimit(t, pool, "key_concurrency", 5)
	queueKeyed(t, pool, "a", 6)
	queueKeyed(t, pool, "b", 1)
	// Room for 10 among two keys and the runs of no key: a share of 4 each. Key a gives
	// its 4 and has room for one more (its limit is 5), key b gives its only run: the
	// second pass takes a's fifth.
	claimed, _, err := ClaimRuns(ctx, pool, testClaimer("wf"), 10)
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	for _, r := range claimed {
		per[r.ConcurrencyKey]++
	}
	if per["a"] != 5 || per["b"] != 1 || len(claimed) != 6 {
		t.Fatalf("the claim took %v, want 5 of key a (its limit) and 1 of key b", per)
	}
}

// setLimit sets one limit of the type wf in the default namespace (a column of
// kagzi.flow_limits: concurrency, key_concurrency, ...).
func setLimit(t *testing.T, pool DBTX, column string, n int) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `INSERT INTO kagzi.flow_limits (namespace, workflow_type, `+column+`)
		VALUES ('default', 'wf', $1)`, n); err != nil {
		t.Fatal(err)
	}
}

// queueKeyed starts n runs of wf in the concurrency key and returns their ids.
func queueKeyed(t *testing.T, pool DBTX, key string, n int) []uuid.UUID {
	t.Helper()
	ids := make([]uuid.UUID, n)
	inputs := make([][]byte, n)
	for i := range ids {
		ids[i], inputs[i] = uuid.Must(uuid.NewV7()), []byte(`1`)
	}
	if err := InsertManyRuns(context.Background(), pool, ManyRuns{Namespace: "default", WorkflowType: "wf", IDs: ids,
		Inputs: inputs, Carriers: make([][]byte, n), FlowKey: key}); err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestEachClaimDrawsATokenOfItsOwnAndLeavesTheSessionsCommitSettingAlone(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	ids := []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())}
	inputs := [][]byte{[]byte(`1`), []byte(`2`), []byte(`3`)}
	if err := InsertRuns(ctx, pool, "default", "wf", nil, ids, inputs, make([][]byte, 3), time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	first, _, err := ClaimRuns(ctx, conn, testClaimer("wf"), 2)
	if err != nil || len(first) != 2 {
		t.Fatalf("first claim: %d runs, %v; want 2", len(first), err)
	}
	second, _, err := ClaimRuns(ctx, conn, testClaimer("wf"), 2)
	if err != nil || len(second) != 1 {
		t.Fatalf("second claim: %d runs, %v; want 1", len(second), err)
	}
	if first[0].Token == uuid.Nil || first[1].Token != first[0].Token || second[0].Token == first[0].Token {
		t.Fatalf("tokens %s, %s (one claim) and %s (another): want one per claim, set", first[0].Token, first[1].Token,
			second[0].Token)
	}
	for _, c := range append(first, second...) {
		var stored uuid.UUID
		if err := conn.QueryRow(ctx, `SELECT lease_token FROM kagzi.runs WHERE run_id = $1`, c.RunID).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if stored != c.Token {
			t.Fatalf("run %s holds the token %s, its claim returned %s", c.RunID, stored, c.Token)
		}
	}
	// A fence with the right epoch and another claim's token records nothing.
	stolen := first[0].Fence
	stolen.Token = second[0].Token
	if _, err := FinishRun(ctx, Direct(conn), FinishWrite{Fence: stolen, Status: "COMPLETED"}); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("an end under another claim's token: %v, want ErrLeaseLost", err)
	}
	if _, err := FinishRun(ctx, Direct(conn), FinishWrite{Fence: first[0].Fence, Status: "COMPLETED"}); err != nil {
		t.Fatalf("an end under its claim's fence: %v", err)
	}
	// The claims did not wait for their flush, in their own transactions only.
	var setting, token string
	if err := conn.QueryRow(ctx, `SELECT current_setting('synchronous_commit'),
		coalesce(current_setting('kagzi.lease_token', true), '')`).Scan(&setting, &token); err != nil {
		t.Fatal(err)
	}
	if setting != "on" || token != "" {
		t.Fatalf("after the claims the session has synchronous_commit %q and kagzi.lease_token %q, want on and none",
			setting, token)
	}
}

func TestAClaimOfSeveralTypesPinsEachRunToItsOwnTypesVersionWhenTheirTimesTie(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	// Runs of two types started in one transaction: the same available_at, no version.
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input, available_at)
		SELECT gen_random_uuid(), 'default', 'id-' || i, CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END, 'PENDING', '1',
			timestamptz '2026-01-01 00:00:00+00'
		FROM generate_series(1, 40) i`); err != nil {
		t.Fatal(err)
	}
	c := Claimer{Namespace: "default", Types: []string{"a", "b"}, Versions: []string{"va", "vb"}, WorkerID: "w",
		Lease: time.Minute, Cursors: map[string]string{}}
	claimed, _, err := ClaimRuns(ctx, pool, c, 40)
	if err != nil || len(claimed) != 40 {
		t.Fatalf("claimed %d runs, %v; want 40", len(claimed), err)
	}
	for _, r := range claimed {
		if want := "v" + r.WorkflowType; r.Version != want {
			t.Fatalf("a run of type %s was claimed at version %q, want %q", r.WorkflowType, r.Version, want)
		}
	}
	var wrong int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.runs WHERE version IS DISTINCT FROM 'v' || workflow_type`).Scan(&wrong); err != nil || wrong != 0 {
		t.Fatalf("%d runs hold another type's version (%v)", wrong, err)
	}
}

// The claim statements write their update themselves (claimUpdateSQL) and kagzi.claim
// calls kagzi.claim_runs: both must leave a claimed run as the other does, a new run
// and one taken over alike, holding a type slot or not (a migration that changes the
// function changes claimUpdateSQL too).
func TestTheClaimStatementsClaimARunAsKagziClaimRunsDoes(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, concurrency)
		VALUES ('default', 'limited', 100), ('default', 'limited-f', 100)`); err != nil {
		t.Fatal(err)
	}
	// Per type: a new run, and one whose worker's lease passed (a takeover), left with
	// what a sleep and a signal wait leave behind.
	runsOf := func(typ string) (fresh, takenOver uuid.UUID) {
		ids := []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())}
		if err := InsertRuns(ctx, pool, "default", typ, nil, ids, [][]byte{[]byte(`1`), []byte(`2`)}, make([][]byte, 2),
			time.Time{}, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'RUNNING', lease_epoch = 2, takeovers = 1,
			locked_by = 'gone', available_at = now() - interval '1 minute', started_at = now() - interval '2 minutes',
			waiting_signal = 'sig', wake_pending = true, version = 'v1' WHERE run_id = $1`, ids[1]); err != nil {
			t.Fatal(err)
		}
		return ids[0], ids[1]
	}
	// What a claim leaves, without the run's own identity and times.
	state := func(id uuid.UUID) string {
		var s string
		if err := pool.QueryRow(ctx, `SELECT concat_ws(' ', status, locked_by, lease_epoch, lease_token IS NOT NULL,
			started_at IS NOT NULL, available_at > now() + interval '50 seconds', coalesce(waiting_signal, '-'),
			wake_pending, version, takeovers, holds_type_slot) FROM kagzi.runs WHERE run_id = $1`, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, c := range []struct {
		typ, viaFunction string
		holds            bool
	}{{"plain", "plain-f", false}, {"limited", "limited-f", true}} {
		fresh, takenOver := runsOf(c.typ)
		freshF, takenOverF := runsOf(c.viaFunction)
		claimer := testClaimer(c.typ)
		claimer.Limited = map[string]bool{}
		if c.holds {
			claimer.Limited[c.typ] = true // claimLimitedSQL's way
		}
		claimed, _, err := ClaimRuns(ctx, pool, claimer, 10)
		if err != nil || len(claimed) != 2 {
			t.Fatalf("%s: claimed %d runs (%v), want 2", c.typ, len(claimed), err)
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SELECT set_config('kagzi.lease_token', $1, true)`, uuid.NewString()); err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, `SELECT run_id FROM kagzi.claim_runs($1, $2, 'w', 60000, $3)`,
			[]uuid.UUID{freshF, takenOverF}, []string{"v1", "v1"}, c.holds)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil || len(ids) != 2 {
			t.Fatalf("%s: kagzi.claim_runs claimed %d runs (%v), want 2", c.viaFunction, len(ids), err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		for _, pair := range [][2]uuid.UUID{{fresh, freshF}, {takenOver, takenOverF}} {
			if got, want := state(pair[0]), state(pair[1]); got != want {
				t.Errorf("%s: the claim statement left %q, kagzi.claim_runs %q", c.typ, got, want)
			}
		}
		for _, r := range claimed {
			if r.HoldsSlot != c.holds || r.Takeovers != map[bool]int{true: 2, false: 0}[r.RunID == takenOver] {
				t.Errorf("%s: claimed %+v, want holds %v and one more takeover for the run taken over", c.typ, r, c.holds)
			}
		}
	}
}

func TestAClaimTakesRunsAheadOnlyForTypesWithoutLimitsAndItsFloorSkipsNoRun(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, concurrency)
		VALUES ('default', 'limited', 100)`); err != nil {
		t.Fatal(err)
	}
	ids := map[string][]uuid.UUID{}
	for _, wt := range []string{"plain", "limited"} {
		ids[wt] = make([]uuid.UUID, 20)
		inputs := make([][]byte, 20)
		for i := range ids[wt] {
			ids[wt][i], inputs[i] = uuid.Must(uuid.NewV7()), []byte(`1`)
		}
		if err := InsertRuns(ctx, pool, "default", wt, nil, ids[wt], inputs, make([][]byte, 20), time.Time{}, nil); err != nil {
			t.Fatal(err)
		}
		// A millisecond apart, in start order.
		if _, err := pool.Exec(ctx, `UPDATE kagzi.runs r SET available_at = now() - interval '1 minute'
			+ o.n * interval '1 millisecond' FROM unnest($1::uuid[]) WITH ORDINALITY AS o(id, n) WHERE r.run_id = o.id`,
			ids[wt]); err != nil {
			t.Fatal(err)
		}
	}
	claimAll := func(c Claimer, limit int, want int, wantAsked int) []ClaimedRun {
		t.Helper()
		claimed, report, err := ClaimRuns(ctx, pool, c, limit)
		if short := c.Types[0] == "plain"; report.Short != short {
			t.Fatalf("a claim of %v: short %v, want %v (only claimSQL's short way takes runs ahead)", c.Types, report.Short, short)
		}
		if limited := c.Types[0] == "limited"; report.Limited[c.Types[0]] != limited || (!limited && report.Limited != nil) {
			t.Fatalf("a claim of %v: limited types %v; want only the type with limits", c.Types, report.Limited)
		}
		if err != nil || len(claimed) != want || report.Asked != wantAsked {
			t.Fatalf("a claim of %v, limit %d, %d ahead: %d runs, asked %d, %v; want %d runs, asked %d",
				c.Types, limit, c.Ahead, len(claimed), report.Asked, err, want, wantAsked)
		}
		return claimed
	}
	inOrder := func(claimed []ClaimedRun, from []uuid.UUID) {
		t.Helper()
		for i, r := range claimed {
			if r.RunID != from[i] {
				t.Fatalf("claimed run %d is %v, want %v (the runs in start order)", i, r.RunID, from[i])
			}
		}
	}
	c := testClaimer("plain")
	c.Floors, c.Ahead = NewFloors(), 5
	// The short way: the limit and five ahead, from the floor on.
	inOrder(claimAll(c, 3, 8, 8), ids["plain"])
	// With no free slot, the runs ahead only; the floor that the claim of eight left
	// skipped none.
	inOrder(claimAll(c, 0, 5, 5), ids["plain"][8:])
	inOrder(claimAll(c, 10, 7, 15), ids["plain"][13:])

	// A limited type's claim goes through kagzi.claim: never ahead, and not at all
	// without a free slot.
	l := testClaimer("limited")
	l.Ahead = 5
	claimAll(l, 0, 0, 0)
	inOrder(claimAll(l, 3, 3, 3), ids["limited"])
	// Nor by the short way of types limited in concurrency only (claimLimitedSQL).
	l.Limited = map[string]bool{"limited": true}
	inOrder(claimAll(l, 3, 3, 3), ids["limited"][3:])
	var running int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.runs WHERE workflow_type = 'limited' AND status = 'RUNNING'`).
		Scan(&running); err != nil || running != 6 {
		t.Fatalf("the limited type's runs claimed: %d, %v; want 6", running, err)
	}
}
