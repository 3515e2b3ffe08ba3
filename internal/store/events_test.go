package store

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi/internal/notifier"
	"github.com/kagzi/kagzi/internal/testdb"
)

// Found from outside: the notification of an event carried its key last, and the
// listener splits a notification at its last '|': a key holding one (names may)
// made the topic another than EventTopic, and WaitEvent learnt of the event only at
// its next look, up to 5 s later. Every key's event now notifies EventTopic.
func TestAnEventNotifiesItsRunsTopicWhateverItsKey(t *testing.T) {
	t.Parallel()
	pool, url := testdb.NewPool(t)
	ctx := context.Background()
	n := notifier.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, url) },
		Channel, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(n.Close)
	// Once a notification of the test's own is heard, the listener's LISTEN is in place.
	ready := n.Subscribe("x|ready")
	for heard := false; !heard; {
		if _, err := pool.Exec(ctx, `SELECT pg_notify($1, 'x|ready|')`, Channel); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ready.C:
			heard = true
		case <-time.After(100 * time.Millisecond):
		}
	}
	ready.Close()
	for _, key := range []string{"plain", "a|b", "|", "ends|"} {
		run := runningRun(t, pool, 1, false)
		sub := n.Subscribe(EventTopic(run))
		if err := SetEvent(ctx, pool, EventWrite{Fence: Fence{RunID: run, Epoch: 1}, StepKey: "e#1", Key: key,
			Position: 1, Value: []byte(`1`)}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-sub.C:
		case <-time.After(10 * time.Second):
			t.Errorf("the event %q of run %s never notified its topic %s", key, run, EventTopic(run))
		}
		sub.Close()
	}
}
