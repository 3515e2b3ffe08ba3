// Package committer shares commits between runs: single-row statements that many
// executions issue at once (step records, run completions, sleeps) are sent together
// as one pipelined batch that commits once, and each caller is released only after
// that commit, so its row is as durable as if it had committed alone.
//
// A Committer is a store.DBTX whose QueryRow is batched; Exec and Query go straight
// to the pool. Batches form on their own (group commit): while a batch is in flight
// the next requests queue, and the next batch takes them all, so a lone request
// costs one round trip, as before (it is sent at once on its caller's goroutine when
// nothing else is in flight), and many concurrent ones share round trips and fsyncs.
package committer

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Committer batches QueryRow statements. The zero value is not usable; see New.
type Committer struct {
	pool     *pgxpool.Pool
	reqs     chan *request
	maxBatch int
	// inFlight counts the statements and batches being sent. A statement that finds
	// none goes out at once on its caller's goroutine: nothing to share a commit
	// with, so no hand-off to pay for.
	inFlight atomic.Int32
}

type request struct {
	ctx  context.Context
	sql  string
	args []any
	dest []any
	done chan error
}

// New returns a committer over pool whose batches hold at most maxBatch statements.
// Call Run to start it.
func New(pool *pgxpool.Pool, maxBatch int) *Committer {
	return &Committer{pool: pool, reqs: make(chan *request), maxBatch: maxBatch}
}

// Run sends batches until ctx is done, with up to senders batches in flight at once.
// A request made after that waits for its own context to end.
func (c *Committer) Run(ctx context.Context, senders int) {
	done := make(chan struct{})
	for range senders {
		go func() {
			defer func() { done <- struct{}{} }()
			c.send(ctx)
		}()
	}
	for range senders {
		<-done
	}
}

func (c *Committer) send(ctx context.Context) {
	batch := make([]*request, 0, c.maxBatch)
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			return
		case r := <-c.reqs:
			batch = append(batch, r)
		}
	collect:
		for len(batch) < c.maxBatch {
			select {
			case r := <-c.reqs:
				batch = append(batch, r)
			default:
				break collect
			}
		}
		c.commit(ctx, batch)
	}
}

// commit runs the batch in one implicit transaction and releases its callers after
// the commit. When a statement fails, the transaction rolled everything back: each
// request then runs again on its own, so only the failing one sees its error.
func (c *Committer) commit(ctx context.Context, batch []*request) {
	c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	if len(batch) == 1 {
		r := batch[0]
		r.done <- c.pool.QueryRow(r.ctx, r.sql, r.args...).Scan(r.dest...)
		return
	}
	var b pgx.Batch
	for _, r := range batch {
		b.Queue(r.sql, r.args...)
	}
	errs := make([]error, len(batch))
	br := c.pool.SendBatch(ctx, &b)
	failed := false
	for i, r := range batch {
		errs[i] = br.QueryRow().Scan(r.dest...)
		if errs[i] != nil && !errors.Is(errs[i], pgx.ErrNoRows) {
			failed = true
		}
	}
	if err := br.Close(); err != nil {
		failed = true
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			// The connection broke: nothing is known to have committed; every caller
			// retries as it would on its own.
			for _, r := range batch {
				r.done <- err
			}
			return
		}
	}
	if failed {
		for _, r := range batch {
			r.done <- c.pool.QueryRow(r.ctx, r.sql, r.args...).Scan(r.dest...)
		}
		return
	}
	for i, r := range batch {
		r.done <- errs[i]
	}
}

// QueryRow queues the statement; its Scan waits until the batch that carries it has
// committed.
func (c *Committer) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return &row{c: c, ctx: ctx, sql: sql, args: args}
}

// Exec runs on the pool, unbatched.
func (c *Committer) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return c.pool.Exec(ctx, sql, args...)
}

// Query runs on the pool, unbatched.
func (c *Committer) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return c.pool.Query(ctx, sql, args...)
}

type row struct {
	c    *Committer
	ctx  context.Context
	sql  string
	args []any
}

func (r *row) Scan(dest ...any) error {
	if r.c.inFlight.CompareAndSwap(0, 1) {
		defer r.c.inFlight.Add(-1)
		return r.c.pool.QueryRow(r.ctx, r.sql, r.args...).Scan(dest...)
	}
	req := &request{ctx: r.ctx, sql: r.sql, args: r.args, dest: dest, done: make(chan error, 1)}
	select {
	case r.c.reqs <- req:
	case <-r.ctx.Done():
		return r.ctx.Err()
	}
	return <-req.done
}
