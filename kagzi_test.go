package kagzi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/testdb"
)

type greetIn struct {
	Name string `json:"name"`
}

type greetOut struct {
	Greeting string `json:"greeting"`
	RunID    string `json:"run_id"`
}

var greet = kagzi.Define("greet", func(ctx *kagzi.Context, in greetIn) (greetOut, error) {
	g, err := kagzi.Step(ctx, "compose", func(context.Context) (string, error) {
		return "hello " + in.Name, nil
	})
	return greetOut{Greeting: g, RunID: ctx.RunID()}, err
})

func TestMigrateCreatesKagziSchemaWithItsOwnGooseTable(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), testdb.NewEmpty(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx := context.Background()
	for range 2 { // a second run is a no-op
		if err := kagzi.Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	if n := countRows(t, pool, `SELECT count(*) FROM pg_tables WHERE schemaname = 'kagzi'`); n < 3 {
		t.Fatalf("kagzi schema has %d tables, want at least runs, steps and step_attempts", n)
	}
	// goose's version table lives in the kagzi schema, not where the application's own
	// goose keeps goose_db_version.
	if n := countRows(t, pool, `SELECT count(*) FROM pg_tables WHERE tablename LIKE '%goose%' AND schemaname <> 'kagzi'`); n != 0 {
		t.Fatal("Migrate created a goose version table outside the kagzi schema, where the application's own goose keeps its")
	}
	if n := countRows(t, pool, `SELECT count(*) FROM kagzi.goose_db_version WHERE version_id > 0`); n == 0 {
		t.Fatal("no migration recorded in kagzi.goose_db_version")
	}
}

func TestMigrateRunsSafelyFromManyProcessesAtOnce(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), testdb.NewEmpty(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- kagzi.Migrate(context.Background(), pool)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestStartRunsWorkflowAndWaitReturnsTypedOutput(t *testing.T) {
	e := newEnv(t)
	runWorker(t, e.client, fastWorker(), greet)
	run, err := kagzi.Start(waitCtx(t), e.client, greet, greetIn{Name: "ada"})
	if err != nil {
		t.Fatal(err)
	}
	out, err := run.Wait(waitCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if out.Greeting != "hello ada" || out.RunID != run.RunID {
		t.Fatalf("got %+v, want greeting %q for run %s", out, "hello ada", run.RunID)
	}
	if run.WorkflowID != run.RunID {
		t.Fatalf("generated workflow id %q, want the run id %q", run.WorkflowID, run.RunID)
	}
	if s := runStatus(t, e.client, run.RunID); s != kagzi.StatusCompleted {
		t.Fatalf("status %s, want COMPLETED", s)
	}
}

func TestStartIsIdempotentByWorkflowID(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	first, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: "a"}, kagzi.WithID("order-1"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: "b"}, kagzi.WithID("order-1"))
	if err != nil {
		t.Fatal(err)
	}
	if first.AlreadyExists || !second.AlreadyExists || second.RunID != first.RunID {
		t.Fatalf("first %+v, second %+v: want the second start to return the first run", first, second)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs`); n != 1 {
		t.Fatalf("%d runs, want 1", n)
	}
}

func TestConcurrentStartsOfOneWorkflowIDCreateOneRun(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	const n = 16
	ids := make(chan string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: fmt.Sprint(i)}, kagzi.WithID("same"))
			if err != nil {
				t.Error(err)
				return
			}
			ids <- run.RunID
		}()
	}
	wg.Wait()
	close(ids)
	seen := map[string]bool{}
	for id := range ids {
		seen[id] = true
	}
	if len(seen) != 1 {
		t.Fatalf("concurrent starts returned %d distinct runs, want 1", len(seen))
	}
	if c := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs`); c != 1 {
		t.Fatalf("%d runs in the table, want 1", c)
	}
}

func TestStartOfFinishedWorkflowIDStartsNewRunByDefault(t *testing.T) {
	e := newEnv(t)
	runWorker(t, e.client, fastWorker(), greet)
	ctx := waitCtx(t)
	first, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: "a"}, kagzi.WithID("again"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: "b"}, kagzi.WithID("again"))
	if err != nil {
		t.Fatal(err)
	}
	if second.AlreadyExists || second.RunID == first.RunID {
		t.Fatalf("second start %+v: want a new run after the first finished", second)
	}
	out, err := second.Wait(ctx)
	if err != nil || out.Greeting != "hello b" {
		t.Fatalf("second run: %+v, %v", out, err)
	}
}

