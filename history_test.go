package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/store"
)

type archIn struct {
	N    int  `json:"n"`
	Fail bool `json:"fail"`
}

// archived is a workflow that leaves something in every table that moves into the
// history: steps (one retried), an event, attributes, and a signal it receives.
var archivedFails sync.Map // workflow id -> true: its "flaky" step fails

var archived = kagzi.Define("archived", func(ctx *kagzi.Context, in archIn) (string, error) {
	v, err := kagzi.Step(ctx, "double", func(context.Context) (int, error) { return in.N * 2, nil })
	if err != nil {
		return "", err
	}
	if err := ctx.SetEvent("progress", v); err != nil {
		return "", err
	}
	if err := ctx.SetAttributes(map[string]any{"batch": "archive-test"}); err != nil {
		return "", err
	}
	note, err := kagzi.WaitSignal[string](ctx, "note", time.Minute)
	if err != nil {
		return "", err
	}
	if in.Fail {
		_, err := kagzi.Step(ctx, "flaky", func(context.Context) (int, error) {
			if fail, _ := archivedFails.Load(ctx.WorkflowID()); fail == true {
				return 0, kagzi.NonRetryable(errors.New("told to fail"))
			}
			return 1, nil
		})
		if err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("%d %s", v, note), nil
})

// archivingClient is a client whose finished runs move into the history at once.
func archivingClient(t *testing.T, e *env, retention time.Duration) *kagzi.Client {
	t.Helper()
	c, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), ArchiveAfter: time.Millisecond, Retention: retention})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// runArchived runs the archived workflow with in to its end (its signal sent), and
