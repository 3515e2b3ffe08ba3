// Package notifier shares one direct connection per client among everything that
// waits for Kagzi's notifications (workers waiting for new runs, wake times and
// cancels, callers waiting for a run's result) and everything that keeps session
// state on it (the workers' liveness locks, see Keeper).
//
// The connection is opened when the first subscriber or keeper arrives and closed
// Linger after the last one leaves (or by Close). It is separate from the
// application's pool, so it never takes a pool slot, and it is a real session (not a
// pooler's transaction-pooled one), since LISTEN and session locks need one. When it
// breaks, the notifier reconnects with backoff, tells every subscriber (a
// notification with an empty topic) that notifications may have been missed, so they
// look at the database again, and tells every keeper that its session state is gone.
//
// A notifier without a connect function (New with nil) never connects: Publish
// still reaches this process's subscribers, and Keep is refused.
package notifier

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Notification is one message on the channel: "topic|extra". A payload that starts
// with a newline holds several messages, one per line, so that a statement
// ending many runs sends one notification instead of one per run.
type Notification struct {
	// Topic is empty for the "reconnected, look again" signal.
	Topic string
	Extra string
	// Value is what PublishValue handed over with the notification (nil for one
	// from the database): subscribers share it and must not modify it.
	Value any
}

// Notifier multiplexes one LISTEN connection.
type Notifier struct {
	connect func(context.Context) (*pgx.Conn, error)
	channel string
	logger  *slog.Logger

	// listening is held by the listener goroutine: one that starts while the one
	// before is still telling its keepers of their lost connection waits for it, so
	// that keepers are only ever called by one goroutine at a time.
	listening sync.Mutex

	mu      sync.Mutex
	subs    map[string]map[*Subscription]struct{}
	keepers []*keeping
	count   int                // subscriptions and keepers
	stop    context.CancelFunc // nil: no listener
	lingers *time.Timer        // stops an idle listener
	wake    context.CancelFunc // interrupts the listener's wait for a notification
	dirty   bool               // keepers changed since the listener last looked at them
	// ended is closed when the last listener started has returned (its connection
	// closed, its keepers told); nil: none was started.
	ended chan struct{}
}

// A Keeper keeps session state on the notifier's connection: the liveness lock of a
// worker. Its methods are called on the listener's goroutine, one at a time, with the
// connection (which they must not keep): Open on each connection the keeper meets
// (once it is kept, and after every reconnection), Tick every interval after that,
// Close when it is released while the connection is open, Lost when the connection
// it was opened on is gone (its session state with it). An error from Open or Tick
// means the connection failed: it is closed, and every keeper learns it by Lost.
type Keeper interface {
	Open(ctx context.Context, conn *pgx.Conn) error
	Tick(ctx context.Context, conn *pgx.Conn) error
	Close(ctx context.Context, conn *pgx.Conn)
	Lost(err error)
}

// keeping is a Keeper kept, and the listener's state of it.
type keeping struct {
	k        Keeper
	every    time.Duration
	released bool
	// listener's goroutine only:
	opened bool
	next   time.Time
}

// Linger is how long the LISTEN connection stays open after its last subscriber left,
// so that a caller that waits for one run after another does not reconnect each time.
const Linger = 30 * time.Second

// Subscription receives the notifications of its topics. C is buffered; a subscriber
// that falls behind misses notifications, never blocks the others, and must treat
// any receive as "look at the database".
type Subscription struct {
	C chan Notification
	// Missed receives when a notification was dropped because C was full (one value
	// stands for any number of drops until it is received): whatever the dropped
	// ones announced (a time, a run) is lost, and the subscriber must look at the
	// database for it.
	Missed chan struct{}
	topics []string
	n      *Notifier
	once   sync.Once
}

// New returns a notifier that connects with connect and listens on channel. With a
// nil connect it never connects (see the package documentation).
func New(connect func(context.Context) (*pgx.Conn, error), channel string, logger *slog.Logger) *Notifier {
	return &Notifier{connect: connect, channel: channel, logger: logger,
		subs: map[string]map[*Subscription]struct{}{}}
}

