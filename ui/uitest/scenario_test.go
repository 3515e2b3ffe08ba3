package uitest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

// scenario is a namespace with runs of every kind the console draws: completed with
// steps, sleeps and children, retried, failed with a stack, waiting for a signal,
// sleeping, cancelled, and failed runs to rerun in bulk.
type scenario struct {
	pool   *pgxpool.Pool
	client *kagzi.Client
	broken atomic.Bool // the ledger runs fail while it is set

	order, failed, waiting, reminder string   // run ids
	ledger                           []string // the failed runs to rerun in bulk
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

type orderIn struct {
	OrderID string   `json:"order_id"`
	Items   []string `json:"items"`
}

func (s *scenario) workflows() []kagzi.Definition {
	var chargeCalls sync.Map // run id → *atomic.Int32
	ship := kagzi.Define("ship", func(ctx *kagzi.Context, item string) (string, error) {
		return kagzi.Step(ctx, "label", func(context.Context) (string, error) {
			time.Sleep(20 * time.Millisecond)
			return "label-" + item, nil
		})
	})
	order := kagzi.Define("order", func(ctx *kagzi.Context, in orderIn) (string, error) {
		if _, err := kagzi.Step(ctx, "reserve", func(context.Context) (bool, error) {
			time.Sleep(15 * time.Millisecond)
			return true, nil
		}); err != nil {
			return "", err
		}
		if _, err := kagzi.Step(ctx, "charge", func(context.Context) (string, error) {
			n, _ := chargeCalls.LoadOrStore(ctx.RunID(), new(atomic.Int32))
			if n.(*atomic.Int32).Add(1) <= 2 {
				return "", errors.New("card network timeout")
			}
			return "ch_123", nil
		}, kagzi.WithRetry(kagzi.Linear(3, 30*time.Millisecond))); err != nil {
			return "", err
		}
		if err := ctx.Sleep("settle", 300*time.Millisecond); err != nil {
			return "", err
		}
		var kids []*kagzi.ChildRun[string]
		for _, item := range in.Items {
			k, err := kagzi.StartChild(ctx, "ship", ship, item)
			if err != nil {
				return "", err
			}
			kids = append(kids, k)
		}
		for _, k := range kids {
			if _, err := k.Get(); err != nil {
				return "", err
			}
		}
		return "order " + in.OrderID + " shipped", ctx.SetEvent("stage", "shipped")
	})
	importFile := kagzi.Define("import-file", func(ctx *kagzi.Context, name string) (int, error) {
		return kagzi.Step(ctx, "parse", func(context.Context) (int, error) {
			var rows []int
			return rows[3], nil // panics: index out of range
		}, kagzi.WithRetry(kagzi.NoRetry()))
	})
	approval := kagzi.Define("approval", func(ctx *kagzi.Context, po string) (string, error) {
		return kagzi.WaitSignal[string](ctx, "approve", time.Hour)
	})
	reminder := kagzi.Define("reminder", func(ctx *kagzi.Context, who string) (string, error) {
		return "reminded " + who, ctx.Sleep("wait-a-day", 24*time.Hour)
	})
	ledger := kagzi.Define("sync-ledger", func(ctx *kagzi.Context, account string) (string, error) {
		return kagzi.Step(ctx, "post-entries", func(context.Context) (string, error) {
			if s.broken.Load() {
				return "", kagzi.NonRetryable(errors.New("ledger API returned 409: schema changed"))
			}
			return "synced " + account, nil
		})
	})
	return []kagzi.Definition{ship, order, importFile, approval, reminder, ledger}
}

// start runs the scenario's workflows to the states the test expects.
func (s *scenario) start(t *testing.T, ctx context.Context) {
	t.Helper()
	s.broken.Store(true)
	byName := func(name string, in any, opts ...kagzi.StartOption) string {
		t.Helper()
		r, err := s.client.StartByName(ctx, name, in, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return r.RunID
	}
	s.order = byName("order", orderIn{OrderID: "A-1001", Items: []string{"lamp", "desk"}}, kagzi.WithID("order-A-1001"))
	for i := range 4 {
		byName("order", orderIn{OrderID: fmt.Sprint("A-10", 10+i), Items: []string{"chair"}})
	}
	s.failed = byName("import-file", "customers.csv")
	s.waiting = byName("approval", "PO-77")
	approved := byName("approval", "PO-76")
	s.reminder = byName("reminder", "sam")
	for _, acct := range []string{"acme", "globex", "initech"} {
		s.ledger = append(s.ledger, byName("sync-ledger", acct))
	}
	s.waitFor(t, ctx, s.order, kagzi.StatusCompleted)
	s.waitFor(t, ctx, s.failed, kagzi.StatusFailed)
	for _, id := range s.ledger {
		s.waitFor(t, ctx, id, kagzi.StatusFailed)
	}
	s.waitFor(t, ctx, approved, kagzi.StatusSleeping)
	if err := s.client.Signal(ctx, approved, "approve", "alice"); err != nil {
		t.Fatal(err)
	}
	s.waitFor(t, ctx, approved, kagzi.StatusCompleted)
	s.waitFor(t, ctx, s.waiting, kagzi.StatusSleeping)
	s.waitFor(t, ctx, s.reminder, kagzi.StatusSleeping)
	cancelled := byName("reminder", "kim")
	s.waitFor(t, ctx, cancelled, kagzi.StatusSleeping)
	if err := s.client.Cancel(ctx, cancelled); err != nil {
		t.Fatal(err)
	}
	for _, sc := range []kagzi.Schedule{
		{ID: "nightly-ledger", WorkflowType: "sync-ledger", Cron: "0 3 * * *", TimeZone: "Europe/Paris", Input: "all"},
		{ID: "weekly-import", WorkflowType: "import-file", Cron: "30 6 * * MON", Input: "weekly.csv", Overlap: kagzi.OverlapSkip},
	} {
		if _, err := s.client.CreateSchedule(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.client.TriggerSchedule(ctx, "weekly-import"); err != nil {
		t.Fatal(err)
	}
	if err := s.client.PauseSchedule(ctx, "weekly-import"); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls a run until it has the status.
func (s *scenario) waitFor(t *testing.T, ctx context.Context, runID string, want kagzi.RunStatus) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := s.client.GetRun(ctx, runID)
		if err != nil {
			t.Fatal(err)
		}
		if info.Status == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s (%s) is %s, want %s", runID, info.WorkflowType, info.Status, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