// returns the run.
func runArchived(t *testing.T, ctx context.Context, c *kagzi.Client, in archIn, opts ...kagzi.StartOption) *kagzi.Run[string] {
	t.Helper()
	run, err := kagzi.Start(ctx, c, archived, in, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Signal(ctx, run.RunID, "note", "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := run.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	return run
}

func archivingWorker(t *testing.T, c *kagzi.Client) (*kagzi.Worker, func()) {
	t.Helper()
	cfg := fastWorker()
	cfg.PruneInterval = 50 * time.Millisecond
	return startWorker(t, c, cfg, archived)
}

func TestArchivedRunsAreReadRerunAndStartedAgainstAsBefore(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	c := archivingClient(t, e, 0)
	w, stop := archivingWorker(t, c)
	defer stop()

	ok, err := kagzi.Start(ctx, c, archived, archIn{N: 21}, kagzi.WithID("arch-ok"), kagzi.WithIDReuse(kagzi.IDReuseNever))
	if err != nil {
		t.Fatal(err)
	}
	archivedFails.Store("arch-bad", true)
	bad, err := kagzi.Start(ctx, c, archived, archIn{N: 1, Fail: true}, kagzi.WithID("arch-bad"))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{ok.RunID, bad.RunID} {
		if err := c.Signal(ctx, id, "note", "hi", kagzi.SignalKey("k-"+id)); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := ok.Wait(ctx); err != nil || out != "42 hi" {
		t.Fatalf("ok run: %q, %v", out, err)
	}
	if _, err := bad.Wait(ctx); err == nil {
		t.Fatal("the failing run completed")
	}
	eventually(t, "both runs to move into the history", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs`) == 0 && w.ArchivedRuns() == 2
	})
	for _, table := range []string{"steps", "step_attempts", "signals", "events", "runs_created"} {
		if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.`+table); n != 0 {
			t.Errorf("%d rows left in kagzi.%s after archiving", n, table)
		}
		if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.`+table+`_history`); n == 0 {
			t.Errorf("nothing moved into kagzi.%s_history", table)
		}
	}
	day := time.Now().UTC().Truncate(24 * time.Hour)
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.`+store.HistoryPartitionName("runs_history", day)); n != 2 {
		t.Fatalf("today's partition of runs_history holds %d runs, want 2", n)
	}

	// Every read finds the archived runs as it found them live.
	info, err := c.GetRun(ctx, ok.RunID)
	if err != nil || info.Status != kagzi.StatusCompleted || info.Attributes["batch"] != "archive-test" {
		t.Fatalf("GetRun of an archived run: %+v, %v", info, err)
	}
	if out, err := kagzi.RunOf[string](c, ok.RunID).Wait(ctx); err != nil || out != "42 hi" {
		t.Fatalf("Wait on an archived run: %q, %v", out, err)
	}
	if byID, err := c.GetRunByWorkflowID(ctx, "arch-ok"); err != nil || byID.RunID != ok.RunID {
		t.Fatalf("GetRunByWorkflowID of an archived run: %+v, %v", byID, err)
	}
	if steps := stepsOf(t, c, bad.RunID); len(steps) < 3 {
		t.Fatalf("archived run's steps: %+v", steps)
	}
	if v, err := kagzi.GetEvent[int](ctx, c, ok.RunID, "progress"); err != nil || v != 42 {
		t.Fatalf("archived run's event: %v, %v", v, err)
	}
	if sigs, err := c.ListSignals(ctx, ok.RunID, kagzi.ListOptions{}); err != nil || len(sigs.Signals) != 1 {
		t.Fatalf("archived run's signals: %+v, %v", sigs, err)
	}
	page, err := c.ListRuns(ctx, kagzi.RunFilter{})
	if err != nil || len(page.Runs) != 2 || page.Runs[0].RunID != bad.RunID || page.Runs[1].RunID != ok.RunID {
		t.Fatalf("ListRuns over archived runs: %+v, %v", page, err)
	}
	if page, err := c.ListRuns(ctx, kagzi.RunFilter{Attributes: map[string]any{"batch": "archive-test"}}); err != nil || len(page.Runs) != 2 {
		t.Fatalf("ListRuns by attributes over archived runs: %+v, %v", page, err)
	}
	if err := c.Cancel(ctx, ok.RunID); !errors.Is(err, kagzi.ErrRunFinished) {
		t.Fatalf("Cancel of an archived run: %v, want ErrRunFinished", err)
	}
	if err := c.Signal(ctx, ok.RunID, "note", "late"); !errors.Is(err, kagzi.ErrRunFinished) {
		t.Fatalf("Signal to an archived run: %v, want ErrRunFinished", err)
	}
	// IDReuseNever: the archived run still holds its workflow id.
	again, err := kagzi.Start(ctx, c, archived, archIn{N: 5}, kagzi.WithID("arch-ok"), kagzi.WithIDReuse(kagzi.IDReuseNever))
	if err != nil || !again.AlreadyExists || again.RunID != ok.RunID {
		t.Fatalf("IDReuseNever start of an archived run's id: %+v, %v", again, err)
	}

	// A fork copies the archived run's steps before the signal wait, replays them and
	// waits for a signal of its own.
	fork, err := c.Fork(ctx, ok.RunID, "note#1", kagzi.ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Signal(ctx, fork.RunID, "note", "forked"); err != nil {
		t.Fatal(err)
	}
	if out, err := kagzi.RunOf[string](c, fork.RunID).Wait(ctx); err != nil || out != "42 forked" {
		t.Fatalf("fork of an archived run: %q, %v", out, err)
	}
	if steps := stepsOf(t, c, fork.RunID); len(steps) < 4 {
		t.Fatalf("the fork has %d steps, want the copied ones and its own", len(steps))
	}

	// A rerun moves the run back into the live tables and runs it again.
	archivedFails.Store("arch-bad", false)
	if err := c.Rerun(ctx, bad.RunID); err != nil {
		t.Fatal(err)
	}
	if out, err := kagzi.RunOf[string](c, bad.RunID).Wait(ctx); err != nil || out != "2 hi" {
		t.Fatalf("rerun of an archived run: %q, %v", out, err)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs_history WHERE run_id = $1`, bad.RunID); n > 1 {
		t.Fatalf("the rerun run is %d times in the history", n)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs_all WHERE run_id = $1`, bad.RunID); n != 1 {
		t.Fatalf("the rerun run appears %d times, want once", n)
	}
}

func TestRetentionDropsTheHistoryPartitionsOfExpiredDaysAndNothingNewer(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	// Four runs finish (and stay live: the default ArchiveAfter); their finish times
	// are moved back 40 and 2 days; then a client with a long retention archives them
	// into the partitions of those days.
	stopPlain := runWorker(t, e.client, fastWorker(), archived)
	var ids []string
	for i := range 4 {
		run, err := kagzi.Start(ctx, e.client, archived, archIn{N: i},
			kagzi.WithID(fmt.Sprintf("ret-%d", i)), kagzi.WithIDReuse(kagzi.IDReuseNever))
		if err != nil {
			t.Fatal(err)
		}
		if err := e.client.Signal(ctx, run.RunID, "note", "x"); err != nil {
			t.Fatal(err)
		}
		if _, err := run.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, run.RunID)
	}
	stopPlain()
	for i, id := range ids {
		age := 40 * 24 * time.Hour
		if i >= 2 {
			age = 2 * 24 * time.Hour
		}
		if _, err := e.pool.Exec(ctx, `UPDATE kagzi.runs SET finished_at = now() - $2 * interval '1 millisecond'
			WHERE run_id = $1`, id, age.Milliseconds()); err != nil {
			t.Fatal(err)
		}
	}
	long := archivingClient(t, e, 60*24*time.Hour)
	w, stop := archivingWorker(t, long)
	eventually(t, "the runs to move into the history", func() bool { return w.ArchivedRuns() == 4 })
	stop()
	old := time.Now().Add(-40 * 24 * time.Hour).UTC().Truncate(24 * time.Hour)
	partition := func(table string) int {
		return countRows(t, e.pool, `SELECT count(*) FROM pg_class WHERE relnamespace = 'kagzi'::regnamespace AND relname = $1`,
			store.HistoryPartitionName(table, old))
	}
	for _, table := range store.HistoryTables {
		if partition(table) != 1 {
			t.Fatalf("no partition of %s for 40 days ago", table)
		}
	}

	// The same namespace's retention drops to 30 days: the partitions of 40 days ago go.
	short := archivingClient(t, e, 30*24*time.Hour)
	w, stop = archivingWorker(t, short)
	defer stop()
	eventually(t, "the expired partitions to be dropped", func() bool {
		for _, table := range store.HistoryTables {
			if partition(table) != 0 {
				return false
			}
		}
		return w.DroppedHistoryPartitions() >= int64(len(store.HistoryTables))
	})
	two := time.Now().Add(-2 * 24 * time.Hour).UTC().Truncate(24 * time.Hour)
	for _, table := range store.HistoryTables {
		if n := countRows(t, e.pool, `SELECT count(*) FROM pg_class WHERE relnamespace = 'kagzi'::regnamespace AND relname = $1`,
			store.HistoryPartitionName(table, two)); n != 1 {
			t.Fatalf("the partition of %s for 2 days ago was dropped", table)
		}
	}
	for i, id := range ids {
		_, err := short.GetRun(ctx, id)
		if i < 2 && !errors.Is(err, kagzi.ErrNotFound) {
			t.Fatalf("run finished 40 days ago: %v, want ErrNotFound", err)
		}
		if i >= 2 && err != nil {
			t.Fatalf("run finished 2 days ago is gone: %v", err)
		}
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.steps_history`); n == 0 {
		t.Fatal("the steps of the runs finished 2 days ago went too")
	}
	// The workflow ids of the dropped days' runs are free again for IDReuseNever; the
	// others still hold theirs.
	eventually(t, "the dropped runs' workflow ids to leave kagzi.history_ids", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.history_ids WHERE workflow_id IN ('ret-0', 'ret-1')`) == 0
	})
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.history_ids WHERE workflow_id IN ('ret-2', 'ret-3')`); n != 2 {
		t.Fatalf("%d workflow ids of runs finished 2 days ago in kagzi.history_ids, want 2", n)
	}
	fresh, err := kagzi.Start(ctx, short, archived, archIn{N: 9}, kagzi.WithID("ret-0"), kagzi.WithIDReuse(kagzi.IDReuseNever))
	if err != nil || fresh.AlreadyExists || fresh.RunID == ids[0] {
		t.Fatalf("IDReuseNever start of a dropped run's id: %+v, %v; want a new run", fresh, err)
	}
	kept, err := kagzi.Start(ctx, short, archived, archIn{N: 9}, kagzi.WithID("ret-2"), kagzi.WithIDReuse(kagzi.IDReuseNever))
	if err != nil || !kept.AlreadyExists || kept.RunID != ids[2] {
		t.Fatalf("IDReuseNever start of a retained archived run's id: %+v, %v; want run %s", kept, err, ids[2])
	}
}

// TestAnArchivedRunHoldsItsIDReuseNeverIDUntilItsHistoryRowGoes: a start with
// IDReuseNever finds an archived run through kagzi.history_ids, and gets the whole run;
// a restore (rerun) takes the id's row out with the run, and a row whose run went from
// the history all the same frees the id and is deleted by the start that finds it.
func TestAnArchivedRunHoldsItsIDReuseNeverIDUntilItsHistoryRowGoes(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	c := archivingClient(t, e, 0)
	w, stop := archivingWorker(t, c)
	// keep-a fails (so that it can be rerun), the others complete.
	archivedFails.Store("keep-a", true)
	start := func(id string) *kagzi.Run[string] {
		t.Helper()
		run, err := kagzi.Start(ctx, c, archived, archIn{N: 1, Fail: id == "keep-a"}, kagzi.WithID(id),
			kagzi.WithIDReuse(kagzi.IDReuseNever))
		if err != nil {
			t.Fatal(err)
		}
		return run
	}
	finish := func(run *kagzi.Run[string]) {
		t.Helper()
		if err := c.Signal(ctx, run.RunID, "note", "x"); err != nil {
			t.Fatal(err)
		}
		if _, err := run.Wait(ctx); (err == nil) != (run.WorkflowID != "keep-a") {
			t.Fatalf("run %s ended with %v", run.WorkflowID, err)
		}
	}
	ids := func(id string) int {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.history_ids WHERE workflow_id = $1`, id)
	}
	a, b := start("keep-a"), start("keep-b")
	plain, err := kagzi.Start(ctx, c, archived, archIn{N: 1}, kagzi.WithID("plain-c"))
	if err != nil {
		t.Fatal(err)
	}
	finish(a)
	finish(b)
	finish(plain)
	eventually(t, "the runs to move into the history", func() bool { return w.ArchivedRuns() == 3 })
	if ids("keep-a") != 1 || ids("keep-b") != 1 || ids("plain-c") != 0 {
		t.Fatalf("kagzi.history_ids holds %d, %d and %d rows for keep-a, keep-b and plain-c; want 1, 1, 0",
			ids("keep-a"), ids("keep-b"), ids("plain-c"))
	}

	again := start("keep-a")
	if !again.AlreadyExists || again.RunID != a.RunID || again.WorkflowType != archived.Name() {
		t.Fatalf("IDReuseNever start of an archived run's id: %+v; want run %s of %s", again, a.RunID, archived.Name())
	}
	if info, err := c.GetRun(ctx, again.RunID); err != nil || info.Status != kagzi.StatusFailed {
		t.Fatalf("the archived run it returned: %+v, %v", info, err)
	}

	// A rerun moves the run back into the live tables: its id's row goes with it. (No
	// archiving worker from here on: the rerun run stays live.)
	stop()
	runWorker(t, e.client, fastWorker(), archived)
	archivedFails.Store("keep-a", false)
	if err := c.Rerun(ctx, a.RunID); err != nil {
		t.Fatal(err)
	}
	if n := ids("keep-a"); n != 0 {
		t.Fatalf("%d kagzi.history_ids rows for a run moved back into the live tables, want 0", n)
	}

	// keep-b's history row goes behind the index's back: the id is free.
	if _, err := e.pool.Exec(ctx, `DELETE FROM kagzi.runs_history WHERE run_id = $1`, b.RunID); err != nil {
		t.Fatal(err)
	}
	next := start("keep-b")
	if next.AlreadyExists || next.RunID == b.RunID {
		t.Fatalf("IDReuseNever start of an id whose archived run is gone: %+v; want a new run", next)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.history_ids WHERE run_id = $1`, b.RunID); n != 0 {
		t.Fatalf("the stale kagzi.history_ids row is still there (%d)", n)
	}
	finish(next)
}

func TestARetentionShorterThanAnotherNamespacesDeletesOnlyItsOwnArchivedRuns(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	c := archivingClient(t, e, 0)
	w, stop := archivingWorker(t, c)
	run := runArchived(t, ctx, c, archIn{N: 3}, kagzi.WithID("pruned"), kagzi.WithIDReuse(kagzi.IDReuseNever))
	eventually(t, "the run to move into the history", func() bool { return w.ArchivedRuns() == 1 })
	stop()
	// Another namespace keeps its runs for ever: no partition may be dropped.
	forever, err := kagzi.NewClient(e.pool, kagzi.Config{Namespace: "keeper", Logger: quietLogger(), Retention: -1})
	if err != nil {
		t.Fatal(err)
	}
	kw, kstop := archivingWorker(t, forever)
	defer kstop()
	eventually(t, "the keeper namespace to register its retention", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.history_retention WHERE namespace = 'keeper' AND keep_ms = -1`) == 1
	})
	_ = kw
	// This namespace's retention is a minute: its archived run, finished two minutes
	// ago, is deleted row by row with what moved with it.
	if err := store.EnsureHistoryPartitions(ctx, e.pool, time.Now().Add(-time.Hour), time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE kagzi.runs_history SET finished_at = finished_at - interval '2 minutes' WHERE run_id = $1`,
		run.RunID); err != nil {
		t.Fatal(err)
	}
	for _, table := range store.HistoryTables[1:] {
		if _, err := e.pool.Exec(ctx, `UPDATE kagzi.`+table+` SET run_finished_at = run_finished_at - interval '2 minutes'`); err != nil {
			t.Fatal(err)
		}
	}
	short, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Retention: time.Minute, ArchiveAfter: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sw, sstop := archivingWorker(t, short)
	defer sstop()
	eventually(t, "the archived run past the namespace's retention to be pruned", func() bool { return sw.PrunedRuns() == 1 })
	if _, err := short.GetRun(ctx, run.RunID); !errors.Is(err, kagzi.ErrNotFound) {
		t.Fatalf("pruned archived run: %v, want ErrNotFound", err)
	}
	for _, table := range []string{"steps_history", "signals_history", "events_history", "runs_created_history", "history_ids"} {
		if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.`+table); n != 0 {
			t.Errorf("%d rows left in kagzi.%s", n, table)
		}
	}
	if sw.DroppedHistoryPartitions() != 0 || kw.DroppedHistoryPartitions() != 0 {
		t.Fatal("a partition was dropped while a namespace keeps its runs for ever")
	}
}

