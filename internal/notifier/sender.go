package notifier

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Sender sends notifications outside the transactions that caused them, coalesced:
// every payload queued while a send is in flight goes out in the next single
// statement, duplicates once. Transactions that notify serialise their commits on a
// server-wide lock; a committed start that leaves its notification to a Sender
// commits without it, and many starts share one notifying statement.
//
// A notification is a hint: one lost (the process dies after the commit) delays the
// run until a worker's next look at the database, nothing more.
type Sender struct {
	pool    *pgxpool.Pool
	channel string
	logger  *slog.Logger

	mu      sync.Mutex
	pending map[string]struct{}
	sending bool
}

// NewSender returns a sender on pool for the channel.
func NewSender(pool *pgxpool.Pool, channel string, logger *slog.Logger) *Sender {
	return &Sender{pool: pool, channel: channel, logger: logger, pending: map[string]struct{}{}}
}

// Send queues a payload and returns at once.
func (s *Sender) Send(payload string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending[payload] = struct{}{}
	if !s.sending {
		s.sending = true
		go s.flush()
	}
}

// flush sends what is pending, one statement at a time, until nothing is.
func (s *Sender) flush() {
	for {
		s.mu.Lock()
		if len(s.pending) == 0 {
			s.sending = false
			s.mu.Unlock()
			return
		}
		payloads := make([]string, 0, len(s.pending))
		for p := range s.pending {
			payloads = append(payloads, p)
		}
		s.pending = map[string]struct{}{}
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := s.pool.Exec(ctx, `SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p`, s.channel, payloads)
		cancel()
		if err != nil {
			s.logger.Warn("kagzi: cannot notify workers; they will find the runs at their next look", "error", err)
		}
	}
}
