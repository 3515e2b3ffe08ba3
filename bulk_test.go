package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

// idleWorkflow is a type no worker of these tests runs: its runs stay PENDING.
var idleWorkflow = kagzi.Define("bulk-idle", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })

func statusCounts(t *testing.T, e *env, workflowType string) map[kagzi.RunStatus]int {
	t.Helper()
	rows, err := e.pool.Query(context.Background(),
		`SELECT status, count(*) FROM kagzi.runs WHERE workflow_type = $1 GROUP BY status`, workflowType)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[kagzi.RunStatus]int{}
	for rows.Next() {
		var s kagzi.RunStatus
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		out[s] = n
	}
	return out
}

func checkSum(t *testing.T, res kagzi.BulkResult) {
	t.Helper()
	sum := res.Changed
	for _, n := range res.Skipped {
		sum += n
	}
	if sum != res.Matched {
		t.Fatalf("%+v: changed + skipped = %d, want matched %d", res, sum, res.Matched)
	}
}

func TestCancelRunsCancelsEveryMatchAcrossBatchesAndSkipsFinishedAndCancelledRuns(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	inputs := make([]int, 1203) // more than two batches
	if _, err := kagzi.StartMany(ctx, e.client, idleWorkflow, inputs); err != nil {
		t.Fatal(err)
	}
	quick := kagzi.Define("bulk-quick", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
	runWorker(t, e.client, fastWorker(), quick)
	for i := range 3 {
		run, err := kagzi.Start(ctx, e.client, quick, i)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := run.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cancelled, err := kagzi.Start(ctx, e.client, idleWorkflow, 7)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.client.Cancel(ctx, cancelled.RunID); err != nil {
		t.Fatal(err)
	}

	res, err := e.client.CancelRuns(ctx, kagzi.RunFilter{})
	if err != nil {
		t.Fatal(err)
	}
	checkSum(t, res)
	if res.Matched != 1207 || res.Changed != 1203 || res.Skipped[kagzi.BulkSkipFinished] != 3 ||
		res.Skipped[kagzi.BulkSkipAlreadyCancelled] != 1 {
		t.Fatalf("result %+v, want 1207 matched, 1203 changed, 3 finished, 1 already cancelled", res)
	}
	if len(res.ChangedRunIDs) != kagzi.MaxBulkRunIDs {
		t.Fatalf("%d changed run ids listed, want the first %d", len(res.ChangedRunIDs), kagzi.MaxBulkRunIDs)
	}
	if got := statusCounts(t, e, "bulk-idle"); got[kagzi.StatusCancelled] != 1204 || len(got) != 1 {
		t.Fatalf("idle runs by status %v, want all 1204 CANCELLED", got)
	}
	if got := statusCounts(t, e, "bulk-quick"); got[kagzi.StatusCompleted] != 3 {
		t.Fatalf("quick runs by status %v, want 3 COMPLETED, untouched", got)
	}
}

func TestCancelRunsTouchesOnlyWhatTheFilterMatchesInTheClientsNamespace(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	other := newClient(t, e.pool, "other")
	if _, err := kagzi.StartMany(ctx, e.client, idleWorkflow, make([]int, 5)); err != nil {
		t.Fatal(err)
	}
	if _, err := kagzi.StartMany(ctx, other, idleWorkflow, make([]int, 4)); err != nil {
		t.Fatal(err)
	}
	kept := kagzi.Define("bulk-kept", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
	if _, err := kagzi.StartMany(ctx, e.client, kept, make([]int, 2)); err != nil {
		t.Fatal(err)
	}
	res, err := e.client.CancelRuns(ctx, kagzi.RunFilter{WorkflowType: "bulk-idle", Statuses: []kagzi.RunStatus{kagzi.StatusPending}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched != 5 || res.Changed != 5 {
		t.Fatalf("result %+v, want the namespace's 5 idle runs", res)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE status = 'PENDING'`); n != 6 {
		t.Fatalf("%d runs still PENDING, want 6 (other type, other namespace)", n)
	}
	if _, err := e.client.CancelRuns(ctx, kagzi.RunFilter{PageToken: "x"}); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Fatalf("a page token: %v, want ErrInvalidArgument", err)
	}
}

func TestCancelRunsWhileAWorkerRunsEndsEveryChangedRunCancelledAndLeavesTheFinishedAlone(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	slow := kagzi.Define("bulk-slow", func(ctx *kagzi.Context, n int) (int, error) {
		for i := range 3 {
			if _, err := kagzi.Step(ctx, fmt.Sprint("s", i), func(context.Context) (int, error) {
				time.Sleep(2 * time.Millisecond)
				return i, nil
			}); err != nil {
				return 0, err
			}
		}
		return n, nil
	})
	cfg := fastWorker()
	cfg.MaxConcurrent = 20
	runWorker(t, e.client, cfg, slow)
	if _, err := kagzi.StartMany(ctx, e.client, slow, make([]int, 1500)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the worker to finish some runs", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE status = 'COMPLETED'`) >= 20
	})
	res, err := e.client.CancelRuns(ctx, kagzi.RunFilter{WorkflowType: "bulk-slow"})
	if err != nil {
		t.Fatal(err)
	}
	checkSum(t, res)
	eventually(t, "every run to end", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE status IN ('PENDING', 'RUNNING', 'SLEEPING')`) == 0
	})
	got := statusCounts(t, e, "bulk-slow")
	if res.Matched != 1500 || got[kagzi.StatusCancelled] != res.Changed ||
		got[kagzi.StatusCompleted] != res.Skipped[kagzi.BulkSkipFinished] {
		t.Fatalf("result %+v, runs by status %v: want every changed run CANCELLED, every skipped one COMPLETED", res, got)
	}
	if res.Changed == 0 || res.Skipped[kagzi.BulkSkipFinished] == 0 {
		t.Fatalf("result %+v: the cancel did not race with the worker", res)
	}
}

func TestRerunRunsRerunsFailedAndCancelledRunsOncePerWorkflowIDAndSkipsTheRest(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var broken atomic.Bool
	broken.Store(true)
	flaky := kagzi.Define("bulk-flaky", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Step(ctx, "work", func(context.Context) (int, error) {
			if broken.Load() {
				return 0, kagzi.NonRetryable(errors.New("broken"))
			}
			return n, nil
		})
	})
	runWorker(t, e.client, fastWorker(), flaky)
	runs, err := kagzi.StartMany(ctx, e.client, flaky, make([]int, 600))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		if _, err := r.Wait(ctx); !errors.Is(err, kagzi.ErrWorkflowFailed) {
			t.Fatalf("run %s: %v, want it FAILED", r.RunID, err)
		}
	}
	// Two failed runs of one workflow id, and a completed run.
	for range 2 {
		r, err := kagzi.Start(ctx, e.client, flaky, 1, kagzi.WithID("twice"))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = r.Wait(ctx)
	}
	broken.Store(false)
	done, err := kagzi.Start(ctx, e.client, flaky, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := done.Wait(ctx); err != nil {
		t.Fatal(err)
	}

	res, err := e.client.RerunRuns(ctx, kagzi.RunFilter{WorkflowType: "bulk-flaky"})
	if err != nil {
		t.Fatal(err)
	}
	checkSum(t, res)
	if res.Matched != 603 || res.Changed != 601 || res.Skipped[kagzi.BulkSkipWorkflowIDTaken] != 1 ||
		res.Skipped[kagzi.BulkSkipNotRerunnable] != 1 {
		t.Fatalf("result %+v, want 603 matched, 601 rerun, 1 workflow id taken, 1 not rerunnable", res)
	}
	eventually(t, "the reruns to complete", func() bool {
		return statusCounts(t, e, "bulk-flaky")[kagzi.StatusCompleted] == 602
	})
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE workflow_id = 'twice' AND status = 'FAILED'`); n != 1 {
		t.Fatalf("%d runs of workflow id twice still FAILED, want the older one", n)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE status = 'COMPLETED' AND attempt = 2`); n != 601 {
		t.Fatalf("%d reruns completed at attempt 2, want 601", n)
	}
}

// Found from outside: with OldestFirst the walk went towards the runs started during
// it, cancelled them too, and under a steady stream of starts never ended.
func TestCancelRunsOldestFirstLeavesRunsStartedAfterItsFirstBatchAlone(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	inputs := make([]int, 5000)
	if _, err := kagzi.StartMany(ctx, e.client, idleWorkflow, inputs); err != nil {
		t.Fatal(err)
	}
	late := make(chan []string, 1)
	go func() {
		// Once the first batch is cancelled, the walk has read its first page: runs
		// started from then on are newer than every page it reads.
		for countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE status = 'CANCELLED'`) == 0 {
			time.Sleep(time.Millisecond)
		}
		runs, err := kagzi.StartMany(ctx, e.client, idleWorkflow, make([]int, 100))
		if err != nil {
			t.Error(err)
		}
		ids := make([]string, len(runs))
		for i, r := range runs {
			ids[i] = r.RunID
		}
		late <- ids
	}()
	res, err := e.client.CancelRuns(ctx, kagzi.RunFilter{WorkflowType: "bulk-idle", OldestFirst: true})
	if err != nil {
		t.Fatal(err)
	}
	checkSum(t, res)
	ids := <-late
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE run_id = ANY ($1::uuid[]) AND status = 'CANCELLED'`, ids); n != 0 {
		t.Fatalf("%d of the 100 runs started after the first batch were cancelled, want none (matched %d)", n, res.Matched)
	}
	if res.Matched != 5000 || res.Changed != 5000 {
		t.Fatalf("%+v, want the 5,000 runs there before", res)
	}
}

// Found from outside: a run whose row a worker held when CancelRuns came by went to the
// single-run cancel, which counted a RUNNING run as changed whether or not its cancel
// had been requested before.
func TestCancelRunsCountsARunningRunWhoseCancelWasRequestedAsSkippedThoughItsRowWasHeld(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	run, err := e.client.StartByName(ctx, "held-row", 0, kagzi.WithID("held-row-1"))
	if err != nil {
		t.Fatal(err)
	}
	leaseTo(t, e, run.RunID, "frozen")
	if err := e.client.Cancel(ctx, run.RunID); err != nil {
		t.Fatal(err)
	}
	// A worker's write holds the row for a while.
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM kagzi.runs WHERE run_id = $1 FOR UPDATE`, run.RunID); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = tx.Rollback(context.Background())
	}()
	res, err := e.client.CancelRuns(ctx, kagzi.RunFilter{WorkflowIDPrefix: "held-row-"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched != 1 || res.Changed != 0 || res.Skipped[kagzi.BulkSkipAlreadyCancelled] != 1 {
		t.Fatalf("a second cancel of a RUNNING run already asked to cancel: %+v; want it skipped as already cancelled", res)
	}
}

// Found from outside: each batch's outcomes came back in the order the statement
// locked the runs (by run id), not newest first as ChangedRunIDs says.
func TestBulkChangedRunIDsAreNewestFirstAsListRunsListsThem(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	for range 5 {
		if _, err := kagzi.Start(ctx, e.client, idleWorkflow, 1); err != nil {
			t.Fatal(err)
		}
	}
	page, err := e.client.ListRuns(ctx, kagzi.RunFilter{WorkflowType: "bulk-idle"})
	if err != nil {
		t.Fatal(err)
	}
	var newestFirst []string
	for _, r := range page.Runs {
		newestFirst = append(newestFirst, r.RunID)
	}
	cancelled, err := e.client.CancelRuns(ctx, kagzi.RunFilter{WorkflowType: "bulk-idle"})
	if err != nil {
		t.Fatal(err)
	}
	rerun, err := e.client.RerunRuns(ctx, kagzi.RunFilter{WorkflowType: "bulk-idle"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		op  string
		ids []string
	}{{"CancelRuns", cancelled.ChangedRunIDs}, {"RerunRuns", rerun.ChangedRunIDs}} {
		if fmt.Sprint(c.ids) != fmt.Sprint(newestFirst) {
			t.Errorf("%s: ChangedRunIDs %v, want newest first as ListRuns lists them: %v", c.op, c.ids, newestFirst)
		}
	}
}

// Found from outside: a run its worker failed after the batch statement's snapshot
// was taken, and before the statement locked it, stood in the snapshot as the
// active run of its own workflow id, and was skipped as WORKFLOW_ID_TAKEN.
func TestRerunRunsWhileAWorkerFailsTheRunsNeverSkipsOneAsTakingItsOwnWorkflowID(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	failing := kagzi.Define("bulk-failing", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Step(ctx, "work", func(context.Context) (int, error) {
			time.Sleep(time.Millisecond)
			return 0, kagzi.NonRetryable(errors.New("broken"))
		})
	})
	cfg := fastWorker()
	cfg.MaxConcurrent = 30
	runWorker(t, e.client, cfg, failing)
	if _, err := kagzi.StartMany(ctx, e.client, failing, make([]int, 1200)); err != nil {
		t.Fatal(err)
	}
	changed := 0
	for range 6 {
		res, err := e.client.RerunRuns(ctx, kagzi.RunFilter{WorkflowType: "bulk-failing"})
		if err != nil {
			t.Fatal(err)
		}
		checkSum(t, res)
		changed += res.Changed
		if n := res.Skipped[kagzi.BulkSkipWorkflowIDTaken]; n != 0 {
			t.Fatalf("%+v: %d runs skipped as their workflow id taken, but every run has its own", res, n)
		}
	}
	if changed == 0 {
		t.Fatal("no run was rerun: the reruns did not race the worker")
	}
}

// Found in review: CancelRuns returns what it did so far with an error, but a run the
// batch skipped (its row locked) whose cancel on its own then failed hid the runs
// the batch had cancelled after it in the walk's order.
func TestCancelRunsFailingOnOneRunStillCountsWhatItsBatchCancelled(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var ids []string
	for range 3 {
		r, err := kagzi.Start(ctx, e.client, idleWorkflow, 1)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.RunID)
	}
	newest := ids[2]
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `SELECT 1 FROM kagzi.runs WHERE run_id = $1 FOR UPDATE`, newest); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	res, err := e.client.CancelRuns(cctx, kagzi.RunFilter{WorkflowType: "bulk-idle"})
	if err == nil {
		t.Fatal("want the single-run cancel of the locked run to fail")
	}
	_ = tx.Rollback(context.Background())
	cancelled := 0
	for _, id := range ids[:2] {
		info, err := e.client.GetRun(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if info.Status == kagzi.StatusCancelled {
			cancelled++
		}
	}
	if cancelled != 2 || res.Changed != cancelled || len(res.ChangedRunIDs) != cancelled {
		t.Fatalf("result says %d changed (%v), the database holds %d runs the call cancelled", res.Changed, res.ChangedRunIDs, cancelled)
	}
}
