package notifier_test

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi/internal/notifier"
	"github.com/kagzi/kagzi/internal/testdb"
)

func TestSubscribersShareOneConnectionThatOutlivesThemForALinger(t *testing.T) {
	t.Parallel()
	var connects atomic.Int32
	n, sender := newNotifier(t, &connects)
	ctx := context.Background()

	for i := range 3 { // one subscriber after another, as sequential Waits do
		sub := n.Subscribe("d|run")
		if i == 0 {
			select {
			case <-sub.C: // "connected: look again"
			case <-time.After(10 * time.Second):
				t.Fatal("no connected signal")
			}
		}
		if _, err := sender.Exec(ctx, `SELECT pg_notify('kagzi', 'd|run|COMPLETED')`); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-sub.C:
			if got.Topic != "d|run" || got.Extra != "COMPLETED" {
				t.Fatalf("got %+v", got)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("notification not delivered")
		}
		sub.Close()
	}
	if c := connects.Load(); c != 1 {
		t.Fatalf("%d connections for 3 subscribers in a row, want 1", c)
	}
}

func TestABatchedPayloadReachesTheSubscribersOfEachOfItsLines(t *testing.T) {
	t.Parallel()
	n, sender := newNotifier(t, new(atomic.Int32))
	ctx := context.Background()
	a, b, other := n.Subscribe("d|a"), n.Subscribe("d|b"), n.Subscribe("d|other")
	for _, s := range []*notifier.Subscription{a, b, other} {
		select {
		case <-s.C: // "connected: look again"
		case <-time.After(10 * time.Second):
			t.Fatal("no connected signal")
		}
	}
	if _, err := sender.Exec(ctx, "SELECT pg_notify('kagzi', E'\\nd|a|COMPLETED\\nd|b|FAILED')"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sub   *notifier.Subscription
		topic string
		extra string
	}{{a, "d|a", "COMPLETED"}, {b, "d|b", "FAILED"}} {
		select {
		case got := <-c.sub.C:
			if got.Topic != c.topic || got.Extra != c.extra {
				t.Fatalf("got %+v, want %s|%s", got, c.topic, c.extra)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s not delivered", c.topic)
		}
	}
	select {
	case got := <-other.C:
		t.Fatalf("a subscriber of a topic not in the batch got %+v", got)
	case <-time.After(100 * time.Millisecond):
	}
}

// newNotifier returns a notifier on a database of the test's own, counting its
// connections in connects, and a connection to send notifications with.
func newNotifier(t *testing.T, connects *atomic.Int32) (*notifier.Notifier, *pgx.Conn) {
	t.Helper()
	url := testdb.New(t)
	n := notifier.New(func(ctx context.Context) (*pgx.Conn, error) {
		connects.Add(1)
		return pgx.Connect(ctx, url)
	}, "kagzi", slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(n.Close)
	sender, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sender.Close(context.Background()) })
	return n, sender
}
