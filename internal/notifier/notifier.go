// Package notifier shares one LISTEN connection per process among everything that
// waits for Kagzi's notifications: workers waiting for new runs, wake times and
// cancels, and callers waiting for a run's result.
//
// The connection is opened when the first subscriber arrives and closed Linger
// after the last one leaves (or by Close). It is separate from the application's pool, so it never takes a
// pool slot. When it breaks, the notifier reconnects with backoff and tells every
// subscriber (a notification with an empty topic) that notifications may have been
// missed, so they look at the database again.
package notifier

import (
	"context"
	"log/slog"
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
}

// Notifier multiplexes one LISTEN connection.
type Notifier struct {
	connect func(context.Context) (*pgx.Conn, error)
	channel string
	logger  *slog.Logger

	mu      sync.Mutex
	subs    map[string]map[*Subscription]struct{}
	count   int
	stop    context.CancelFunc // nil: no listener
	lingers *time.Timer        // stops an idle listener
}

// Linger is how long the LISTEN connection stays open after its last subscriber left,
// so that a caller that waits for one run after another does not reconnect each time.
const Linger = 30 * time.Second

// Subscription receives the notifications of its topics. C is buffered; a subscriber
// that falls behind misses notifications, never blocks the others, and must treat
// any receive as "look at the database".
type Subscription struct {
	C      chan Notification
	topics []string
	n      *Notifier
	once   sync.Once
}

// New returns a notifier that connects with connect and listens on channel.
func New(connect func(context.Context) (*pgx.Conn, error), channel string, logger *slog.Logger) *Notifier {
	return &Notifier{connect: connect, channel: channel, logger: logger,
		subs: map[string]map[*Subscription]struct{}{}}
}

// Subscribe starts receiving the notifications of the topics.
func (n *Notifier) Subscribe(topics ...string) *Subscription {
	s := &Subscription{C: make(chan Notification, 64), topics: topics, n: n}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, topic := range topics {
		if n.subs[topic] == nil {
			n.subs[topic] = map[*Subscription]struct{}{}
		}
		n.subs[topic][s] = struct{}{}
	}
	n.count++
	if n.lingers != nil {
		n.lingers.Stop()
		n.lingers = nil
	}
	if n.stop == nil {
		ctx, cancel := context.WithCancel(context.Background())
		n.stop = cancel
		go n.listen(ctx)
	}
	return s
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
	})
}

// Close stops the listener at once, whatever its subscribers.
func (n *Notifier) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lingers != nil {
		n.lingers.Stop()
		n.lingers = nil
	}
	if n.stop != nil {
		n.stop()
		n.stop = nil
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
func (n *Notifier) Publish(payload string) {
	n.dispatch(parse(payload), false)
}

// parse splits a payload "topic|extra" at its last '|'.
func parse(payload string) Notification {
	if i := strings.LastIndexByte(payload, '|'); i >= 0 {
		return Notification{Topic: payload[:i], Extra: payload[i+1:]}
	}
	return Notification{Topic: payload}
}

func (n *Notifier) listen(ctx context.Context) {
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
		for {
			pn, err := conn.WaitForNotification(ctx)
			if err != nil {
				conn.Close(context.Background())
				if ctx.Err() == nil {
					n.logger.Warn("kagzi: notification listener lost its connection", "error", err)
				}
				break
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
}
