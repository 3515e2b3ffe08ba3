package kagzi_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

// A run taken over MaxTakeovers times runs alone in its worker (see WorkerConfig.
// MaxTakeovers). These tests make a run such a suspect without killing processes:
// its start sets its takeover count in the same transaction.

// startSuspect starts a run of wf whose takeover count is already takeovers.
func startSuspect[In, Out any](t *testing.T, e *env, wf *kagzi.Workflow[In, Out], input In,
	takeovers int) *kagzi.Run[Out] {
	t.Helper()
	ctx := waitCtx(t)
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	run, err := kagzi.StartTx(ctx, tx, e.client, wf, input)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE kagzi.runs SET takeovers = $2 WHERE run_id = $1`, run.RunID, takeovers); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return run
}

// aloneRecord reads what the run's last execution recorded of how it ran ("" when
// nothing).
func aloneRecord(t *testing.T, pool *pgxpool.Pool, runID string) (alone bool, found bool) {
	t.Helper()
	var out []byte
	err := pool.QueryRow(context.Background(), `SELECT output FROM kagzi.steps WHERE run_id = $1 AND step_key = 'kagzi#alone'`,
		runID).Scan(&out)
	if err != nil {
		return false, false
	}
	var m struct {
		Alone bool `json:"alone"`
	}
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("the run's record of how it ran: %s: %v", out, err)
	}
	return m.Alone, true
}

// A suspect that waits in a branch for its own child (which it cannot suspend for)
// would wait for ever if its worker claimed nothing while it runs alone: its window
// alone ends, the worker claims the child, and the suspect completes.
func TestASuspectWaitingForItsOwnChildInABranchCompletesInItsOnlyWorker(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	child := kagzi.Define("solo-child", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Step(ctx, "double", func(context.Context) (int, error) { return 2 * n, nil })
	})
	parent := kagzi.Define("solo-parent", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Go(ctx, "branch", func(b *kagzi.Context) (int, error) {
			c, err := kagzi.StartChild(b, "child", child, n)
			if err != nil {
				return 0, err
			}
			return c.Get()
		}).Get()
	})
	cfg := fastWorker()
	cfg.MaxTakeovers = 1
	run := startSuspect(t, e, parent, 21, 1)
	runWorker(t, e.client, cfg, parent, child)
	if out, err := run.Wait(ctx); err != nil || out != 42 {
		t.Fatalf("the suspect waiting for its child: %d, %v; want 42", out, err)
	}
	if alone, found := aloneRecord(t, e.pool, run.RunID); !found || alone {
		t.Fatalf("the suspect's record says alone=%v (found %v); want a record that it no longer ran alone", alone,
			found)
	}
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil || info.Takeovers != 1 {
		t.Fatalf("the suspect: %+v, %v; want its one takeover, no more", info, err)
	}
}

// A worker that claims a suspect while it executes other runs hands it back and waits
// for its runs to end, but not for ever: a parent among them may wait for a child
// that only this worker claims. Past the wait, the suspect runs beside the others.
func TestAWorkerHoldingBackASuspectStillClaimsTheChildrenItsRunsWaitFor(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	entered, release := make(chan struct{}), make(chan struct{})
	child := kagzi.Define("held-child", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Step(ctx, "double", func(context.Context) (int, error) { return 2 * n, nil })
	})
	parent := kagzi.Define("held-parent", func(ctx *kagzi.Context, n int) (int, error) {
		return kagzi.Go(ctx, "branch", func(b *kagzi.Context) (int, error) {
			if _, err := kagzi.Step(b, "hold", func(context.Context) (int, error) {
				select {
				case entered <- struct{}{}:
				default:
				}
				<-release
				return 0, nil
			}); err != nil {
				return 0, err
			}
			c, err := kagzi.StartChild(b, "child", child, n)
			if err != nil {
				return 0, err
			}
			return c.Get()
		}).Get()
	})
	cfg := fastWorker()
	cfg.MaxTakeovers = 1
	cfg.MaxConcurrent = 4
	runWorker(t, e.client, cfg, parent, child, steadyWorkflow)
	p, err := kagzi.Start(ctx, e.client, parent, 5)
	if err != nil {
		t.Fatal(err)
	}
	<-entered
	s := startSuspect(t, e, steadyWorkflow, 1, 1)
	eventually(t, "the worker to claim the suspect and hand it back", func() bool {
		_, found := aloneRecord(t, e.pool, s.RunID)
		var claims int
		if err := e.pool.QueryRow(ctx, `SELECT lease_epoch FROM kagzi.runs WHERE run_id = $1`, s.RunID).Scan(&claims); err != nil {
			t.Fatal(err)
		}
		return claims > 0 || found
	})
	close(release)
	if out, err := p.Wait(ctx); err != nil || out != 10 {
		t.Fatalf("the parent waiting for its child beside a held-back suspect: %d, %v; want 10", out, err)
	}
	if out, err := s.Wait(ctx); err != nil || out != 2 {
		t.Fatalf("the suspect: %d, %v; want 2", out, err)
	}
	if alone, found := aloneRecord(t, e.pool, s.RunID); !found || alone {
		t.Fatalf("the suspect's record says alone=%v (found %v); want that it ran beside the parent", alone, found)
	}
}

// The record of how a suspect ran is not a patch: Patched of a change id that is its
// key answers as for any new change.
func TestPatchedDoesNotReadTheRecordOfARunAlone(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("solo-patched", func(ctx *kagzi.Context, _ int) (bool, error) {
		// The sleep ends the first execution: the second loads the record.
		if err := ctx.Sleep("nap", 50*time.Millisecond); err != nil {
			return false, err
		}
		return ctx.Patched("kagzi#alone"), nil
	})
	cfg := fastWorker()
	cfg.MaxTakeovers = 1
	cfg.MaxInProcessSleep = time.Millisecond
	run := startSuspect(t, e, wf, 0, 1)
	runWorker(t, e.client, cfg, wf)
	if out, err := run.Wait(ctx); err != nil || !out {
		t.Fatalf("Patched in a suspect: %v, %v; want true", out, err)
	}
	if alone, found := aloneRecord(t, e.pool, run.RunID); !found || !alone {
		t.Fatalf("the suspect's record says alone=%v (found %v); want that it ran alone", alone, found)
	}
}