// Subscribe starts receiving the notifications of the topics.
func (n *Notifier) Subscribe(topics ...string) *Subscription {
	s := &Subscription{C: make(chan Notification, 64), Missed: make(chan struct{}, 1), topics: topics, n: n}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, topic := range topics {
		if n.subs[topic] == nil {
			n.subs[topic] = map[*Subscription]struct{}{}
		}
		n.subs[topic][s] = struct{}{}
	}
	n.use()
	return s
}

// Connects reports whether the notifier has a connection to share (New was given a
// connect function).
func (n *Notifier) Connects() bool { return n.connect != nil }

// Keep keeps k on the connection, opening the connection if it is not open, and
// calls k.Tick every interval until release is called. It panics on a notifier that
// never connects.
func (n *Notifier) Keep(k Keeper, every time.Duration) (release func()) {
	if n.connect == nil {
		panic("notifier: Keep on a notifier without a connection")
	}
	e := &keeping{k: k, every: every}
	n.mu.Lock()
	n.keepers = append(n.keepers, e)
	n.use()
	n.interrupt()
	n.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			e.released = true
			n.interrupt()
			n.unuse()
		})
	}
}

// use counts one more user of the connection and starts the listener if none runs.
// n.mu is held.
func (n *Notifier) use() {
	n.count++
	if n.lingers != nil {
		n.lingers.Stop()
		n.lingers = nil
	}
	if n.stop == nil && n.connect != nil {
		ctx, cancel := context.WithCancel(context.Background())
		ended := make(chan struct{})
		n.stop, n.ended = cancel, ended
		go func() {
			defer close(ended)
			n.listen(ctx)
		}()
	}
}

// unuse counts one user less; the last one leaves the listener to linger. n.mu is
// held.
func (n *Notifier) unuse() {
	n.count--
	if n.count == 0 && n.stop != nil {
		n.lingers = time.AfterFunc(Linger, func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			if n.count == 0 && n.stop != nil {
				n.stop()
				n.stop, n.lingers = nil, nil
			}
		})
	}
}

// interrupt wakes the listener from its wait for a notification, so that it looks
// at its keepers. n.mu is held.
func (n *Notifier) interrupt() {
	n.dirty = true
	if n.wake != nil {
		n.wake()
	}
}

// Close stops the subscription.
func (s *Subscription) Close() {
	s.once.Do(func() {
		n := s.n
		n.mu.Lock()
		defer n.mu.Unlock()
		for _, topic := range s.topics {
			delete(n.subs[topic], s)
			if len(n.subs[topic]) == 0 {
				delete(n.subs, topic)
			}
		}
		n.unuse()
	})
}

// Close stops the listener at once, whatever its subscribers, and returns once it
// has returned: its connection is closed and its keepers were told (Lost). A listener
// that stopped lingering is waited for too. A later Subscribe or Keep starts a new
// one. It must not be called from a Keeper's method (the listener's goroutine).
func (n *Notifier) Close() {
	n.mu.Lock()
	if n.lingers != nil {
		n.lingers.Stop()
		n.lingers = nil
	}
	if n.stop != nil {
		n.stop()
		n.stop = nil
	}
	ended := n.ended
	n.mu.Unlock()
	if ended != nil {
		<-ended
	}
}

func (n *Notifier) dispatch(msg Notification, all bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	deliver := func(subs map[*Subscription]struct{}) {
		for s := range subs {
			select {
			case s.C <- msg:
			default:
				select {
				case s.Missed <- struct{}{}:
				default:
				}
			}
		}
	}
	if all {
		seen := map[*Subscription]bool{}
		for _, subs := range n.subs {
			for s := range subs {
				if !seen[s] {
					seen[s] = true
					deliver(map[*Subscription]struct{}{s: {}})
				}
			}
		}
		return
	}
	deliver(n.subs[msg.Topic])
}

// Publish delivers a payload to this process's subscribers of its topic at once,
// without the database: for news that only this process needs to hear from itself.
func (n *Notifier) Publish(payload string) { n.PublishValue(payload, nil) }

// PublishValue is Publish with a value for the subscribers (Notification.Value), for
// news whose details this process has at hand.
func (n *Notifier) PublishValue(payload string, v any) {
	msg := parse(payload)
	msg.Value = v
	n.dispatch(msg, false)
}

// parse splits a payload "topic|extra" at its last '|'.
func parse(payload string) Notification {
	if i := strings.LastIndexByte(payload, '|'); i >= 0 {
		return Notification{Topic: payload[:i], Extra: payload[i+1:]}
	}
	return Notification{Topic: payload}
}

