package kagzi_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

func TestCancelTxCancelsOnlyWhenTheTransactionCommits(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	run, err := e.client.StartByName(ctx, "held", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, commit := range []bool{false, true} {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.client.CancelTx(ctx, tx, run.RunID); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		want := kagzi.StatusPending
		if commit {
			want = kagzi.StatusCancelled
		}
		if got := runStatus(t, e.client, run.RunID); got != want {
			t.Fatalf("after CancelTx and commit=%v the run is %s, want %s", commit, got, want)
		}
	}
	if _, err := run.Wait(ctx); !errors.Is(err, kagzi.ErrCancelled) {
		t.Fatalf("Wait after CancelTx: %v, want ErrCancelled", err)
	}
	mustErrorIs(t, e.client.CancelTx(ctx, nil, run.RunID), kagzi.ErrInvalidArgument)
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	mustErrorIs(t, e.client.CancelTx(ctx, tx, "not-a-uuid"), kagzi.ErrInvalidArgument)
}

// collects waits for three signals "item" and returns their payloads.
var collects = kagzi.Define("collects", func(ctx *kagzi.Context, _ int) ([]string, error) {
	var got []string
	for range 3 {
		s, err := kagzi.WaitSignal[string](ctx, "item", 0)
		if err != nil {
			return nil, err
		}
		got = append(got, s)
	}
	return got, nil
})

func TestASignalRetriedWithItsKeyIsStoredOnce(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	run, err := kagzi.Start(ctx, e.client, collects, 0, kagzi.WithID("collector"))
	if err != nil {
		t.Fatal(err)
	}
	send := []func() error{
		func() error { return e.client.Signal(ctx, run.RunID, "item", "a", kagzi.SignalKey("k1")) },
		func() error { return e.client.Signal(ctx, run.RunID, "item", "a again", kagzi.SignalKey("k1")) },
		func() error { return e.client.SignalWorkflow(ctx, "collector", "item", "b", kagzi.SignalKey("k2")) },
		func() error {
			tx, err := e.pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			if err := e.client.SignalTx(ctx, tx, run.RunID, "item", "b again", kagzi.SignalKey("k2")); err != nil {
				return err
			}
			return tx.Commit(ctx)
		},
		func() error { return e.client.Signal(ctx, run.RunID, "item", "c") },
	}
	for i, s := range send {
		if err := s(); err != nil {
			t.Fatalf("signal %d: %v", i, err)
		}
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.signals WHERE run_id = $1`, run.RunID); n != 3 {
		t.Fatalf("%d signals stored, want 3 (k1, k2 and one without a key)", n)
	}
	runWorker(t, e.client, fastWorker(), collects)
	got, err := run.Wait(ctx)
	if err != nil || !reflect.DeepEqual(got, []string{"a", "b", "c"}) {
		t.Fatalf("received %v, %v; want a, b, c", got, err)
	}
	// A retry after the run finished still finds its key: success, nothing stored.
	if err := e.client.Signal(ctx, run.RunID, "item", "late", kagzi.SignalKey("k1")); err != nil {
		t.Fatalf("retried signal after the end: %v, want nil", err)
	}
	mustErrorIs(t, e.client.Signal(ctx, run.RunID, "item", "late", kagzi.SignalKey("k3")), kagzi.ErrRunFinished)
	mustErrorIs(t, e.client.Signal(ctx, run.RunID, "item", "x", kagzi.SignalKey("")), kagzi.ErrInvalidArgument)
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.signals WHERE run_id = $1`, run.RunID); n != 3 {
		t.Fatalf("%d signals stored, want 3", n)
	}
}

// namedChild starts a child of the id it is given and returns the child's output,
// or the error's kind.
var namedChild = kagzi.Define("named-child", func(ctx *kagzi.Context, id string) (string, error) {
	child, err := kagzi.StartChild(ctx, "child", failsWith, "", kagzi.WithID(id))
	switch {
	case errors.Is(err, kagzi.ErrAlreadyExists) && errors.Is(err, kagzi.ErrNonRetryable):
		return "already exists", nil
	case err != nil:
		return "", err
	case child.WorkflowID != id:
		return "", errors.New("the child's workflow id is " + child.WorkflowID)
	}
	out, err := child.Get()
	if err != nil {
		return "", err
	}
	// A replay: the recorded child, not a second start.
	if err := ctx.Sleep("nap", 0); err != nil {
		return "", err
	}
	return out + " by " + child.RunID, nil
})

func TestAChildWithAnExplicitIDBelongsToOneParent(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	cfg := fastWorker()
	cfg.MaxInProcessSleep = 0 // Get and Sleep release the parent: it replays
	runWorker(t, e.client, cfg, namedChild, failsWith)
	first, err := kagzi.Start(ctx, e.client, namedChild, "invoice-7")
	if err != nil {
		t.Fatal(err)
	}
	out, err := first.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	child, err := e.client.GetRunByWorkflowID(ctx, "invoice-7")
	if err != nil {
		t.Fatal(err)
	}
	if out != "done by "+child.RunID || child.ParentRunID != first.RunID {
		t.Fatalf("parent returned %q; child %s of parent %s", out, child.RunID, child.ParentRunID)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE workflow_id = 'invoice-7'`); n != 1 {
		t.Fatalf("%d runs of the child's id, want 1", n)
	}
	// A second parent asking for the same child id gets a typed error, not the child.
	second, err := kagzi.Start(ctx, e.client, namedChild, "invoice-7")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := second.Wait(ctx); err != nil || out != "already exists" {
		t.Fatalf("second parent: %q, %v; want ErrAlreadyExists", out, err)
	}
	// So does a parent whose child id is held by a run started by Start.
	if _, err := e.client.StartByName(ctx, "held", 0, kagzi.WithID("taken")); err != nil {
		t.Fatal(err)
	}
	third, err := kagzi.Start(ctx, e.client, namedChild, "taken")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := third.Wait(ctx); err != nil || out != "already exists" {
		t.Fatalf("parent of a taken id: %q, %v; want ErrAlreadyExists", out, err)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE workflow_type = 'fails-with'`); n != 1 {
		t.Fatalf("%d child runs, want 1", n)
	}
}

func TestScheduleNextFireTimesFollowTheZoneAndItsDaylightSavingRule(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	// 02:30 does not exist on 2025-03-30 in Paris: it fires at 03:00 CEST, the gap's end.
	daily := kagzi.Schedule{ID: "nightly", Cron: "30 2 * * *", TimeZone: "Europe/Paris"}
	got, err := daily.NextFireTimes(time.Date(2025, 3, 28, 12, 0, 0, 0, paris), 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Time{
		time.Date(2025, 3, 29, 2, 30, 0, 0, paris).UTC(),
		time.Date(2025, 3, 30, 3, 0, 0, 0, paris).UTC(),
		time.Date(2025, 3, 31, 2, 30, 0, 0, paris).UTC(),
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("next fire times %v, want %v", got, want)
	}
	from := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	every, err := kagzi.Schedule{Cron: "@every 90s"}.NextFireTimes(from, 2)
	if err != nil || !reflect.DeepEqual(every, []time.Time{from.Add(90 * time.Second), from.Add(180 * time.Second)}) {
		t.Fatalf("@every 90s from %v: %v, %v", from, every, err)
	}
	secs, err := kagzi.Schedule{Cron: "*/20 * * * * *", Seconds: true}.NextFireTimes(from, 1)
	if err != nil || !reflect.DeepEqual(secs, []time.Time{from.Add(20 * time.Second)}) {
		t.Fatalf("every 20 s: %v, %v", secs, err)
	}
	for i, bad := range []func() error{
		func() error { _, err := daily.NextFireTimes(from, 0); return err },
		func() error { _, err := daily.NextFireTimes(from, 1001); return err },
		func() error { _, err := kagzi.Schedule{Cron: "61 * * * *"}.NextFireTimes(from, 1); return err },
		func() error {
			_, err := kagzi.Schedule{Cron: "@daily", TimeZone: "Mars/Olympus"}.NextFireTimes(from, 1)
			return err
		},
	} {
		if err := bad(); !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("bad call %d: %v, want ErrInvalidArgument", i, err)
		}
	}
}

// Found from outside: a run cancelled while PENDING (or RUNNING, once its worker ended
// it) read CancelRequested true for ever, as if its cancel still waited for a worker.
func TestAFinishedCancelledRunNoLongerReadsCancelRequested(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	run, err := e.client.StartByName(ctx, "never-claimed", 1, kagzi.WithDelay(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.client.Cancel(ctx, run.RunID); err != nil {
		t.Fatal(err)
	}
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil || info.Status != kagzi.StatusCancelled || info.CancelRequested {
		t.Fatalf("a cancelled PENDING run: status %s, cancel requested %t (%v); want CANCELLED and no request pending",
			info.Status, info.CancelRequested, err)
	}
	page, err := e.client.ListRuns(ctx, kagzi.RunFilter{})
	if err != nil || len(page.Runs) != 1 || page.Runs[0].CancelRequested {
		t.Fatalf("listed: %+v, %v", page, err)
	}
}
