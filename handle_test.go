package kagzi_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

func TestARunStartedInOneClientIsAwaitedFromAnotherByRunIDOrWorkflowID(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	run, err := kagzi.Start(ctx, e.client, greet, greetIn{Name: "ada"}, kagzi.WithID("greet-ada"))
	if err != nil {
		t.Fatal(err)
	}
	// Another process: its own client, no worker, only the ids the first one returned.
	other := newClient(t, e.pool, "")
	runWorker(t, e.client, fastWorker(), greet)

	out, err := kagzi.RunOf[greetOut](other, run.RunID).Wait(ctx)
	if err != nil || out.Greeting != "hello ada" {
		t.Fatalf("RunOf(...).Wait = %+v, %v; want hello ada", out, err)
	}
	byID, err := kagzi.RunOfWorkflow[greetOut](ctx, other, "greet-ada")
	if err != nil {
		t.Fatal(err)
	}
	if byID.RunID != run.RunID || byID.WorkflowID != "greet-ada" || byID.WorkflowType != "greet" {
		t.Fatalf("RunOfWorkflow = %+v, want run %s of greet-ada", byID, run.RunID)
	}
	if out, err := byID.Wait(ctx); err != nil || out.Greeting != "hello ada" {
		t.Fatalf("RunOfWorkflow(...).Wait = %+v, %v", out, err)
	}
}

func TestAHandleOnNothingIsATypedErrorNotAPanic(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var zero kagzi.Run[greetOut]
	_, err := zero.Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrInvalidArgument)
	_, err = (&kagzi.Run[greetOut]{RunID: "0190a0a0-0000-7000-8000-000000000000"}).Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrInvalidArgument)
	var nilRun *kagzi.Run[greetOut]
	_, err = nilRun.Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrInvalidArgument)
	_, err = kagzi.RunOf[greetOut](nil, "0190a0a0-0000-7000-8000-000000000000").Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrInvalidArgument)
	_, err = kagzi.RunOf[greetOut](e.client, "not-a-uuid").Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrInvalidArgument)
	_, err = kagzi.RunOf[greetOut](e.client, "0190a0a0-0000-7000-8000-000000000000").Wait(ctx)
	mustErrorIs(t, err, kagzi.ErrNotFound)
	_, err = kagzi.RunOfWorkflow[greetOut](ctx, e.client, "no-such-id")
	mustErrorIs(t, err, kagzi.ErrNotFound)
	_, err = kagzi.RunOfWorkflow[greetOut](ctx, e.client, "")
	mustErrorIs(t, err, kagzi.ErrInvalidArgument)
	_, err = kagzi.RunOfWorkflow[greetOut](ctx, nil, "greet-ada")
	mustErrorIs(t, err, kagzi.ErrInvalidArgument)
}