func TestIDReuseNeverReturnsTheFinishedRun(t *testing.T) {
	e := newEnv(t)
	runWorker(t, e.client, fastWorker(), greet)
	ctx := waitCtx(t)
	first, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: "a"}, kagzi.WithID("once"), kagzi.WithIDReuse(kagzi.IDReuseNever))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: "b"}, kagzi.WithID("once"), kagzi.WithIDReuse(kagzi.IDReuseNever))
	if err != nil {
		t.Fatal(err)
	}
	if !second.AlreadyExists || second.RunID != first.RunID {
		t.Fatalf("second start %+v: want the finished run %s with AlreadyExists", second, first.RunID)
	}
	out, err := second.Wait(ctx)
	if err != nil || out.Greeting != "hello a" {
		t.Fatalf("got %+v, %v: want the first run's output", out, err)
	}
}

func TestStartOfWorkflowIDHeldByAnotherTypeIsAlreadyExists(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	if _, err := kagzi.Start(ctx, e.client, greet, greetIn{}, kagzi.WithID("shared")); err != nil {
		t.Fatal(err)
	}
	_, err := e.client.StartByName(ctx, "other-type", map[string]int{"x": 1}, kagzi.WithID("shared"))
	mustErrorIs(t, err, kagzi.ErrAlreadyExists)
}