func TestADropOfHistoryPartitionsInterruptedMidwayIsFinishedByTheNext(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	old := time.Now().Add(-40 * 24 * time.Hour).UTC().Truncate(24 * time.Hour)
	if err := store.EnsureHistoryPartitions(ctx, e.pool, old, old); err != nil {
		t.Fatal(err)
	}
	// A reader in a transaction that has read the history: a concurrent detach waits for it.
	reader, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback(ctx)
	if _, err := reader.Exec(ctx, `SELECT count(*) FROM kagzi.runs_history`); err != nil {
		t.Fatal(err)
	}
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	pid := conn.Conn().PgConn().PID()
	dropped := make(chan error, 1)
	go func() {
		_, err := store.DropHistoryBefore(ctx, conn.Conn(), time.Now())
		dropped <- err
	}()
	// Once the detach waits for the reader, its first transaction has committed: cancel it.
	eventually(t, "the detach to wait for the reader", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND query LIKE '%DETACH PARTITION%'
			AND wait_event_type = 'Lock'`, pid) == 1
	})
	if _, err := e.pool.Exec(ctx, `SELECT pg_cancel_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	if err := <-dropped; err == nil {
		t.Fatal("the cancelled drop reported no error")
	}
	if err := reader.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM pg_inherits WHERE inhdetachpending`); n != 1 {
		t.Fatalf("%d partitions pending a detach after the interruption, want 1", n)
	}
	// The next drop finishes the pending detach and drops every partition of the day.
	got, err := store.DropHistoryBefore(ctx, e.pool, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(store.HistoryTables) {
		t.Fatalf("the next drop dropped %v, want the day's %d partitions", got, len(store.HistoryTables))
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM pg_class WHERE relnamespace = 'kagzi'::regnamespace AND relname LIKE '%_p`+
		old.Format("20060102")+`'`); n != 0 {
		t.Fatalf("%d partitions of the day left", n)
	}

	// A drop that detached a partition and died before dropping it left a table of
	// its own: the next drop removes it with the rest of its day.
	older := old.Add(-24 * time.Hour)
	if err := store.EnsureHistoryPartitions(ctx, e.pool, older, older); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `ALTER TABLE kagzi.runs_history DETACH PARTITION kagzi.`+
		store.HistoryPartitionName("runs_history", older)); err != nil {
		t.Fatal(err)
	}
	got, err = store.DropHistoryBefore(ctx, e.pool, time.Now())
	if err != nil || len(got) != len(store.HistoryTables) {
		t.Fatalf("the drop after a detached partition dropped %v, %v", got, err)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM pg_class WHERE relnamespace = 'kagzi'::regnamespace AND relname LIKE '%_p`+
		older.Format("20060102")+`'`); n != 0 {
		t.Fatalf("%d tables of the older day left", n)
	}
}

