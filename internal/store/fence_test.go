package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi/internal/testdb"
	"github.com/kagzi/kagzi/internal/vocab"
)

// dbState is what a fenced write could change: the run's row and every row beside it.
func dbState(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var s string
	err := pool.QueryRow(context.Background(), `SELECT concat_ws(' | ',
		(SELECT string_agg(concat_ws(',', run_id, status, lease_epoch, available_at, attempt, output, error,
			locked_by, waiting_signal, finished_at, attributes), ';') FROM kagzi.runs),
		(SELECT count(*) FROM kagzi.steps), (SELECT count(*) FROM kagzi.step_attempts),
		(SELECT string_agg(concat_ws(',', id, consumed_by), ';') FROM kagzi.signals),
		(SELECT count(*) FROM kagzi.events))`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestEveryFencedWriteWithAStaleEpochWritesNothing(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	run := runningRun(t, pool, 2, false) // claimed again: epoch 1 is stale
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.signals (run_id, name, payload) VALUES ($1, 'go', '1')`, run); err != nil {
		t.Fatal(err)
	}
	stale := Fence{RunID: run, Epoch: 1}
	now := time.Now()
	retryIn := time.Second
	pos := 1
	step := StepWrite{Fence: stale, Key: "s#1", Name: "s", Status: vocab.StepCompleted, StepStatus: vocab.StepCompleted,
		Output: []byte(`1`), StartedAt: now, FinishedAt: now}
	writes := []struct {
		name  string
		write func() error
	}{
		{"step record", func() error { _, err := RecordStep(ctx, Direct(pool), step); return err }},
		{"step record that releases the run", func() error {
			w := step
			w.Status, w.StepStatus, w.Output, w.Error, w.RetryIn = vocab.StepFailed, vocab.StepRetrying, nil, []byte(`{}`), &retryIn
			_, err := RecordStep(ctx, Direct(pool), w)
			return err
		}},
		{"in-process sleep", func() error {
			_, _, err := RecordSleep(ctx, Direct(pool), SleepWrite{Fence: stale, Key: "nap#1", Name: "nap", Duration: time.Second})
			return err
		}},
		{"suspension", func() error {
			_, err := Suspend(ctx, Direct(pool), SleepWrite{Fence: stale, Key: "nap#1", Name: "nap", Duration: time.Hour})
			return err
		}},
		{"run end with its last step", func() error {
			last := step
			_, err := FinishRun(ctx, Direct(pool), FinishWrite{Fence: stale, Status: vocab.StatusCompleted, Output: []byte(`1`), Last: &last})
			return err
		}},
		{"workflow retry", func() error { return RetryRun(ctx, pool, stale, []byte(`{}`), time.Second) }},
		{"result step", func() error {
			return RecordResultStep(ctx, pool, ResultStep{Fence: stale, Key: "c#1", Name: "c", Kind: vocab.KindChild,
				Status: vocab.StepCompleted, Position: &pos, Output: []byte(`{}`)})
		}},
		{"wait", func() error {
			_, err := SuspendForWait(ctx, pool, WaitWrite{Fence: stale, WakeAt: now.Add(time.Hour), Signal: "go"})
			return err
		}},
		{"signal taken", func() error {
			_, err := TakeSignal(ctx, pool, SignalTake{Fence: stale, Key: "go#1", Name: "go", Position: 1})
			return err
		}},
		{"event", func() error {
			return SetEvent(ctx, pool, EventWrite{Fence: stale, StepKey: "e#1", Key: "e", Position: 1, Value: []byte(`1`)})
		}},
		{"attributes", func() error {
			_, err := SetAttributes(ctx, pool, AttributesWrite{Fence: stale, StepKey: "attributes#1", Name: "attributes",
				Position: 1, Change: []byte(`{"a": 1}`), Set: []byte(`{"a": 1}`), MaxBytes: 1 << 14})
			return err
		}},
		{"lease renewal", func() error { _, err := RenewLease(ctx, pool, stale, time.Hour); return err }},
		{"hand-back", func() error {
			if err := ReleaseRuns(ctx, pool, []Fence{stale}); err != nil {
				return err
			}
			return ErrLeaseLost // a set-based write reports nothing per run: the state tells
		}},
		{"heartbeat", func() error {
			res, err := Heartbeat(ctx, pool, WorkerBeat{Namespace: "default", WorkerID: "w"}, []Fence{stale}, time.Hour)
			if err != nil {
				return err
			}
			if len(res) != 0 {
				return fmt.Errorf("the beat reports the run held: %+v", res)
			}
			return ErrLeaseLost
		}},
	}
	for _, w := range writes {
		before := dbState(t, pool)
		if err := w.write(); !errors.Is(err, ErrLeaseLost) {
			t.Errorf("%s under a stale epoch: %v, want ErrLeaseLost", w.name, err)
		}
		if after := dbState(t, pool); after != before {
			t.Errorf("%s under a stale epoch changed the database:\nbefore %s\nafter  %s", w.name, before, after)
		}
	}
	// The control: under the run's own epoch, the first write records, and the state shows it.
	before := dbState(t, pool)
	live := step
	live.Fence = Fence{RunID: run, Epoch: 2}
	if _, err := RecordStep(ctx, Direct(pool), live); err != nil {
		t.Fatal(err)
	}
	if dbState(t, pool) == before {
		t.Fatal("a step recorded under the live epoch did not change the state: the test sees nothing")
	}
}