func (n *Notifier) listen(ctx context.Context) {
	n.listening.Lock()
	defer n.listening.Unlock()
	backoff := 100 * time.Millisecond
	first := true
	for ctx.Err() == nil {
		conn, err := n.connect(ctx)
		if err == nil {
			_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{n.channel}.Sanitize())
			if err != nil {
				conn.Close(context.Background())
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			n.logger.Warn("kagzi: cannot listen for notifications; retrying", "error", err, "retry_in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		if !first {
			n.logger.Info("kagzi: notification listener reconnected")
		}
		first = false
		// Whatever was sent before LISTEN took effect is lost: everyone looks again.
		n.dispatch(Notification{}, true)
		err = n.serve(ctx, conn)
		conn.Close(context.Background())
		if ctx.Err() == nil {
			n.logger.Warn("kagzi: notification listener lost its connection", "error", err)
		} else {
			err = context.Cause(ctx)
		}
		n.lost(err)
	}
}

// serve waits for notifications on conn and serves the keepers until conn fails or
// ctx ends.
func (n *Notifier) serve(ctx context.Context, conn *pgx.Conn) error {
	for {
		next, err := n.keep(ctx, conn)
		if err != nil {
			return err
		}
		// One context for the wait, cancelled below: a second one made over a first
		// that was dropped uncancelled stayed among ctx's children, one per
		// notification, for as long as the listener ran.
		var wctx context.Context
		var cancel context.CancelFunc
		if next.IsZero() {
			wctx, cancel = context.WithCancel(ctx)
		} else {
			wctx, cancel = context.WithDeadline(ctx, next)
		}
		n.mu.Lock()
		n.wake = cancel
		if n.dirty { // changed since keep looked: look again at once
			cancel()
		}
		n.mu.Unlock()
		pn, err := conn.WaitForNotification(wctx)
		n.mu.Lock()
		n.wake = nil
		n.mu.Unlock()
		cancel()
		if err != nil {
			// A deadline or an interruption leaves the connection usable (pgconn's
			// context handler sets a read deadline; it sends no cancel request).
			if ctx.Err() == nil && wctx.Err() != nil && !conn.IsClosed() {
				continue
			}
			return err
		}
		if batch, ok := strings.CutPrefix(pn.Payload, "\n"); ok {
			for payload := range strings.SplitSeq(batch, "\n") {
				n.dispatch(parse(payload), false)
			}
			continue
		}
		n.dispatch(parse(pn.Payload), false)
	}
}

// keep opens the keepers new to conn, closes the released ones and ticks those due.
// It returns when the next tick is due (zero: no keeper).
func (n *Notifier) keep(ctx context.Context, conn *pgx.Conn) (time.Time, error) {
	n.mu.Lock()
	keepers := slices.Clone(n.keepers)
	n.dirty = false
	n.mu.Unlock()
	var next time.Time
	for _, e := range keepers {
		n.mu.Lock()
		released := e.released
		n.mu.Unlock()
		switch {
		case released:
			if e.opened {
				e.k.Close(ctx, conn)
				e.opened = false
			}
			n.mu.Lock()
			n.keepers = slices.DeleteFunc(n.keepers, func(k *keeping) bool { return k == e })
			n.mu.Unlock()
			continue
		case !e.opened:
			e.opened = true // Lost is owed from here on, even if Open fails
			if err := e.k.Open(ctx, conn); err != nil {
				return time.Time{}, err
			}
			e.next = time.Now().Add(e.every)
		case !time.Now().Before(e.next):
			if err := e.k.Tick(ctx, conn); err != nil {
				return time.Time{}, err
			}
			e.next = time.Now().Add(e.every)
		}
		if next.IsZero() || e.next.Before(next) {
			next = e.next
		}
	}
	return next, nil
}

// lost tells the keepers opened on a connection that is gone.
func (n *Notifier) lost(err error) {
	n.mu.Lock()
	keepers := slices.Clone(n.keepers)
	n.mu.Unlock()
	for _, e := range keepers {
		n.mu.Lock()
		released := e.released
		n.mu.Unlock()
		if e.opened {
			e.opened = false
			if !released {
				e.k.Lost(err)
			}
		}
	}
}