func TestStartTxRolledBackLeavesNothing(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	run, err := kagzi.StartTx(ctx, tx, e.client, greet, greetIn{Name: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs`); n != 0 {
		t.Fatalf("%d runs after rollback, want 0", n)
	}
	_, err = e.client.GetRun(ctx, run.RunID)
	mustErrorIs(t, err, kagzi.ErrNotFound)
}

func TestStartTxCommittedRunsWithTheCallersWrites(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	runWorker(t, e.client, fastWorker(), greet)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ('o-1')`); err != nil {
		t.Fatal(err)
	}
	run, err := kagzi.StartTx(ctx, tx, e.client, greet, greetIn{Name: "tx"}, kagzi.WithID("o-1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	out, err := run.Wait(ctx)
	if err != nil || out.Greeting != "hello tx" {
		t.Fatalf("got %+v, %v", out, err)
	}
}

// StartTx of a workflow id another transaction started after the caller's snapshot:
// under READ COMMITTED the run, AlreadyExists; under REPEATABLE READ the serialization
// failure StartTx documents, which the caller retries.
func TestStartTxOfAnIDTakenMeanwhileIsTheRunUnderReadCommittedAndASerializationFailureUnderRepeatableRead(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead} {
		id := "taken-" + string(iso)
		tx, err := e.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SELECT 1`); err != nil { // the snapshot
			t.Fatal(err)
		}
		first, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: "first"}, kagzi.WithID(id))
		if err != nil {
			t.Fatal(err)
		}
		run, err := kagzi.StartTx(ctx, tx, e.client, greet, greetIn{Name: "second"}, kagzi.WithID(id))
		var pgErr *pgconn.PgError
		switch iso {
		case pgx.ReadCommitted:
			if err != nil || !run.AlreadyExists || run.RunID != first.RunID {
				t.Errorf("read committed: %+v, %v; want the first run, AlreadyExists", run, err)
			}
		default:
			if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
				t.Errorf("repeatable read: %v, want a serialization failure (40001)", err)
			}
		}
		tx.Rollback(ctx)
	}
}

func TestStartByNameWithUnregisteredTypeWaitsPendingUntilAWorkerRuns(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	run, err := e.client.StartByName(ctx, "greet", greetIn{Name: "late"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if s := runStatus(t, e.client, run.RunID); s != kagzi.StatusPending {
		t.Fatalf("status %s with no worker, want PENDING", s)
	}
	runWorker(t, e.client, fastWorker(), greet)
	raw, err := run.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out greetOut
	if err := json.Unmarshal(raw, &out); err != nil || out.Greeting != "hello late" {
		t.Fatalf("got %s, %v", raw, err)
	}
}

func TestDelayedStartIsNotClaimedBeforeItsTime(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	runWorker(t, e.client, fastWorker(), greet)
	start := time.Now()
	run, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: "later"}, kagzi.WithDelay(700*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if s := runStatus(t, e.client, run.RunID); s != kagzi.StatusPending {
		t.Fatalf("status %s before the start time, want PENDING", s)
	}
	if _, err := run.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if info.StartedAt.Before(start.Add(700 * time.Millisecond)) {
		t.Fatalf("run started at %v, before its start time %v", info.StartedAt, start.Add(700*time.Millisecond))
	}
}

func TestAWaitIsWokenByTheRunsEndFromAWorkerOfItsOwnClientOrOfAnother(t *testing.T) {
	for _, sameClient := range []bool{true, false} {
		t.Run(fmt.Sprintf("same client %t", sameClient), func(t *testing.T) {
			e := newEnv(t)
			ctx := waitCtx(t)
			listener, err := pgx.Connect(ctx, e.url)
			if err != nil {
				t.Fatal(err)
			}
			defer listener.Close(context.Background())
			if _, err := listener.Exec(ctx, "LISTEN kagzi"); err != nil {
				t.Fatal(err)
			}
			waiterPool, rt := tracedPool(t, e.url)
			waiter := newClient(t, waiterPool, "")
			workerClient := newClient(t, e.pool, "")
			if sameClient {
				workerClient = waiter
			}
			release := make(chan struct{})
			wf := kagzi.Define("held", func(ctx *kagzi.Context, n int) (int, error) {
				<-release
				return n, nil
			})
			// No liveness lock: the worker's client's direct connection then only
			// LISTENs, and pg_stat_activity shows LISTEN as its last query below.
			cfg := fastWorker()
			cfg.ReapInterval = -1
			runWorker(t, workerClient, cfg, wf)
			// Let the clients' LISTEN connections come up first (a Wait on a finished run
			// opens the waiter's): one that connects during the Wait tells it to look again.
			first, err := kagzi.Start(ctx, waiter, wf, 0)
			if err != nil {
				t.Fatal(err)
			}
			release <- struct{}{}
			// The run may end before this Wait registers and after its first look: the
			// Wait then finds the end at its next look (see waiters.go), which it makes
			// soon here. The Wait under test below is made after the registration.
			kagzi.SetWaitPoll(waiter, 20*time.Millisecond)
			if _, err := first.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			kagzi.SetWaitPoll(waiter, time.Hour) // only a notification can wake the Wait below
			listeners := 3                       // the test's, the worker's client's and the waiter's
			if sameClient {
				listeners = 2
			}
			for {
				var n int
				if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE datname = current_database() AND query LIKE 'LISTEN%'`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n >= listeners {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			run, err := kagzi.Start(ctx, waiter, wf, 7)
			if err != nil {
				t.Fatal(err)
			}
			reads := func() int { return rt.count("FROM kagzi.runs\n\t\tWHERE namespace = $1 AND run_id = $2") }
			before := reads()
			if d := rt.countDone("FROM kagzi.runs\n\t\tWHERE namespace = $1 AND run_id = $2"); d != before {
				t.Fatalf("%d reads of a run begun, %d done, before the Wait", before, d)
			}
			done := make(chan error, 1)
			go func() {
				out, err := run.Wait(ctx)
				if err == nil && out != 7 {
					err = fmt.Errorf("output %d, want 7", out)
				}
				done <- err
			}()
			// The Wait has read the run once (a read only begun may see the end) and waits.
			for rt.countDone("FROM kagzi.runs\n\t\tWHERE namespace = $1 AND run_id = $2") == before {
				time.Sleep(time.Millisecond)
			}
			close(release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			// Woken by a worker of its own client, the Wait gets the run's result with the
			// notification and reads nothing more; by another's, it reads the run again.
			want := 2
			if sameClient {
				want = 1
			}
			if n := reads() - before; n != want {
				t.Fatalf("the Wait read the run %d times, want %d (before the end, and once woken only by another client's worker)", n, want)
			}
			// The end went out as a NOTIFY only for a waiter of another client.
			payload := "d|" + run.RunID + "|COMPLETED"
			notified := false
			for {
				nctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				msg, err := listener.WaitForNotification(nctx)
				cancel()
				if err != nil {
					break
				}
				if slices.Contains(strings.Split(strings.TrimPrefix(msg.Payload, "\n"), "\n"), payload) {
					notified = true
				}
			}
			if notified == sameClient {
				t.Fatalf("same client %t: the end was sent as a NOTIFY: %t", sameClient, notified)
			}
		})
	}
}

func TestWaitReturnsWorkflowErrorWithRecordedDetail(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	boom := kagzi.Define("boom", func(ctx *kagzi.Context, in int) (int, error) {
		return 0, fmt.Errorf("out of stock for item %d", in)
	}, kagzi.WithWorkflowRetry(kagzi.NoRetry()))
	runWorker(t, e.client, fastWorker(), boom)
	run, err := kagzi.Start(ctx, e.client, boom, 7)
	if err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrWorkflowFailed)
	var we *kagzi.WorkflowError
	if !errors.As(err, &we) {
		t.Fatalf("error %T is not a *WorkflowError", err)
	}
	if we.Detail.Code != kagzi.CodeWorkflowError || we.Detail.Message != "out of stock for item 7" || we.RunID != run.RunID {
		t.Fatalf("detail %+v", we)
	}
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil || info.Status != kagzi.StatusFailed || info.Error == nil || info.Error.Message != we.Detail.Message {
		t.Fatalf("GetRun: %+v, %v", info, err)
	}
}

func TestNamespacesIsolateRunsWorkersAndReads(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	tenantA := newClient(t, e.pool, "tenant-a")
	tenantB := newClient(t, e.pool, "tenant-b")
	runWorker(t, tenantB, fastWorker(), greet) // a worker of B must not claim A's run
	run, err := kagzi.Start(ctx, tenantA, greet, greetIn{Name: "a"}, kagzi.WithID("same-id"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = tenantB.GetRun(ctx, run.RunID)
	mustErrorIs(t, err, kagzi.ErrNotFound)
	mustErrorIs(t, tenantB.Cancel(ctx, run.RunID), kagzi.ErrNotFound)
	_, err = tenantB.ListSteps(ctx, run.RunID)
	mustErrorIs(t, err, kagzi.ErrNotFound)
	page, err := tenantB.ListRuns(ctx, kagzi.RunFilter{})
	if err != nil || len(page.Runs) != 0 {
		t.Fatalf("tenant B lists %d runs (%v), want 0", len(page.Runs), err)
	}
	// The same workflow id is free in another namespace.
	runB, err := kagzi.Start(ctx, tenantB, greet, greetIn{Name: "b"}, kagzi.WithID("same-id"))
	if err != nil || runB.AlreadyExists {
		t.Fatalf("start in B: %+v, %v", runB, err)
	}
	if _, err := runB.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if s := runStatus(t, tenantA, run.RunID); s != kagzi.StatusPending {
		t.Fatalf("tenant A's run is %s with only a tenant B worker, want PENDING", s)
	}
	runWorker(t, tenantA, fastWorker(), greet)
	if out, err := run.Wait(ctx); err != nil || out.Greeting != "hello a" {
		t.Fatalf("tenant A run: %+v, %v", out, err)
	}
}

func TestWorkerNeverClaimsATypeItDidNotRegister(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	runWorker(t, e.client, fastWorker(), greet)
	run, err := e.client.StartByName(ctx, "not-registered", 1)
	if err != nil {
		t.Fatal(err)
	}
	done, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := done.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if info.Status != kagzi.StatusPending || info.StartedAt != nil || info.LockedBy != "" {
		t.Fatalf("unregistered type's run: %+v, want untouched PENDING", info)
	}
}

func TestListRunsFiltersAndPagesWithOpaqueTokens(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var ids []string
	for i := range 7 {
		run, err := e.client.StartByName(ctx, "listed", i, kagzi.WithID(fmt.Sprintf("l-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, run.RunID)
	}
	if _, err := e.client.StartByName(ctx, "other", 0); err != nil {
		t.Fatal(err)
	}
	var got []string
	token := ""
	pages := 0
	for {
		page, err := e.client.ListRuns(ctx, kagzi.RunFilter{WorkflowType: "listed", PageSize: 3, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, r := range page.Runs {
			got = append(got, r.RunID)
		}
		if token = page.NextPageToken; token == "" {
			break
		}
	}
	if pages != 3 || len(got) != 7 {
		t.Fatalf("%d pages, %d runs; want 3 pages and 7 runs", pages, len(got))
	}
	for i, id := range got { // newest first
		if id != ids[len(ids)-1-i] {
			t.Fatalf("run %d is %s, want %s (newest first)", i, id, ids[len(ids)-1-i])
		}
	}
	page, err := e.client.ListRuns(ctx, kagzi.RunFilter{WorkflowID: "l-3"})
	if err != nil || len(page.Runs) != 1 || page.Runs[0].RunID != ids[3] {
		t.Fatalf("filter by workflow id: %+v, %v", page, err)
	}
	page, err = e.client.ListRuns(ctx, kagzi.RunFilter{Statuses: []kagzi.RunStatus{kagzi.StatusCompleted}})
	if err != nil || len(page.Runs) != 0 {
		t.Fatalf("filter by status: %+v, %v", page, err)
	}
	page, err = e.client.ListRuns(ctx, kagzi.RunFilter{CreatedAfter: time.Now().Add(time.Hour)})
	if err != nil || len(page.Runs) != 0 {
		t.Fatalf("filter by created range: %+v, %v", page, err)
	}
	_, err = e.client.ListRuns(ctx, kagzi.RunFilter{PageToken: "not a token"})
	mustErrorIs(t, err, kagzi.ErrInvalidArgument)
	_, err = e.client.ListRuns(ctx, kagzi.RunFilter{Statuses: []kagzi.RunStatus{"DONE"}})
	mustErrorIs(t, err, kagzi.ErrInvalidArgument)
}

func TestBadInputIsATypedErrorAndWritesNothing(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	cases := []struct {
		name string
		err  error
	}{
		{"workflow id too long", func() error {
			_, err := kagzi.Start(ctx, e.client, greet, greetIn{}, kagzi.WithID(strings.Repeat("x", 256)))
			return err
		}()},
		{"workflow id with control character", func() error {
			_, err := kagzi.Start(ctx, e.client, greet, greetIn{}, kagzi.WithID("a\nb"))
			return err
		}()},
		{"workflow id with a C1 control character", func() error {
			_, err := kagzi.Start(ctx, e.client, greet, greetIn{}, kagzi.WithID("a\u009b31mb"))
			return err
		}()},
		{"schedule id with a C1 control character", func() error {
			_, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: "a\u0085b", WorkflowType: "greet", Cron: "* * * * *"})
			return err
		}()},
		{"input that does not encode", func() error {
			_, err := e.client.StartByName(ctx, "greet", make(chan int))
			return err
		}()},
		{"raw input that is not JSON", func() error {
			_, err := e.client.StartByName(ctx, "greet", json.RawMessage(`{"name":`))
			return err
		}()},
		{"empty workflow type", func() error {
			_, err := e.client.StartByName(ctx, "", 1)
			return err
		}()},
		{"oversized input", func() error {
			_, err := e.client.StartByName(ctx, "greet", strings.Repeat("x", kagzi.DefaultMaxPayloadSize+1))
			return err
		}()},
		{"negative delay", func() error {
			_, err := kagzi.Start(ctx, e.client, greet, greetIn{}, kagzi.WithDelay(-time.Second))
			return err
		}()},
		{"invalid workflow definition", func() error {
			_, err := kagzi.Start(ctx, e.client, kagzi.Define("", func(*kagzi.Context, int) (int, error) { return 0, nil }), 1)
			return err
		}()},
		{"malformed run id", func() error {
			_, err := e.client.GetRun(ctx, "not-a-uuid")
			return err
		}()},
		{"malformed run id to cancel", e.client.Cancel(ctx, "42")},
	}
	for _, c := range cases {
		if !errors.Is(c.err, kagzi.ErrInvalidArgument) {
			t.Errorf("%s: got %v, want ErrInvalidArgument", c.name, c.err)
		}
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs`); n != 0 {
		t.Fatalf("%d runs written by rejected calls, want 0", n)
	}
	_, err := e.client.GetRun(ctx, "0190a0a0-0000-7000-8000-000000000000")
	mustErrorIs(t, err, kagzi.ErrNotFound)
	mustErrorIs(t, e.client.Cancel(ctx, "0190a0a0-0000-7000-8000-000000000000"), kagzi.ErrNotFound)
}

func TestUndecodableStoredInputFailsTheRunNonRetryably(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	runWorker(t, e.client, fastWorker(), greet)
	run, err := e.client.StartByName(ctx, "greet", []int{1, 2}) // greet takes an object
	if err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	var we *kagzi.WorkflowError
	if !errors.As(err, &we) || we.Detail.Code != kagzi.CodeInvalidInput || !we.Detail.NonRetryable ||
		!strings.Contains(we.Detail.Message, "kagzi_test.greetIn") || !strings.Contains(we.Detail.Message, run.RunID) {
		t.Fatalf("got %v, want a non-retryable INVALID_INPUT naming the type and the run", err)
	}
	mustErrorIs(t, err, kagzi.ErrNonRetryable)
}

func TestUnmigratedSchemaIsATypedError(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), testdb.NewEmpty(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c := newClient(t, pool, "")
	ctx := waitCtx(t)
	_, err = kagzi.Start(ctx, c, greet, greetIn{})
	mustErrorIs(t, err, kagzi.ErrSchemaNotMigrated)
	_, err = c.GetRun(ctx, "0190a0a0-0000-7000-8000-000000000000")
	mustErrorIs(t, err, kagzi.ErrSchemaNotMigrated)
	w, err := kagzi.NewWorker(c, fastWorker(), greet)
	if err != nil {
		t.Fatal(err)
	}
	mustErrorIs(t, w.Run(ctx), kagzi.ErrSchemaNotMigrated)
}

// A worker refuses to start on a schema older than its library's (migrations not
// applied yet), and stops, with ErrSchemaNotMigrated, when its claims meet a schema
// whose functions differ from what it calls (another version of Kagzi migrated it):
// found from outside, such workers ran on, claiming nothing, with a warning a claim.
func TestAWorkerOnAnotherVersionsSchemaStopsWithErrSchemaNotMigrated(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	newest := countRows(t, e.pool, `SELECT max(version_id) FROM kagzi.goose_db_version`)
	if _, err := e.pool.Exec(ctx, `DELETE FROM kagzi.goose_db_version WHERE version_id = $1`, newest); err != nil {
		t.Fatal(err)
	}
	w, err := kagzi.NewWorker(e.client, fastWorker(), greet)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(ctx); !errors.Is(err, kagzi.ErrSchemaNotMigrated) || !strings.Contains(err.Error(), "version") {
		t.Fatalf("Run on a schema one migration behind: %v, want ErrSchemaNotMigrated naming the versions", err)
	}
	if _, err := e.pool.Exec(ctx, `INSERT INTO kagzi.goose_db_version (version_id, is_applied) VALUES ($1, true)`, newest); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `DROP FUNCTION kagzi.claim`); err != nil { // as a later version's migration might
		t.Fatal(err)
	}
	if _, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: "x"}); err != nil {
		t.Fatal(err)
	}
	w, err = kagzi.NewWorker(e.client, fastWorker(), greet)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(ctx); !errors.Is(err, kagzi.ErrSchemaNotMigrated) {
		t.Fatalf("Run whose claims call a function the schema lacks: %v, want ErrSchemaNotMigrated", err)
	}
}

func TestClosedPoolIsATypedError(t *testing.T) {
	e := newEnv(t)
	pool, err := pgxpool.New(context.Background(), e.url)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, pool, "")
	pool.Close()
	_, err = kagzi.Start(waitCtx(t), c, greet, greetIn{})
	mustErrorIs(t, err, kagzi.ErrClosed)
	_, err = c.ListRuns(waitCtx(t), kagzi.RunFilter{})
	mustErrorIs(t, err, kagzi.ErrClosed)
}

func TestNewWorkerRejectsBadConfig(t *testing.T) {
	t.Parallel()
	c, err := kagzi.NewClient(&pgxpool.Pool{}, kagzi.Config{})
	if err != nil {
		t.Fatal(err)
	}
	bad := []kagzi.WorkerConfig{
		{MaxConcurrent: -1},
		{LeaseDuration: time.Millisecond},
		{LeaseDuration: time.Second, HeartbeatInterval: 2 * time.Second},
		{PollInterval: -time.Second},
		{PruneInterval: -time.Second}, // was accepted, and Run panicked in its ticker
		// Accepted before, and then broke Run: every claim refused (tcp_user_timeout
		// overflowed), the registry's int4 overflowed, jsonb refused the NUL, or a
		// statement every nanosecond.
		{LeaseDuration: 30 * 24 * time.Hour},
		{MaxConcurrent: 1 << 31},
		{Labels: map[string]string{"zone": "a\x00b"}},
		{Labels: map[string]string{"": "x"}},
		{PollInterval: time.Nanosecond},
		{PruneInterval: time.Nanosecond},
		{LeaseDuration: time.Second, HeartbeatInterval: time.Nanosecond},
	}
	for _, cfg := range bad {
		if _, err := kagzi.NewWorker(c, cfg, greet); !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("config %+v: got %v, want ErrInvalidArgument", cfg, err)
		}
	}
	if _, err := kagzi.NewWorker(c, kagzi.WorkerConfig{}, greet, greet); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("a type registered twice: got %v, want ErrInvalidArgument", err)
	}
	if _, err := kagzi.NewWorker(c, kagzi.WorkerConfig{}); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("no workflows: got %v, want ErrInvalidArgument", err)
	}
	// A typed nil *Workflow in the Definition interface panicked.
	if _, err := kagzi.NewWorker(c, kagzi.WorkerConfig{}, (*kagzi.Workflow[greetIn, greetOut])(nil)); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("a typed nil workflow: got %v, want ErrInvalidArgument", err)
	}
	if _, err := kagzi.GetEvent[string](context.Background(), nil, "0190a0f4-0000-7000-8000-000000000000", "k"); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("GetEvent with a nil client: got %v, want ErrInvalidArgument", err)
	}
	if _, err := kagzi.NewClient(nil, kagzi.Config{}); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("nil pool: got %v, want ErrInvalidArgument", err)
	}
	if _, err := kagzi.NewClient(&pgxpool.Pool{}, kagzi.Config{Namespace: "a\tb"}); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("bad namespace: got %v, want ErrInvalidArgument", err)
	}
}

func TestStartManyStartsEveryRunInOneStatement(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	pool, rt := tracedPool(t, e.url)
	c := newClient(t, pool, "")
	inputs := make([]greetIn, 100)
	for i := range inputs {
		inputs[i] = greetIn{Name: fmt.Sprint(i)}
	}
	runs, err := kagzi.StartMany(ctx, c, greet, inputs)
	if err != nil {
		t.Fatal(err)
	}
	if n := rt.n.Load(); n != 1 {
		t.Fatalf("StartMany of 100 runs took %d round trips, want 1", n)
	}
	runWorker(t, e.client, fastWorker(), greet)
	for i, run := range runs {
		out, err := run.Wait(ctx)
		if err != nil || out.Greeting != fmt.Sprint("hello ", i) {
			t.Fatalf("run %d: %+v, %v", i, out, err)
		}
	}
	_, err = kagzi.StartMany(ctx, c, greet, inputs, kagzi.WithID("x"))
	mustErrorIs(t, err, kagzi.ErrInvalidArgument)
}

func TestConcurrentStartsWakeTheWorkersWithoutWaitingForAPoll(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	cfg := fastWorker()
	cfg.PollInterval = time.Hour // only notifications (and timers) may wake the worker
	runWorker(t, e.client, cfg, greet)
	for round := range 5 {
		var wg sync.WaitGroup
		runs := make([]*kagzi.Run[greetOut], 16)
		for i := range runs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				run, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: fmt.Sprint(round, "-", i)})
				if err != nil {
					t.Error(err)
					return
				}
				runs[i] = run
			}()
		}
		wg.Wait()
		for _, run := range runs {
			if run == nil {
				t.FailNow()
			}
			if _, err := run.Wait(ctx); err != nil {
				t.Fatalf("round %d: %v (a start's notification was lost?)", round, err)
			}
		}
		time.Sleep(50 * time.Millisecond) // let the worker go idle between bursts
	}
}
