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
//
// A statement registered with a Merge goes further: the requests of that statement
// in one batch become a single set-based statement (one array per parameter), so
// Postgres plans, starts and checks constraints once for all of them.
//
// A committer whose callers need not wait for their rows right away (see
// GatherWhenBusy) can also hold a batch back while it is busy, so that fewer, larger
// batches carry the same requests.
package committer

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Committer batches QueryRow statements. The zero value is not usable; see New.
type Committer struct {
	pool     *pgxpool.Pool
	reqs     chan *request
	maxBatch int
	// inFlight counts the statements and batches being sent (and a batch being
	// gathered). A statement that finds none, and no batch held back, goes out at
	// once on its caller's goroutine: nothing to share a commit with, so no
	// hand-off to pay for.
	inFlight atomic.Int32
	merges   map[string]Merge
	// gather, gatherMin and loaded: see GatherWhenBusy. holdUntil (Unix
	// nanoseconds) is when the batch being gathered goes: until then no statement
	// goes out on its own.
	gather    time.Duration
	gatherMin int
	loaded    func() bool
	holdUntil atomic.Int64
	// setup: see SetupMergedBatches.
	setup string
}

// SetupMergedBatches makes every batch that holds a merged statement run sql first,
// in the same implicit transaction (for transaction-local settings made with
// set_config(..., true), say). A failing sql fails its batch like any statement
// (each request then runs alone). Call it before Run.
func (c *Committer) SetupMergedBatches(sql string) {
	c.setup = sql
}

// Merge turns the arguments of k ≥ 2 requests of one statement (args[i] are the
// i-th request's) into one set-based statement and its arguments. That statement
// returns, for each request that has a result, one row: the request's 1-based index
// among the k, then the columns the original statement returns. A request without a
// row gets pgx.ErrNoRows, as QueryRow would.
type Merge func(args [][]any) (sql string, merged []any)

type request struct {
	ctx  context.Context
	sql  string
	args []any
	dest []any
	done chan error
}

// New returns a committer over pool whose batches hold at most maxBatch statements;
// merges (which may be nil) maps statements to their set-based form. Call Run to
// start it.
func New(pool *pgxpool.Pool, maxBatch int, merges map[string]Merge) *Committer {
	return &Committer{pool: pool, reqs: make(chan *request), maxBatch: maxBatch, merges: merges}
}

// GatherWhenBusy makes the committer wait for company while it is busy: after it
// sent a batch of at least min requests while loaded (nil: always) reported true,
// its next batch goes no sooner than d after that one (or once maxBatch requests
// are queued), and meanwhile no request goes out on its own. Each statement and
// commit has a fixed cost in the database, so fewer, larger batches cost less per
// request; the price is up to d of added latency per request, and only while
// requests keep coming at least min to a batch: after a smaller batch the next goes
// at once. Call it before Run.
func (c *Committer) GatherWhenBusy(d time.Duration, min int, loaded func() bool) {
	c.gather, c.gatherMin, c.loaded = d, min, loaded
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
	var last time.Time // when this sender's last batch went
	hold := false      // whether the next batch waits until gather after it
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			return
		case r := <-c.reqs:
			batch = append(batch, r)
		}
		if hold {
			if wait := time.Until(last.Add(c.gather)); wait > 0 {
				batch = c.gatherFor(ctx, wait, batch)
			}
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
		last = time.Now()
		hold = c.gather > 0 && len(batch) >= c.gatherMin && (c.loaded == nil || c.loaded())
		if hold {
			c.holdUntil.Store(last.Add(c.gather).UnixNano())
		}
		c.commit(ctx, batch)
	}
}

// released tells whether no batch is being held back (see GatherWhenBusy).
func (c *Committer) released() bool {
	h := c.holdUntil.Load()
	return h == 0 || time.Now().UnixNano() >= h
}

// gatherFor adds requests to the batch for d, until it is full or until ctx is done.
// It counts as in flight meanwhile, so that requests queue rather than go out on
// their own.
func (c *Committer) gatherFor(ctx context.Context, d time.Duration, batch []*request) []*request {
	c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	t := time.NewTimer(d)
	defer t.Stop()
	for len(batch) < c.maxBatch {
		select {
		case r := <-c.reqs:
			batch = append(batch, r)
		case <-t.C:
			return batch
		case <-ctx.Done():
			return batch
		}
	}
	return batch
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
	units := c.plan(batch)
	var b pgx.Batch
	setup := false
	if c.setup != "" {
		for _, u := range units {
			setup = setup || u.merged
		}
		if setup {
			b.Queue(c.setup)
		}
	}
	for _, u := range units {
		b.Queue(u.sql, u.args...)
	}
	errs := make([]error, len(batch))
	br := c.pool.SendBatch(ctx, &b)
	failed := false
	if setup {
		if _, err := br.Exec(); err != nil {
			failed = true
		}
	}
	for _, u := range units {
		if err := u.read(br, errs); err != nil {
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

// unit is one statement of a batch: a request's own, or the merged statement of
// several requests (reqs[j] is at index idx[j] of the batch).
type unit struct {
	sql    string
	args   []any
	reqs   []*request
	idx    []int
	merged bool
}

// plan turns a batch into its statements: the requests of a statement that has a
// Merge and appears more than once become one merged statement, in the place of the
// first of them; the others stay as they are.
func (c *Committer) plan(batch []*request) []unit {
	units := make([]unit, 0, len(batch))
	at := map[string]int{} // sql of a mergeable statement -> its unit
	for i, r := range batch {
		if _, ok := c.merges[r.sql]; ok {
			if u, ok := at[r.sql]; ok {
				units[u].reqs = append(units[u].reqs, r)
				units[u].idx = append(units[u].idx, i)
				continue
			}
			at[r.sql] = len(units)
		}
		units = append(units, unit{sql: r.sql, args: r.args, reqs: []*request{r}, idx: []int{i}})
	}
	for i := range units {
		u := &units[i]
		if len(u.reqs) < 2 {
			continue
		}
		args := make([][]any, len(u.reqs))
		for j, r := range u.reqs {
			args[j] = r.args
		}
		u.sql, u.args = c.merges[u.sql](args)
		u.merged = true
	}
	return units
}

// read reads the unit's result into its requests' destinations and errs, and
// returns an error when the statement itself failed (not merely found no row).
func (u *unit) read(br pgx.BatchResults, errs []error) error {
	if !u.merged {
		i := u.idx[0]
		errs[i] = br.QueryRow().Scan(u.reqs[0].dest...)
		if errs[i] != nil && !errors.Is(errs[i], pgx.ErrNoRows) {
			return errs[i]
		}
		return nil
	}
	for _, i := range u.idx {
		errs[i] = pgx.ErrNoRows
	}
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	fields := rows.FieldDescriptions()
	for rows.Next() {
		var ord int
		values := rows.RawValues()
		typeMap := rows.Conn().TypeMap()
		if err := pgx.ScanRow(typeMap, fields[:1], values[:1], &ord); err != nil {
			return err
		}
		if ord < 1 || ord > len(u.reqs) {
			return fmt.Errorf("committer: merged statement returned index %d of %d", ord, len(u.reqs))
		}
		i := u.idx[ord-1]
		errs[i] = pgx.ScanRow(typeMap, fields[1:], values[1:], u.reqs[ord-1].dest...)
		if errs[i] != nil {
			return errs[i]
		}
	}
	rows.Close()
	return rows.Err()
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
	if r.c.inFlight.Load() == 0 && r.c.released() && r.c.inFlight.CompareAndSwap(0, 1) {
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