func TestTwoArchivingWorkersMoveEachFinishedRunOnceWithItsSteps(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	stopPlain := runWorker(t, e.client, fastWorker(), greet)
	const n = 300
	for i := range n {
		if _, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "every run to complete", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE status = 'COMPLETED'`) == n
	})
	stopPlain()
	var workers []*kagzi.Worker
	for range 2 {
		c, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), ArchiveAfter: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		cfg := fastWorker()
		cfg.PruneInterval = 10 * time.Millisecond
		w, _ := startWorker(t, c, cfg, greet)
		workers = append(workers, w)
	}
	eventually(t, "every run to move into the history", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs`) == 0
	})
	// A pass counts what it archived once its batches are done: after they commit.
	eventually(t, "the workers to count what they archived", func() bool {
		return workers[0].ArchivedRuns()+workers[1].ArchivedRuns() >= n
	})
	if got := workers[0].ArchivedRuns() + workers[1].ArchivedRuns(); got != n {
		t.Fatalf("the workers archived %d runs, want %d", got, n)
	}
	for _, q := range []string{
		`SELECT count(DISTINCT run_id) FROM kagzi.runs_history`,
		`SELECT count(*) FROM kagzi.runs_all`,
		`SELECT count(*) FROM kagzi.steps_all`,
		`SELECT count(*) FROM kagzi.runs_created_all`,
	} {
		if got := countRows(t, e.pool, q); got != n {
			t.Fatalf("%s = %d, want %d", q, got, n)
		}
	}
}

