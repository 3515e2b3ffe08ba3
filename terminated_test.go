package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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
