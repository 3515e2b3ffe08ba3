package store

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi/internal/testdb"
)

// TestPagesOfRunsNewestFirstAreWholeAndInOrderAcrossTheLiveTablesAndTheHistory
// lists runs created over four days, half of them archived into several days'
// partitions, a few at a time: the pages read first within a day of their start
// (and again unbounded when that does not fill them) must add up to every run, in
// order.
func TestPagesOfRunsNewestFirstAreWholeAndInOrderAcrossTheLiveTablesAndTheHistory(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	const n = 30
	ids := make([]uuid.UUID, n)
	inputs := make([][]byte, n)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7())
		inputs[i] = []byte(`1`)
	}
	if err := InsertRuns(ctx, pool, "default", "wf", nil, ids, inputs, make([][]byte, n), time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	// Run i was created (i+1) × 3 hours ago; the even ones finished a minute after.
	for i, id := range ids {
		age := time.Duration(i+1) * 3 * time.Hour
		if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET created_at = now() - $2 * interval '1 millisecond',
			status = CASE WHEN $3 THEN 'COMPLETED' ELSE status END,
			finished_at = CASE WHEN $3 THEN now() - $2 * interval '1 millisecond' + interval '1 minute' END
			WHERE run_id = $1`, id, age.Milliseconds(), i%2 == 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs_created c SET created_at = r.created_at FROM kagzi.runs r WHERE r.run_id = c.run_id`); err != nil {
		t.Fatal(err)
	}
	if moved, err := ArchiveFinished(ctx, pool, "default", 0, -1, 100); err != nil || moved != n/2 {
		t.Fatalf("archived %d runs, %v; want %d", moved, err, n/2)
	}
	rows, err := pool.Query(ctx, `SELECT run_id FROM kagzi.runs_created_all ORDER BY created_at DESC, run_id DESC`)
	if err != nil {
		t.Fatal(err)
	}
	want, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil || len(want) != n {
		t.Fatalf("%d listing entries, %v", len(want), err)
	}
	for _, size := range []int{1, 4, 7, 50} {
		var got []uuid.UUID
		p := ListRunsParams{Namespace: "default", Limit: size}
		for range n + 1 {
			page, err := ListRuns(ctx, pool, p)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range page {
				got = append(got, r.RunID)
			}
			if len(page) < size {
				break
			}
			last := page[len(page)-1]
			p.AfterCreated, p.AfterRunID = &last.CreatedAt, last.RunID
		}
		if !slices.Equal(got, want) {
			t.Fatalf("pages of %d listed %d runs %v, want %d %v", size, len(got), got, len(want), want)
		}
	}
}

