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
	step := StepWrite{Fence: stale, Key: "s#1", Name: "s", Status: vocab.StepCompleted, StepStatus: vocab.StepCompleted,
		Output: []byte(`1`), StartedAt: now, FinishedAt: now}
	writes := fencedWrites(ctx, pool, stale)
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

// fencedWriteCase is one of the fenced writes, made under a given fence.
type fencedWriteCase struct {
	name  string
	write func() error
}

// fencedWrites lists every fenced write, each made under the fence stale (which the
// caller expects to fail); the run has a signal "go" to take.
func fencedWrites(ctx context.Context, pool *pgxpool.Pool, stale Fence) []fencedWriteCase {
	now := time.Now()
	retryIn := time.Second
	pos := 1
	step := StepWrite{Fence: stale, Key: "s#1", Name: "s", Status: vocab.StepCompleted, StepStatus: vocab.StepCompleted,
		Output: []byte(`1`), StartedAt: now, FinishedAt: now}
	return []fencedWriteCase{
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
}

// Found in a chaos run: a worker frozen past its lease, whose run nobody took over,
// renewed the lease when it woke and recorded the run, while a claim had given the
// run's slot of its type's concurrency limit (limit 1) to another run meanwhile: two
// runs of the type executed and recorded at once. A run holding a slot whose lease
// passed is lost to its worker: every fenced write, the renewal and the heartbeat
// fail, under its own epoch too (a hand-back, which records nothing, may still give it
// back).
func TestEveryFencedWriteOfALapsedSlotHolderWritesNothing(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	run := runningRun(t, pool, 1, false)
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET holds_type_slot = true, available_at = now() - interval '1 second'
		WHERE run_id = $1`, run); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.signals (run_id, name, payload) VALUES ($1, 'go', '1')`, run); err != nil {
		t.Fatal(err)
	}
	own := Fence{RunID: run, Epoch: 1}
	for _, w := range fencedWrites(ctx, pool, own) {
		if w.name == "hand-back" {
			continue
		}
		before := dbState(t, pool)
		if err := w.write(); !errors.Is(err, ErrLeaseLost) {
			t.Errorf("%s of a slot holder whose lease passed: %v, want ErrLeaseLost", w.name, err)
		}
		if after := dbState(t, pool); after != before {
			t.Errorf("%s of a slot holder whose lease passed changed the database:\nbefore %s\nafter  %s", w.name, before, after)
		}
	}
	// The control: the same run, its lease live, records.
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET available_at = now() + interval '1 minute' WHERE run_id = $1`, run); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if _, err := RecordStep(ctx, Direct(pool), StepWrite{Fence: own, Key: "s#1", Name: "s", Status: vocab.StepCompleted,
		StepStatus: vocab.StepCompleted, Output: []byte(`1`), StartedAt: now, FinishedAt: now}); err != nil {
		t.Fatalf("a slot holder under a live lease: %v", err)
	}
}

// A signal take tried again after its first try committed (its answer lost with the
// connection) returns the signal the first took, and takes no other: the second try
// took the next pending signal of the name and recorded nothing of it, a signal lost.
func TestASignalTakeTriedAgainReturnsTheSignalItTookAndTakesNoOther(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	run := runningRun(t, pool, 1, false)
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.signals (run_id, name, payload) VALUES ($1, 'go', '1'), ($1, 'go', '2')`,
		run); err != nil {
		t.Fatal(err)
	}
	take := SignalTake{Fence: Fence{RunID: run, Epoch: 1}, Key: "go#1", Name: "go", Position: 1}
	for try := 1; try <= 2; try++ {
		w, err := TakeSignal(ctx, pool, take)
		if err != nil {
			t.Fatal(err)
		}
		if !w.Received || string(w.Payload) != "1" {
			t.Fatalf("try %d: received %v with %s, want the first signal's 1", try, w.Received, w.Payload)
		}
	}
	var pending []string
	if err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(payload::text ORDER BY id), '{}') FROM kagzi.signals
		WHERE run_id = $1 AND consumed_by IS NULL`, run).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	if len(pending) != 1 || pending[0] != "2" {
		t.Fatalf("signals still pending after two tries of one take: %v, want the second, 2", pending)
	}
	// The next wait of the name takes the second.
	next := take
	next.Key, next.Position = "go#2", 2
	if w, err := TakeSignal(ctx, pool, next); err != nil || !w.Received || string(w.Payload) != "2" {
		t.Fatalf("the next wait: received %v with %s (%v), want 2", w.Received, w.Payload, err)
	}
}

// A failed attempt's record written again (its first try committed, its answer lost
// with the connection) is the same attempt: the step keeps its count and its history
// one row for it, and the next attempt is the second. The second try counted a third.
func TestAFailedAttemptRecordedTwiceIsOneAttempt(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	run := runningRun(t, pool, 1, false)
	f := Fence{RunID: run, Epoch: 1}
	began := time.Now()
	failedAttempt := StepWrite{Fence: f, Key: "s#1", Name: "s", Status: vocab.StepFailed, StepStatus: vocab.StepRetrying,
		Error: []byte(`{"message":"boom"}`), StartedAt: began, FinishedAt: began.Add(time.Millisecond)}
	for try := 1; try <= 2; try++ {
		if n, err := RecordStep(ctx, Direct(pool), failedAttempt); err != nil || n != 1 {
			t.Fatalf("try %d of the first attempt's record: attempt %d, %v; want attempt 1", try, n, err)
		}
	}
	second := StepWrite{Fence: f, Key: "s#1", Name: "s", Status: vocab.StepCompleted, StepStatus: vocab.StepCompleted,
		Output: []byte(`1`), StartedAt: began.Add(time.Second), FinishedAt: began.Add(time.Second + time.Millisecond)}
	if n, err := RecordStep(ctx, Direct(pool), second); err != nil || n != 2 {
		t.Fatalf("the second attempt's record: attempt %d, %v; want attempt 2", n, err)
	}
	var attempts int
	var history []string
	if err := pool.QueryRow(ctx, `SELECT s.attempts, (SELECT array_agg(a.attempt || ' ' || a.status ORDER BY a.attempt)
		FROM kagzi.step_attempts a WHERE a.run_id = s.run_id AND a.step_key = s.step_key)
		FROM kagzi.steps s WHERE s.run_id = $1 AND s.step_key = 's#1'`, run).Scan(&attempts, &history); err != nil {
		t.Fatal(err)
	}
	if attempts != 2 || fmt.Sprint(history) != "[1 FAILED 2 COMPLETED]" {
		t.Fatalf("the step counts %d attempts with history %v, want 2 and [1 FAILED 2 COMPLETED]", attempts, history)
	}
}

// EndedUnder tells how a run ended under a claim: its status, its error's code and
// the run it continued as; nothing for a run still running or ended under another.
func TestEndedUnderTellsTheStatusAndCodeOfAnEndUnderTheClaim(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	run := runningRun(t, pool, 1, false)
	f := Fence{RunID: run, Epoch: 1}
	if _, ok, err := EndedUnder(ctx, pool, f); err != nil || ok {
		t.Fatalf("a running run: ended %v, %v; want not ended", ok, err)
	}
	// A deadline's end, under the same claim (failOverdue keeps epoch and token).
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'FAILED', finished_at = now(),
		error = '{"code": "DEADLINE_EXCEEDED", "message": "late"}' WHERE run_id = $1`, run); err != nil {
		t.Fatal(err)
	}
	ended, ok, err := EndedUnder(ctx, pool, f)
	if err != nil || !ok || ended.Status != vocab.StatusFailed || ended.Code != "DEADLINE_EXCEEDED" {
		t.Fatalf("ended under the claim: %+v, %v, %v; want FAILED with DEADLINE_EXCEEDED", ended, ok, err)
	}
	if _, ok, err := EndedUnder(ctx, pool, Fence{RunID: run, Epoch: 2}); err != nil || ok {
		t.Fatalf("under another claim: ended %v, %v; want not", ok, err)
	}
}