func TestAnEmptyWorkflowIDIsRejectedInsteadOfGenerated(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	_, err := kagzi.Start(ctx, e.client, greet, greetIn{}, kagzi.WithID(""))
	mustErrorIs(t, err, kagzi.ErrInvalidArgument)
	_, err = e.client.StartByName(ctx, "greet", greetIn{}, kagzi.WithID(""))
	mustErrorIs(t, err, kagzi.ErrInvalidArgument)
	_, err = kagzi.StartMany(ctx, e.client, greet, []greetIn{{}}, kagzi.WithID(""))
	mustErrorIs(t, err, kagzi.ErrInvalidArgument)
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs`); n != 0 {
		t.Fatalf("%d runs started, want none", n)
	}
}

func TestRequireWorkerRefusesATypeOrVersionNoLiveWorkerRegistered(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	_, err := e.client.StartByName(ctx, "greet", greetIn{}, kagzi.RequireWorker())
	mustErrorIs(t, err, kagzi.ErrNoWorker)
	_, err = kagzi.Start(ctx, e.client, greet, greetIn{}, kagzi.RequireWorker())
	mustErrorIs(t, err, kagzi.ErrNoWorker)
	_, err = kagzi.StartMany(ctx, e.client, greet, []greetIn{{}}, kagzi.RequireWorker())
	mustErrorIs(t, err, kagzi.ErrNoWorker)
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs`); n != 0 {
		t.Fatalf("%d runs started without a worker, want none", n)
	}

	stop := runWorker(t, e.client, fastWorker(), greet)
	eventually(t, "the worker to register", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.workers WHERE status = 'ONLINE'`) == 1
	})
	run, err := e.client.StartByName(ctx, "greet", greetIn{Name: "bo"}, kagzi.RequireWorker())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kagzi.RunOf[greetOut](e.client, run.RunID).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := kagzi.Start(ctx, e.client, greet, greetIn{}, kagzi.RequireWorker()); err != nil {
		t.Fatalf("typed start of a registered type and version: %v", err)
	}
	_, err = e.client.StartByName(ctx, "greet", greetIn{}, kagzi.RequireWorker(), kagzi.WithRunVersion("v2"))
	mustErrorIs(t, err, kagzi.ErrNoWorker)
	_, err = e.client.StartByName(ctx, "gret", greetIn{}, kagzi.RequireWorker())
	mustErrorIs(t, err, kagzi.ErrNoWorker)

	stop() // OFFLINE workers do not count
	_, err = e.client.StartByName(ctx, "greet", greetIn{}, kagzi.RequireWorker())
	mustErrorIs(t, err, kagzi.ErrNoWorker)
}

func TestStartByNameOfATypeNoWorkerRegisteredWarnsOncePerType(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	logs := &recordedLogs{}
	c, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := c.StartByName(ctx, "gret", 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.StartByName(ctx, "greet", 1); err != nil {
		t.Fatal(err)
	}
	if got := logs.warnings(); len(got) != 2 || got[0] != "gret" || got[1] != "greet" {
		t.Fatalf("warned of types %q, want gret then greet, once each", got)
	}

	runWorker(t, e.client, fastWorker(), greet)
	eventually(t, "the worker to register", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM kagzi.workers WHERE status = 'ONLINE'`) == 1
	})
	quiet := &recordedLogs{}
	c, err = kagzi.NewClient(e.pool, kagzi.Config{Logger: slog.New(quiet)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartByName(ctx, "greet", greetIn{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kagzi.Start(ctx, c, kagzi.Define("typed-and-unregistered",
		func(*kagzi.Context, int) (int, error) { return 0, nil }), 1); err != nil {
		t.Fatal(err)
	}
	if got := quiet.warnings(); len(got) != 0 {
		t.Fatalf("warned of %q; want no warning for a registered type, nor for typed starts", got)
	}
}

// recordedLogs is a slog.Handler that keeps the workflow_type of each warning.
type recordedLogs struct {
	mu    sync.Mutex
	types []string
}

func (r *recordedLogs) Enabled(context.Context, slog.Level) bool { return true }

func (r *recordedLogs) Handle(_ context.Context, rec slog.Record) error {
	if rec.Level != slog.LevelWarn {
		return nil
	}
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "workflow_type" {
			r.mu.Lock()
			r.types = append(r.types, a.Value.String())
			r.mu.Unlock()
		}
		return true
	})
	return nil
}

func (r *recordedLogs) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recordedLogs) WithGroup(string) slog.Handler      { return r }

func (r *recordedLogs) warnings() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.types...)
}

// Found from outside: a Wait registering the client as a waiter for run ends held a
// mutex while the database did not answer, and every other Wait of the client queued
// behind it past its own deadline.
func TestAWaitReturnsAtItsDeadlineWhileAnotherWaitOfTheClientHangsOnADatabaseThatDoesNotAnswer(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@"+silentServer(t)+"/postgres?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c := newClient(t, pool, "")
	hung, cancelHung := context.WithCancel(context.Background())
	defer cancelHung()
	go kagzi.RunOf[string](c, uuid.NewString()).Wait(hung) // no deadline: hangs until the test ends
	time.Sleep(200 * time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := kagzi.RunOf[string](c, uuid.NewString()).Wait(ctx)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait with a deadline on a database that does not answer: %v, want its deadline", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("a Wait with a 500 ms deadline had not returned after a minute, behind another Wait of its client")
	}
}