// Found from outside: a rerun refused for an archived run's status still moved the run
// back into the live tables (and a bulk rerun moved every skipped one).
func TestARefusedRerunOfAnArchivedRunLeavesItInTheHistory(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	c := archivingClient(t, e, 0)
	_, stop := archivingWorker(t, c)
	var ids []string
	for i := range 2 {
		ids = append(ids, runArchived(t, ctx, c, archIn{N: i}).RunID)
	}
	archivedRows := func() int {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs_history WHERE run_id = ANY ($1::uuid[])`, ids)
	}
	eventually(t, "both runs to be archived", func() bool { return archivedRows() == 2 })
	stop() // nothing archives them again: a run moved back would stay live
	if err := c.Rerun(ctx, ids[0]); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Fatalf("a rerun of a COMPLETED archived run: %v, want ErrInvalidArgument", err)
	}
	res, err := c.RerunRuns(ctx, kagzi.RunFilter{WorkflowType: "archived"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Changed != 0 || res.Matched != 2 {
		t.Fatalf("a bulk rerun of COMPLETED archived runs: %+v, want both matched and none changed", res)
	}
	if n := archivedRows(); n != 2 {
		t.Fatalf("%d of the 2 refused runs left in the history, want both", n)
	}
}

// Found from outside: a retention shorter than another namespace's deleted nothing
// unless it was more than an hour shorter.
func TestARetentionOfSecondsBesideAnotherOfAnHourDeletesItsArchivedRuns(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	long, err := kagzi.NewClient(e.pool, kagzi.Config{Namespace: "long", Logger: quietLogger(), Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	_, lstop := archivingWorker(t, long)
	defer lstop()
	eventually(t, "the long namespace to register its retention", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.history_retention WHERE namespace = 'long'`) == 1
	})
	c := archivingClient(t, e, 2*time.Second)
	w, stop := archivingWorker(t, c)
	defer stop()
	run := runArchived(t, ctx, c, archIn{N: 1})
	eventually(t, "the archived run to be deleted after its two seconds", func() bool { return w.PrunedRuns() == 1 })
	if _, err := c.GetRun(ctx, run.RunID); !errors.Is(err, kagzi.ErrNotFound) {
		t.Fatalf("the run past its retention: %v, want ErrNotFound", err)
	}
}