// TestAStartWithIDReuseNeverFindsTheArchivedRunOfItsID checks the idempotency of
// IDReuseNever against the history, with and without a bound on the id's runs'
// creation (a child's derived id).
func TestAStartWithIDReuseNeverFindsTheArchivedRunOfItsID(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	if err := EnsureHistoryPartitions(ctx, pool, time.Now().Add(-10*24*time.Hour), time.Now()); err != nil {
		t.Fatal(err)
	}
	first := NewRun{RunID: uuid.Must(uuid.NewV7()), Namespace: "default", WorkflowID: "parent/child#1",
		WorkflowType: "wf", Input: []byte(`1`), ReuseNever: true}
	run, inserted, err := InsertRun(ctx, pool, first)
	if err != nil || !inserted {
		t.Fatalf("first start: %v, %v", inserted, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'COMPLETED', finished_at = now() - interval '1 minute'
		WHERE run_id = $1`, run.RunID); err != nil {
		t.Fatal(err)
	}
	if moved, err := ArchiveFinished(ctx, pool, "default", 0, -1, 10); err != nil || moved != 1 {
		t.Fatalf("archived %d, %v", moved, err)
	}
	bound := run.CreatedAt.Add(-time.Hour)
	for _, notBefore := range []*time.Time{nil, &bound} {
		again := first
		again.RunID, again.IDNotBefore = uuid.Must(uuid.NewV7()), notBefore
		got, inserted, err := InsertRun(ctx, pool, again)
		if err != nil || inserted || got.RunID != run.RunID || got.Status != "COMPLETED" {
			t.Fatalf("a second start (IDNotBefore %v) = %s %s inserted %v, %v; want the archived run %s",
				notBefore, got.RunID, got.Status, inserted, err, run.RunID)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.runs_all WHERE workflow_id = 'parent/child#1'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d runs of the id, %v; want 1", n, err)
	}
}

// A drop by a horizon computed before a namespace registered a longer retention keeps
// the days whose runs_history partition holds that namespace's runs, in every history
// table, and drops the days only namespaces past their retention hold.
func TestADropKeepsTheDaysHoldingRunsANamespaceStillKeeps(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	day := func(daysAgo int) time.Time {
		return time.Now().UTC().Truncate(24 * time.Hour).Add(-time.Duration(daysAgo) * 24 * time.Hour)
	}
	if err := EnsureHistoryPartitions(ctx, pool, day(6), day(0)); err != nil {
		t.Fatal(err)
	}
	// "keeper" keeps its runs 10 days, "brief" 2 days; "unknown" never registered (30 days).
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.history_retention (namespace, keep_ms) VALUES
		('keeper', 864000000), ('brief', 172800000)`); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		ns      string
		daysAgo int
	}{{"keeper", 5}, {"brief", 4}, {"unknown", 3}, {"brief", 6}} {
		at := day(r.daysAgo).Add(time.Hour)
		if _, err := pool.Exec(ctx, `INSERT INTO kagzi.runs_history (run_id, namespace, workflow_id, workflow_type, status,
			input, available_at, created_at, finished_at, updated_at)
			VALUES ($1, $2, 'w', 't', 'COMPLETED', '1', $3, $3, $3, $3)`, uuid.New(), r.ns, at); err != nil {
			t.Fatal(err)
		}
	}
	// An interrupted drop left the keeper's day detached.
	if _, err := pool.Exec(ctx, `ALTER TABLE kagzi.runs_history DETACH PARTITION kagzi.`+HistoryPartitionName("runs_history", day(5))); err != nil {
		t.Fatal(err)
	}
	dropped, err := DropHistoryBefore(ctx, pool, day(1)) // a horizon of "brief"'s retention alone
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []int{5, 3} {
		for _, table := range HistoryTables {
			if slices.Contains(dropped, HistoryPartitionName(table, day(d))) {
				t.Errorf("dropped %s, which holds runs a namespace still keeps", HistoryPartitionName(table, day(d)))
			}
		}
	}
	for _, d := range []int{6, 4, 2} {
		if !slices.Contains(dropped, HistoryPartitionName("steps_history", day(d))) ||
			!slices.Contains(dropped, HistoryPartitionName("runs_history", day(d))) {
			t.Errorf("kept the partitions of %v, which only runs past their retention hold: dropped %v", day(d), dropped)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.runs_history WHERE namespace IN ('keeper', 'unknown')`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d kept runs readable, %v; want 2", n, err)
	}
}

// A run that finishes before a drop pass's mark is not archived while the pass runs:
// a namespace that registers and archives into a day in the middle of another's pass
// keeps its run whole (found in review: the pass, held up after dropping the day's
// runs partition, dropped the steps and the listing entry of a run archived meanwhile
// into the partitions the archiver made again).
func TestARunIsNotArchivedIntoADayWhileAPassOfDropsRuns(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	day := func(n int) time.Time {
		return time.Now().UTC().Truncate(24 * time.Hour).Add(-time.Duration(n) * 24 * time.Hour)
	}
	d1, d2 := day(5), day(4)
	if err := EnsureHistoryPartitions(ctx, pool, d1, day(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.history_retention (namespace, keep_ms) VALUES ('brief', 172800000)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.runs_history (run_id, namespace, workflow_id, workflow_type, status,
		input, available_at, created_at, finished_at, updated_at) VALUES ($1, 'brief', 'w', 't', 'COMPLETED', '1', $2, $2, $2, $2)`,
		uuid.New(), d2.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if ok, err := TakeHistoryDrops(ctx, pool, "dropper", time.Minute); err != nil || !ok {
		t.Fatalf("the drops' lease: %v, %v", ok, err)
	}
	if err := MarkHistoryDrops(ctx, pool, "dropper", day(1)); err != nil {
		t.Fatal(err)
	}
	// A transaction holds the pass up at day 2, after day 1's runs partition.
	hold, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hold.Rollback(ctx) })
	if _, err := hold.Exec(ctx, `LOCK TABLE kagzi.`+HistoryPartitionName("runs_history", d2)+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := DropHistoryBefore(ctx, pool, day(1))
		done <- err
	}()
	for range 400 {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = $1`,
			HistoryPartitionName("runs_history", d1)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	// "keeper" (10 days) registers and tries to archive a run that finished on day 1.
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.history_retention (namespace, keep_ms) VALUES ('keeper', 864000000)`); err != nil {
		t.Fatal(err)
	}
	id, at := uuid.New(), d1.Add(2*time.Hour)
	if _, err := pool.Exec(ctx, `WITH r AS (INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input,
		output, available_at, created_at, started_at, finished_at, updated_at)
		VALUES ($1, 'keeper', 'k', 't', 'COMPLETED', '1', '2', $2, $2, $2, $2, $2)
		RETURNING namespace, created_at, run_id, workflow_type)
		INSERT INTO kagzi.runs_created SELECT * FROM r`, id, at); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.steps (run_id, step_key, name, kind, status) VALUES ($1, 's#1', 's', 'STEP', 'COMPLETED')`, id); err != nil {
		t.Fatal(err)
	}
	during, cancel := context.WithTimeout(ctx, 20*time.Second) // an archive into the day waits on the pass
	n, err := ArchiveFinished(during, pool, "keeper", time.Second, 240*time.Hour, 10)
	cancel()
	if err != nil || n != 0 {
		t.Fatalf("archived %d runs during the pass, %v; want none before its mark", n, err)
	}
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := ReleaseHistoryDrops(ctx, pool, "dropper"); err != nil {
		t.Fatal(err)
	}
	if n, err := ArchiveFinished(ctx, pool, "keeper", time.Second, 240*time.Hour, 10); err != nil || n != 1 {
		t.Fatalf("archived %d runs after the pass, %v; want the keeper's", n, err)
	}
	var runs, steps, listed int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM kagzi.runs_history WHERE run_id = $1),
		(SELECT count(*) FROM kagzi.steps_history WHERE run_id = $1),
		(SELECT count(*) FROM kagzi.runs_created_history WHERE run_id = $1)`, id).Scan(&runs, &steps, &listed); err != nil {
		t.Fatal(err)
	}
	if runs != 1 || steps != 1 || listed != 1 {
		t.Fatalf("the keeper's archived run: %d run rows, %d steps, %d listing entries; want 1 each", runs, steps, listed)
	}
}

