package store

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi/internal/testdb"
)

// runningRun inserts a RUNNING run held under epoch, and returns its id.
func runningRun(t *testing.T, pool *pgxpool.Pool, epoch int64, cancelRequested bool) uuid.UUID {
	t.Helper()
	id := uuid.New()
	_, err := pool.Exec(context.Background(), `INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type,
		status, input, available_at, locked_by, lease_epoch, cancel_requested)
		VALUES ($1, 'default', $4, 'wf', 'RUNNING', '{}', now() + interval '1 minute', 'w', $2, $3)`,
		id, epoch, cancelRequested, id.String())
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// setRows runs a set write for the inputs at once and returns its rows by input index.
func setRows[W any](t *testing.T, pool *pgxpool.Pool, s *setWrite[W], inputs ...W) map[int][]any {
	t.Helper()
	in := make([]any, len(inputs))
	for i, w := range inputs {
		in[i] = w
	}
	sql, args := s.stmt.Build(in)
	rows, err := pool.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[int][]any{}
	for rows.Next() {
		v, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		got[int(v[0].(int64))] = v[1:]
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

func stepWrite(run uuid.UUID, epoch int64, key, output string) *StepWrite {
	now := time.Now()
	return &StepWrite{Fence: Fence{RunID: run, Epoch: epoch}, Key: key, Name: "s", Status: "COMPLETED", StepStatus: "COMPLETED",
		Output: []byte(output), StartedAt: now, FinishedAt: now, Position: 1}
}

func TestStepRecordsOfManyRunsAreFencedPerRunAndNeverOverwriteACompletedStep(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	held := runningRun(t, pool, 1, false)
	taken := runningRun(t, pool, 2, false) // claimed again since: epoch 1 is stale
	done := runningRun(t, pool, 1, false)
	if _, err := pool.Exec(ctx, `INSERT INTO kagzi.steps (run_id, step_key, name, kind, status, output, attempts)
		VALUES ($1, 's#1', 's', 'STEP', 'COMPLETED', '"first"', 1)`, done); err != nil {
		t.Fatal(err)
	}
	got := setRows(t, pool, recordSteps,
		stepWrite(held, 1, "s#1", `"a"`),
		stepWrite(held, 1, "s#2", `"b"`), // a parallel branch of the same run
		stepWrite(taken, 1, "s#1", `"late"`),
		stepWrite(done, 1, "s#1", `"again"`),
	)
	for i, want := range []struct {
		owned    int32
		attempts any
	}{{1, int32(1)}, {1, int32(1)}, {0, nil}, {1, nil}} {
		r := got[i+1]
		if r == nil || r[0] != want.owned || r[1] != want.attempts {
			t.Fatalf("request %d: got %v, want owned %d, attempts %v", i+1, r, want.owned, want.attempts)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.steps WHERE run_id = $1`, taken).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d steps recorded for the run under a stale epoch (%v), want 0", n, err)
	}
	var out string
	if err := pool.QueryRow(ctx, `SELECT output::text FROM kagzi.steps WHERE run_id = $1`, done).Scan(&out); err != nil || out != `"first"` {
		t.Fatalf("completed step output %s (%v), want it kept", out, err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.step_attempts`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d history rows for first attempts that completed (%v), want 0", n, err)
	}
}

func TestEndsOfManyRunsAreFencedAndRecordTheirLastStep(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	held := runningRun(t, pool, 1, false)
	taken := runningRun(t, pool, 2, false)
	cancelled := runningRun(t, pool, 1, true)
	plain := runningRun(t, pool, 1, false)
	key, name, pos := "last#1", "last", 0
	now := time.Now()
	end := func(run uuid.UUID, withStep bool) *FinishWrite {
		w := &FinishWrite{Fence: Fence{RunID: run, Epoch: 1}, Status: "COMPLETED", Output: []byte(`"out"`)}
		if withStep {
			w.Last = &StepWrite{Key: key, Name: name, Output: []byte(`"step"`), StartedAt: now, FinishedAt: now, Position: pos}
		}
		return w
	}
	got := setRows(t, pool, finishes, end(held, true), end(taken, true), end(cancelled, false), end(plain, false))
	if len(got) != 3 || got[1][0] != "COMPLETED" || got[2] != nil || got[3][0] != "CANCELLED" || got[4][0] != "COMPLETED" {
		t.Fatalf("got %v, want 1 COMPLETED, 2 fenced out (no row), 3 CANCELLED, 4 COMPLETED", got)
	}
	var status string
	if err := pool.QueryRow(ctx, `SELECT status FROM kagzi.runs WHERE run_id = $1`, taken).Scan(&status); err != nil || status != "RUNNING" {
		t.Fatalf("the run held by another epoch is %s (%v), want it untouched", status, err)
	}
	var steps int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.steps WHERE run_id = $1 AND output = '"step"'
		AND started_at IS NOT NULL`, held).Scan(&steps); err != nil || steps != 1 {
		t.Fatalf("%d last steps recorded with the end (%v), want 1", steps, err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.steps WHERE run_id = $1`, taken).Scan(&steps); err != nil || steps != 0 {
		t.Fatalf("%d steps recorded under a stale epoch (%v), want 0", steps, err)
	}
}

func TestSuspendsOfManyRunsAreFencedAndPutEachHeldRunToSleep(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	held := runningRun(t, pool, 1, false)
	taken := runningRun(t, pool, 2, false)
	cancelled := runningRun(t, pool, 1, true)
	wake := time.Now().Add(time.Hour)
	sleep := func(run uuid.UUID, key string, at *time.Time) *SleepWrite {
		return &SleepWrite{Fence: Fence{RunID: run, Epoch: 1}, Key: key, Name: "nap", WakeAt: at, Duration: time.Minute}
	}
	got := setRows(t, pool, suspends, sleep(held, "nap#1", nil), sleep(taken, "nap#1", nil), sleep(cancelled, "", &wake))
	if len(got) != 2 || got[1][0] != "SLEEPING" || got[2] != nil || got[3][0] != "CANCELLED" {
		t.Fatalf("got %v, want 1 SLEEPING, 2 fenced out (no row), 3 CANCELLED", got)
	}
	var status string
	var inAMinute bool
	if err := pool.QueryRow(ctx, `SELECT r.status, s.wake_at = r.available_at AND r.available_at > now() + interval '50 seconds'
		FROM kagzi.runs r JOIN kagzi.steps s USING (run_id) WHERE r.run_id = $1 AND s.step_key = 'nap#1'`, held).Scan(&status, &inAMinute); err != nil ||
		status != "SLEEPING" || !inAMinute {
		t.Fatalf("held run %s, wakes with its recorded sleep in a minute: %t (%v)", status, inAMinute, err)
	}
	if err := pool.QueryRow(ctx, `SELECT status FROM kagzi.runs WHERE run_id = $1`, taken).Scan(&status); err != nil || status != "RUNNING" {
		t.Fatalf("the run held by another epoch is %s (%v), want it untouched", status, err)
	}
}

func TestEndsOfManyRunsNotifyAnotherClientsWaitersInFewNotifications(t *testing.T) {
	t.Parallel()
	pool, url := testdb.NewPool(t)
	ctx := context.Background()
	listener := listen(t, url)
	me, other := uuid.New(), uuid.New()
	if err := RegisterWaiter(ctx, pool, "default", other, time.Minute); err != nil {
		t.Fatal(err)
	}
	const n = 320
	ends := make([]*FinishWrite, n)
	want := map[string]bool{}
	for i := range ends {
		run := runningRun(t, pool, 1, false)
		ends[i] = runEnd(run, me)
		want[DoneTopic(run)+"|COMPLETED"] = true
	}
	if got := setRows(t, pool, finishes, ends...); len(got) != n {
		t.Fatalf("%d runs ended, want %d", len(got), n)
	}
	var notifications int
	for len(want) > 0 {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		msg, err := listener.WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("%d runs' ends not notified after %d notifications: %v", len(want), notifications, err)
		}
		notifications++
		if len(msg.Payload) >= 8000 || !strings.HasPrefix(msg.Payload, "\n") {
			t.Fatalf("a payload of %d bytes starting %q: want a batch under 8000 bytes", len(msg.Payload), msg.Payload[:1])
		}
		for _, line := range strings.Split(msg.Payload[1:], "\n") {
			if !want[line] {
				t.Fatalf("unexpected or repeated line %q", line)
			}
			delete(want, line)
		}
	}
	if notifications != 3 { // 150 runs a notification
		t.Fatalf("%d notifications for %d runs, want 3", notifications, n)
	}
}

func TestARunsEndNotifiesOnlyWhileAnotherClientWaitsInItsNamespace(t *testing.T) {
	t.Parallel()
	pool, url := testdb.NewPool(t)
	ctx := context.Background()
	listener := listen(t, url)
	me, other := uuid.New(), uuid.New()
	end := func(merged bool) {
		t.Helper()
		a, b := runningRun(t, pool, 1, false), runningRun(t, pool, 1, false)
		if merged {
			if got := setRows(t, pool, finishes, runEnd(a, me), runEnd(b, me)); len(got) != 2 {
				t.Fatalf("%d runs ended, want 2", len(got))
			}
			return
		}
		if _, err := FinishRun(ctx, Direct(pool), *runEnd(a, me)); err != nil {
			t.Fatal(err)
		}
	}
	sent := func() int {
		t.Helper()
		n := 0
		for {
			wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err := listener.WaitForNotification(wctx)
			cancel()
			if err != nil {
				if wctx.Err() == nil {
					t.Fatal(err)
				}
				return n
			}
			n++
		}
	}
	register := func(ns string, client uuid.UUID, ttl time.Duration) {
		t.Helper()
		if err := RegisterWaiter(ctx, pool, ns, client, ttl); err != nil {
			t.Fatal(err)
		}
	}
	for _, merged := range []bool{false, true} {
		if _, err := pool.Exec(ctx, "DELETE FROM kagzi.waiters"); err != nil {
			t.Fatal(err)
		}
		end(merged)
		if n := sent(); n != 0 {
			t.Fatalf("merged %t, nobody waiting: %d notifications, want 0", merged, n)
		}
		register("default", me, time.Minute)          // the ending worker's own client: told in process
		register("other", other, time.Minute)         // another namespace
		register("default", uuid.New(), -time.Second) // expired
		end(merged)
		if n := sent(); n != 0 {
			t.Fatalf("merged %t, only the ending client, another namespace and an expired registration: %d notifications, want 0", merged, n)
		}
		register("default", other, time.Minute)
		end(merged)
		if n := sent(); n != 1 {
			t.Fatalf("merged %t, another client waiting: %d notifications, want 1", merged, n)
		}
	}
}

// listen returns a connection listening on Channel.
func listen(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "LISTEN "+Channel); err != nil {
		t.Fatal(err)
	}
	return conn
}

// runEnd is a run's end (COMPLETED, no held-back step) by client.
func runEnd(run, client uuid.UUID) *FinishWrite {
	return &FinishWrite{Fence: Fence{RunID: run, Epoch: 1}, Client: client, Status: "COMPLETED", Output: []byte(`"out"`)}
}

func TestEndsOfRunsHoldingTypeSlotsNotifyEachTypeOnceAndClearTheirSlots(t *testing.T) {
	t.Parallel()
	pool, url := testdb.NewPool(t)
	ctx := context.Background()
	listener := listen(t, url)
	// Six runs hold slots of type wf, two of type other, all ended in one statement.
	var ends []*FinishWrite
	for i := range 8 {
		run := runningRun(t, pool, 1, false)
		typ := "wf"
		if i >= 6 {
			typ = "other"
		}
		if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET holds_type_slot = true, workflow_type = $2 WHERE run_id = $1`, run, typ); err != nil {
			t.Fatal(err)
		}
		w := runEnd(run, uuid.New())
		w.HeldSlot = true
		ends = append(ends, w)
	}
	if got := setRows(t, pool, finishes, ends...); len(got) != len(ends) {
		t.Fatalf("%d runs ended, want %d", len(got), len(ends))
	}
	got := map[string]int{}
	for {
		wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		msg, err := listener.WaitForNotification(wctx)
		cancel()
		if err != nil {
			break // none left
		}
		got[msg.Payload[:strings.LastIndexByte(msg.Payload, '|')]]++
	}
	if len(got) != 2 || got[WakeTopic("default", "wf")] != 1 || got[WakeTopic("default", "other")] != 1 {
		t.Fatalf("notifications by topic %v: want one for wf and one for other", got)
	}
	var held int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.runs WHERE holds_type_slot`).Scan(&held); err != nil || held != 0 {
		t.Fatalf("%d ended runs still hold a type slot (%v)", held, err)
	}

	// The end of a slot holder its worker does not report (HeldSlot false) leaves the
	// flag and the trigger's notification.
	run := runningRun(t, pool, 1, false)
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET holds_type_slot = true WHERE run_id = $1`, run); err != nil {
		t.Fatal(err)
	}
	if _, err := FinishRun(ctx, Direct(pool), *runEnd(run, uuid.New())); err != nil {
		t.Fatal(err)
	}
	if topic := wakeTopicOf(t, listener, "the trigger, for an end that did not report its slot"); topic != WakeTopic("default", "wf") {
		t.Fatalf("topic %q, want %q", topic, WakeTopic("default", "wf"))
	}
}
