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
