package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

var terminatedStarts = kagzi.Define("terminated-starts", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })

// Found from outside: a start whose session the server ended (pg_terminate_backend,
// or a fast shutdown: 57P01) said it did not commit, and a retry found its run
// (AlreadyExists): the server can end the session after the start's COMMIT, before
// its answer. Such a start may have committed; one that says it did not, did not.
func TestAStartWhoseSessionTheServerEndedNeverSaysItDidNotCommitWhenItDid(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var name string
	if err := e.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	killer, err := pgx.Connect(ctx, e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer killer.Close(context.Background())
	var stop atomic.Bool
	var mu sync.Mutex
	var wrong []string
	var refused atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				id := fmt.Sprintf("g%d-%d", g, i)
				saidNotCommitted := false
				for attempt := 0; attempt < 100 && ctx.Err() == nil; attempt++ {
					r, err := kagzi.Start(ctx, e.client, terminatedStarts, i, kagzi.WithID(id), kagzi.WithIDReuse(kagzi.IDReuseNever))
					var u *kagzi.UnavailableError
					switch {
					case err == nil:
						if r.AlreadyExists && saidNotCommitted {
							mu.Lock()
							wrong = append(wrong, id)
							mu.Unlock()
						}
					case errors.As(err, &u) && !u.MayHaveCommitted:
						refused.Add(1)
						saidNotCommitted = true
						continue
					}
					break // started, or an outcome unknown (left out of the check)
				}
			}
		}()
	}
	for deadline := time.Now().Add(4 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if _, err := killer.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND random() < 0.5`, name); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if len(wrong) > 0 {
		t.Fatalf("%d starts said they did not commit, and their retry found their run: %v", len(wrong), wrong)
	}
	t.Logf("%d starts said they did not commit", refused.Load())
}

// Found in review of the change above: a request in the caller's transaction whose
// session the server ended (57P01) cannot have committed, since nothing commits
// before the caller's COMMIT; SignalTx, CancelTx and StartTx's look for a live worker
// said it may have.
func TestARequestInTheCallersTransactionWhoseSessionTheServerEndedDidNotCommit(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	cases := map[string]func(tx pgx.Tx) error{
		"StartTx": func(tx pgx.Tx) error {
			_, err := kagzi.StartTx(ctx, tx, e.client, terminatedStarts, 1, kagzi.WithID("x1"))
			return err
		},
		"StartTx RequireWorker": func(tx pgx.Tx) error {
			_, err := kagzi.StartTx(ctx, tx, e.client, terminatedStarts, 1, kagzi.WithID("x2"), kagzi.RequireWorker())
			return err
		},
		"SignalTx": func(tx pgx.Tx) error {
			return e.client.SignalTx(ctx, tx, "01a22014-763e-7814-a5d0-5c1b9957efc0", "s", 1)
		},
		"CancelTx": func(tx pgx.Tx) error {
			return e.client.CancelTx(ctx, tx, "01a22014-763e-7814-a5d0-5c1b9957efc0")
		},
	}
	for name, call := range cases {
		conn, err := pgx.Connect(ctx, e.url)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pid := conn.PgConn().PID()
		if _, err := e.pool.Exec(ctx, `SELECT pg_terminate_backend($1, 5000)`, pid); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		err = call(tx)
		var u *kagzi.UnavailableError
		switch {
		case !errors.As(err, &u):
			t.Errorf("%s: %v, want an UnavailableError", name, err)
		case u.MayHaveCommitted:
			t.Errorf("%s: MayHaveCommitted in the caller's transaction: %v", name, err)
		}
		conn.Close(context.Background())
	}
}

var continuesThenWaits = kagzi.Define("continues-then-waits", func(ctx *kagzi.Context, n int) (int, error) {
	if n == 0 {
		return 0, kagzi.ContinueAsNew(ctx, 1)
	}
	if _, err := kagzi.WaitSignal[int](ctx, "never", time.Hour); err != nil {
		return 0, err
	}
	return n, nil
})

// batchKiller terminates the backend of the batch that reads SignalKeyMoved's chain.
type batchKiller struct {
	armed  atomic.Bool
	killer *pgxpool.Pool
}

func (k *batchKiller) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (k *batchKiller) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (k *batchKiller) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	for _, q := range data.Batch.QueuedQueries {
		if strings.Contains(q.SQL, "WITH RECURSIVE chain") && k.armed.CompareAndSwap(true, false) {
			_, _ = k.killer.Exec(context.Background(), `SELECT pg_terminate_backend($1, 5000)`, conn.PgConn().PID())
			time.Sleep(50 * time.Millisecond)
		}
	}
	return ctx
}
func (k *batchKiller) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (k *batchKiller) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// Found in review: a keyed Signal to a run that continued as new stores nothing (the
// run ended), and when the read that then looks for the key down the chain
// (SignalKeyMoved) lost its session, the error said the signal may have committed.
func TestAKeyedSignalWhoseLookDownTheChainLostItsSessionDidNotCommit(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	_, stop := startWorker(t, e.client, kagzi.WorkerConfig{}, continuesThenWaits)
	defer stop()
	run, err := kagzi.Start(ctx, e.client, continuesThenWaits, 0, kagzi.WithID("keyed-chain"))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the run continued as new", func() bool {
		info, err := e.client.GetRun(ctx, run.RunID)
		return err == nil && info.ContinuedAsRunID != ""
	})
	cfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		t.Fatal(err)
	}
	k := &batchKiller{killer: e.pool}
	cfg.ConnConfig.Tracer = k
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c := newClient(t, pool, "")
	k.armed.Store(true)
	err = c.Signal(ctx, run.RunID, "other", 1, kagzi.SignalKey("k1"))
	if k.armed.Load() {
		t.Fatalf("the read was never sent: %v", err)
	}
	var n int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.signals_all WHERE key = 'k1'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	var u *kagzi.UnavailableError
	if !errors.As(err, &u) {
		t.Fatalf("%v, want an UnavailableError", err)
	}
	if n == 0 && u.MayHaveCommitted {
		t.Fatalf("a read after a refused send says it may have committed: %v", err)
	}
}