// A namespace that archives while another namespace's worker drops history
// partitions by a shorter retention loses none of its runs: it registers its
// retention before it archives, and a day whose partition holds runs a namespace
// still keeps is not dropped (found from outside: a namespace with runs finished
// days ago in its live tables, archiving for the first time, lost 2-4% of them to
// the other's drops).
func TestANamespaceArchivingBesideAnothersShorterRetentionLosesNoRun(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	const runs = 20000
	// Namespace "long" keeps its runs 10 days; its runs finished 1 hour to 7 days ago
	// wait in the live tables (as after turning archiving on).
	if _, err := e.pool.Exec(ctx, `
		WITH ins AS (
			INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input, output, available_at,
				created_at, started_at, finished_at, updated_at)
			SELECT gen_random_uuid(), 'long', 'long-' || g, 'old', 'COMPLETED', '1', '2', t, t, t, t + interval '1 second', t
			FROM generate_series(1, $1::int) g,
				LATERAL (SELECT now() - interval '1 hour' - (g::float8 / $1) * interval '7 days' AS t) x
			RETURNING namespace, created_at, run_id, workflow_type)
		INSERT INTO kagzi.runs_created SELECT namespace, created_at, run_id, workflow_type FROM ins`, runs); err != nil {
		t.Fatal(err)
	}
	cfg := kagzi.WorkerConfig{PruneInterval: 100 * time.Millisecond, DisableScheduler: true}
	short, err := kagzi.NewClient(e.pool, kagzi.Config{Namespace: "short", Logger: quietLogger(), Retention: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	sw, stopShort := startWorker(t, short, cfg, archived)
	defer stopShort()
	eventually(t, "the short namespace to register its retention", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.history_retention WHERE namespace = 'short'`) == 1
	})
	long, err := kagzi.NewClient(e.pool, kagzi.Config{Namespace: "long", Logger: quietLogger(), Retention: 240 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	lw, stopLong := startWorker(t, long, cfg, archived)
	defer stopLong()
	eventuallyWithin(t, time.Minute, "every run of the long namespace to be archived", func() bool {
		return lw.ArchivedRuns() == runs
	})
	time.Sleep(500 * time.Millisecond) // a few more drop passes of the short namespace
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs_all WHERE namespace = 'long'`); n != runs {
		t.Fatalf("%d of the long namespace's %d runs are left (the short namespace's worker dropped %d partitions)",
			n, runs, sw.DroppedHistoryPartitions())
	}
}

var keptWorkflow = kagzi.Define("kept", func(ctx *kagzi.Context, n int) (int, error) {
	return kagzi.Step(ctx, "s", func(context.Context) (int, error) { return n, nil })
})

// Found from outside: a namespace whose workers had been stopped for a week no longer
// counted, and another namespace's drops took the runs it kept for ever. A
// namespace's registered retention counts however long ago it was registered.
func TestRunsANamespaceKeepsForEverSurviveAnotherNamespacesDropsAfterItsWorkersStoppedForAWeek(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	cfg := fastWorker()
	cfg.PruneInterval = 50 * time.Millisecond
	client := func(ns string, retention, archiveAfter time.Duration) *kagzi.Client {
		c, err := kagzi.NewClient(e.pool, kagzi.Config{Namespace: ns, Logger: quietLogger(), Retention: retention,
			ArchiveAfter: archiveAfter})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	// A run of each namespace, finished two days ago (moved back before any archiving).
	finished := func(c *kagzi.Client) string {
		stop := runWorker(t, c, cfg, keptWorkflow)
		defer stop()
		run, err := kagzi.Start(ctx, c, keptWorkflow, 7)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := run.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := e.pool.Exec(ctx, `UPDATE kagzi.runs SET finished_at = now() - interval '2 days' WHERE run_id = $1`, run.RunID); err != nil {
			t.Fatal(err)
		}
		return run.RunID
	}
	keep, other := client("keep", -1, 0), client("other", time.Hour, 0)
	kept, gone := finished(keep), finished(other)
	// The namespace that keeps its runs for ever archives its run, then its workers
	// stay stopped for eight days.
	w, stop := startWorker(t, client("keep", -1, time.Millisecond), cfg, keptWorkflow)
	eventually(t, "the run to be archived", func() bool { return w.ArchivedRuns() == 1 })
	stop()
	if _, err := e.pool.Exec(ctx, `UPDATE kagzi.history_retention SET updated_at = now() - interval '8 days' WHERE namespace = 'keep'`); err != nil {
		t.Fatal(err)
	}
	// The other namespace, which keeps its runs an hour, archives and prunes.
	ow, _ := startWorker(t, client("other", time.Hour, time.Millisecond), cfg, keptWorkflow)
	eventually(t, "the other namespace's run of two days ago to go", func() bool {
		_, err := other.GetRun(ctx, gone)
		return errors.Is(err, kagzi.ErrNotFound)
	})
	if n := ow.DroppedHistoryPartitions(); n != 0 {
		t.Errorf("%d partitions dropped while a namespace keeps its runs for ever", n)
	}
	if _, err := keep.GetRun(ctx, kept); err != nil {
		t.Fatalf("the run its namespace keeps for ever, archived two days after it finished: %v", err)
	}
}