// Two passes of drops at once (one whose lease passed while it waited, and the next)
// both end without an error, and with the next pass they drop every partition once.
func TestTwoPassesOfDropsAtOnceBothEndWithoutAnError(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	day := func(n int) time.Time {
		return time.Now().UTC().Truncate(24 * time.Hour).Add(-time.Duration(n) * 24 * time.Hour)
	}
	if err := EnsureHistoryPartitions(ctx, pool, day(12), day(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.history_retention (namespace, keep_ms) VALUES ('brief', 3600000)`); err != nil {
		t.Fatal(err)
	}
	for d := 12; d >= 2; d-- { // a run of "brief" in every day: each day's check reads its partition
		at := day(d).Add(time.Hour)
		if _, err := pool.Exec(ctx, `INSERT INTO kagzi.runs_history (run_id, namespace, workflow_id, workflow_type, status,
			input, available_at, created_at, finished_at, updated_at) VALUES ($1, 'brief', 'w', 't', 'COMPLETED', '1', $2, $2, $2, $2)`,
			uuid.New(), at); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	seen := map[string]int{}
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			dropped, err := DropHistoryBefore(ctx, pool, day(1))
			mu.Lock()
			for _, name := range dropped {
				seen[name]++
			}
			mu.Unlock()
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("a pass of drops beside another: %v", err)
		}
	}
	// A detach the other pass had under way is left to it, or to the next pass.
	dropped, err := DropHistoryBefore(ctx, pool, day(1))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range dropped {
		seen[name]++
	}
	for d := 12; d >= 2; d-- {
		for _, table := range HistoryTables {
			if name := HistoryPartitionName(table, day(d)); seen[name] != 1 {
				t.Errorf("%s reported dropped %d times, want once", name, seen[name])
			}
		}
	}
}

// A partition an interrupted pass left pending its detach, of a day the next pass
// keeps (its horizon is earlier), is attached again, and so is one left detached:
// the archiver finds the day's partitions (found from outside: every archiving of the
// namespace failed with "no partition found for row" until the day passed the
// retention, up to 30 days).
func TestAPassAttachesAgainThePartitionsOfAKeptDayAnInterruptedPassLeftDetached(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	d := time.Now().UTC().Truncate(24 * time.Hour).Add(-3 * 24 * time.Hour)
	if err := EnsureHistoryPartitions(ctx, pool, d, d); err != nil {
		t.Fatal(err)
	}
	runsPart, stepsPart := HistoryPartitionName("runs_history", d), HistoryPartitionName("steps_history", d)
	// A reader holds the history; a concurrent detach of the day's runs partition
	// waits for it, and is cancelled: the detach is left pending.
	reader, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reader.Rollback(ctx) })
	if _, err := reader.Exec(ctx, `SELECT count(*) FROM kagzi.runs_history`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SET statement_timeout = '500ms'`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ALTER TABLE kagzi.runs_history DETACH PARTITION kagzi.`+runsPart+` CONCURRENTLY`); err == nil {
		t.Fatal("the detach did not wait for the reader")
	}
	conn.Exec(ctx, `RESET statement_timeout`)
	conn.Release()
	if err := reader.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE kagzi.steps_history DETACH PARTITION kagzi.`+stepsPart); err != nil {
		t.Fatal(err)
	}
	state := func(name string) string {
		var s string
		if err := pool.QueryRow(ctx, `SELECT coalesce((SELECT CASE WHEN `+detachPending+` THEN 'pending' ELSE 'attached' END
			FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE c.relname = $1), 'detached')`, name).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if got := state(runsPart); got != "pending" {
		t.Fatalf("the runs partition is %s, want pending its detach", got)
	}
	// The next pass's horizon is a week ago: the day is kept.
	if _, err := DropHistoryBefore(ctx, pool, d.Add(-7*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{runsPart, stepsPart} {
		if got := state(name); got != "attached" {
			t.Errorf("%s is %s after the pass, want attached", name, got)
		}
	}
	// The archiver moves a run of that day, with its step.
	id, at := uuid.New(), d.Add(time.Hour)
	if _, err := pool.Exec(ctx, `WITH r AS (INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input,
		output, available_at, created_at, started_at, finished_at, updated_at)
		VALUES ($1, 'ns', 'k', 't', 'COMPLETED', '1', '2', $2, $2, $2, $2, $2)
		RETURNING namespace, created_at, run_id, workflow_type)
		INSERT INTO kagzi.runs_created SELECT * FROM r`, id, at); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.steps (run_id, step_key, name, kind, status) VALUES ($1, 's#1', 's', 'STEP', 'COMPLETED')`, id); err != nil {
		t.Fatal(err)
	}
	if n, err := ArchiveFinished(ctx, pool, "ns", time.Second, 240*time.Hour, 10); err != nil || n != 1 {
		t.Fatalf("archived %d runs of the day, %v; want 1", n, err)
	}
}
