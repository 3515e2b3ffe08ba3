package notifier_test

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
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

// recorder is a Keeper that records what it was told, and the backend of the
// connections it was opened on.
type recorder struct {
	events chan string
}

func (r *recorder) Open(ctx context.Context, conn *pgx.Conn) error {
	r.events <- "open " + strconv.FormatUint(uint64(conn.PgConn().PID()), 10)
	return nil
}
func (r *recorder) Tick(ctx context.Context, conn *pgx.Conn) error {
	r.events <- "tick " + strconv.FormatUint(uint64(conn.PgConn().PID()), 10)
	return nil
}
func (r *recorder) Close(ctx context.Context, conn *pgx.Conn) { r.events <- "close" }
func (r *recorder) Lost(err error)                            { r.events <- "lost" }

func (r *recorder) next(t *testing.T, want string) string {
	t.Helper()
	select {
	case got := <-r.events:
		if !strings.HasPrefix(got, want) {
			t.Fatalf("keeper told %q, want %q", got, want)
		}
		return strings.TrimPrefix(got, want)
	case <-time.After(10 * time.Second):
		t.Fatalf("keeper not told %q", want)
	}
	return ""
}

func TestKeepersShareTheListenConnectionAndAreToldWhenItIsLostAndBack(t *testing.T) {
	t.Parallel()
	var connects atomic.Int32
	n, sender := newNotifier(t, &connects)
	ctx := context.Background()
	sub := n.Subscribe("d|run")
	defer sub.Close()
	a, b := &recorder{events: make(chan string, 100)}, &recorder{events: make(chan string, 100)}
	releaseA := n.Keep(a, 20*time.Millisecond)
	pid := a.next(t, "open ")
	releaseB := n.Keep(b, time.Hour)
	if got := b.next(t, "open "); got != pid {
		t.Fatalf("the second keeper was opened on backend %s, the first on %s: want one connection", got, pid)
	}
	if got := a.next(t, "tick "); got != pid {
		t.Fatalf("ticked on backend %s, opened on %s", got, pid)
	}
	// Notifications still arrive while keepers tick.
	if _, err := sender.Exec(ctx, `SELECT pg_notify('kagzi', 'd|run|COMPLETED')`); err != nil {
		t.Fatal(err)
	}
	for got := range sub.C {
		if got.Topic == "d|run" {
			break
		}
	}
	// The connection is lost: both keepers hear it, then are opened on the next one.
	if _, err := sender.Exec(ctx, `SELECT pg_terminate_backend($1::int)`, pid); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*recorder{a, b} {
		for got := r.next(t, ""); got != "lost"; got = r.next(t, "") {
			if !strings.HasPrefix(got, "tick ") {
				t.Fatalf("keeper told %q before lost", got)
			}
		}
		if got := r.next(t, "open "); got == pid {
			t.Fatalf("reopened on the terminated backend %s", pid)
		}
	}
	releaseB()
	b.next(t, "close")
	releaseA()
	for got := a.next(t, ""); got != "close"; got = a.next(t, "") {
		if !strings.HasPrefix(got, "tick ") {
			t.Fatalf("keeper told %q before close", got)
		}
	}
	if c := connects.Load(); c != 2 {
		t.Fatalf("%d connections, want 2 (one lost)", c)
	}
}

func TestASubscriberThatFallsBehindIsToldItMissedNotifications(t *testing.T) {
	t.Parallel()
	n, sender := newNotifier(t, new(atomic.Int32))
	ctx := context.Background()
	sub := n.Subscribe("w|t")
	defer sub.Close()
	select {
	case <-sub.C: // "connected: look again"
	case <-time.After(10 * time.Second):
		t.Fatal("no connected signal")
	}
	select {
	case <-sub.Missed:
		t.Fatal("Missed before anything was dropped")
	default:
	}
	// More notifications than C holds, while nobody reads C.
	sent := cap(sub.C) + 10
	if _, err := sender.Exec(ctx, `SELECT pg_notify('kagzi', 'w|t|' || g) FROM generate_series(1, $1) g`, sent); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sub.Missed:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d notifications into a buffer of %d, and Missed never said so", sent, cap(sub.C))
	}
	if got := len(sub.C); got != cap(sub.C) {
		t.Fatalf("C holds %d notifications, want it full (%d): the first ones are kept", got, cap(sub.C))
	}
}

// The listener's wait for each notification, with a keeper registered (every worker
// registers one), leaves nothing behind: it made a context for the wait and a second
// one with the keeper's deadline, and dropped the first without cancelling it, so the
// listener's context kept one child per notification received for as long as it ran
// (found by an outside soak: ~35 MB an hour at 150 starts a second). Not parallel: it
// counts the heap's objects.
func TestTheListenerKeepsNothingPerNotificationWhileAKeeperIsRegistered(t *testing.T) {
	n, sender := newNotifier(t, new(atomic.Int32))
	ctx := context.Background()
	sub := n.Subscribe("d|end")
	defer sub.Close()
	k := &recorder{events: make(chan string, 100)}
	defer n.Keep(k, time.Hour)()
	k.next(t, "open ")
	heapObjects := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapObjects
	}
	send := func(round int) {
		t.Helper()
		if _, err := sender.Exec(ctx, `SELECT pg_notify('kagzi', 'd|other|' || g) FROM generate_series(1, 10000) g`); err != nil {
			t.Fatal(err)
		}
		if _, err := sender.Exec(ctx, `SELECT pg_notify('kagzi', 'd|end|' || $1::text)`, strconv.Itoa(round)); err != nil {
			t.Fatal(err)
		}
		for got := range sub.C {
			if got.Topic == "d|end" && got.Extra == strconv.Itoa(round) {
				return
			}
		}
	}
	send(0) // warm up
	before := heapObjects()
	for round := 1; round <= 2; round++ {
		send(round)
	}
	if grew := int64(heapObjects()) - int64(before); grew > 5000 {
		t.Fatalf("the heap grew by %d objects over 20,000 notifications, want none kept per notification", grew)
	}
}

// Close returns once the listener has ended, its connection closed: a client closed
// before its database goes away (a test's, dropped) leaves nothing behind that would
// try to reconnect.
func TestCloseReturnsOnceTheListenerEndedAndClosedItsConnection(t *testing.T) {
	t.Parallel()
	url := testdb.New(t)
	var conns []*pgx.Conn
	var mu sync.Mutex
	n := notifier.New(func(ctx context.Context) (*pgx.Conn, error) {
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
		}
		return conn, err
	}, "kagzi", slog.New(slog.NewTextHandler(io.Discard, nil)))
	for round := range 2 { // a closed notifier listens again for its next subscriber
		sub := n.Subscribe("d|run")
		select {
		case <-sub.C: // "connected: look again"
		case <-time.After(10 * time.Second):
			t.Fatal("no connected signal")
		}
		n.Close()
		mu.Lock()
		if len(conns) != round+1 || !conns[round].IsClosed() {
			t.Errorf("round %d: Close returned with %d connections made, the last still open", round, len(conns))
		}
		mu.Unlock()
		sub.Close()
	}
}
