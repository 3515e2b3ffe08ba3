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
// A Statement goes further: its requests in one batch (see Write) become a single
// set-based statement (one array per parameter), so Postgres plans, starts and
// checks constraints once for all of them. A Statement is a Go value, not SQL text:
// the store builds the statement for one request and for many from one definition.
//
// A committer whose callers need not wait for their rows right away (see
// GatherWhenBusy) can also hold a batch back while it is busy, so that fewer, larger
// batches carry the same requests.
package committer

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
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
	// gather, gatherMin and loaded: see GatherWhenBusy. holdUntil (Unix
	// nanoseconds) is when the batch being gathered goes: until then no statement
	// goes out on its own.
	gather    time.Duration
	gatherMin int
	loaded    func() bool
	holdUntil atomic.Int64
	// setup: see SetupMergedBatches.
	setup string
	// The senders of RunOnDemand: how many to keep while requests come (want), how
	// many run, how long one waits for a request before it ends (idle), and how many
	// callers are about to queue a request (pending; a sender does not end while one
	// is). Guarded by mu.
	mu      sync.Mutex
	want    int
	running int
	pending int
	idle    time.Duration
	// demand is the senders of RunOnDemand started since the last EndIdle (nil:
	// none yet). Guarded by mu.
	demand *demand
}

// demand is a generation of RunOnDemand's senders, which EndIdle ends.
type demand struct {
	quit chan struct{} // closed by EndIdle
	wg   sync.WaitGroup
}

// SetupMergedBatches makes every batch that holds a merged statement run sql first,
// in the same implicit transaction (for transaction-local settings made with
// set_config(..., true), say). A failing sql fails its batch like any statement
// (each request then runs alone). Call it before Run.
func (c *Committer) SetupMergedBatches(sql string) {
	c.setup = sql
}

// A Statement writes the inputs of one or more requests at once. Build gets the
// inputs (each what a caller passed to Write) and returns the SQL and arguments of
// one statement that writes them all. That statement returns, for each input that
// has a result, one row: the input's 1-based index, then the columns its caller
// scans. An input without a row gets pgx.ErrNoRows, as QueryRow would.
type Statement struct {
	Name  string
	Build func(inputs []any) (sql string, args []any)
}

// A Lock is a statement that takes a transaction-level lock (pg_advisory_xact_lock,
// say) for a request of QueryRowLocked: it runs in the request's transaction before
// any statement of the batch, so that the request's statement, which takes its
// snapshot when it begins, sees every transaction that held the lock before. Key
// names the lock: a batch takes its requests' locks once each, in the order of their
// keys, so that two batches never wait for each other's locks in opposite orders.
type Lock struct {
	Key  string
	SQL  string
	Args []any
}

// request is a Write (stmt set) or a plain QueryRow (sql set).
type request struct {
	ctx   context.Context
	stmt  *Statement
	input any
	sql   string
	args  []any
	lock  *Lock // QueryRowLocked's
	dest  []any
	done  chan error
}

// alone runs the request on its own, outside any batch.
func (r *request) alone(db *pgxpool.Pool) error {
	if r.lock != nil {
		var b pgx.Batch
		b.Queue(beginSQL)
		b.Queue(r.lock.SQL, r.lock.Args...)
		b.Queue(r.sql, r.args...)
		b.Queue(commitSQL)
		br := db.SendBatch(r.ctx, &b)
		_, err := br.Exec()
		if err == nil {
			_, err = br.Exec()
		}
		if err == nil {
			err = br.QueryRow().Scan(r.dest...)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err
	}
	if r.stmt == nil {
		return db.QueryRow(r.ctx, r.sql, r.args...).Scan(r.dest...)
	}
	sql, args := r.stmt.Build([]any{r.input})
	return ReadOne(db.QueryRow(r.ctx, sql, args...), r.dest)
}

// ReadOne scans the row a Statement returned for a single input into dest (the
// leading index skipped).
//
// pgx plans each column's scan for each result (each row, through pgx.ScanRow), and
// a plan for a target it cannot decode into directly (an int, a named string type, a
// pointer to a pointer) allocates wrappers: a Statement's index is a bigint, so it
// scans into an int64, and the writers' destinations are types pgx decodes into
// directly (int32, int64, string, pgtype's nullable values).
func ReadOne(row pgx.Row, dest []any) error {
	var ord int64
	return row.Scan(append([]any{&ord}, dest...)...)
}

// New returns a committer over pool whose batches hold at most maxBatch requests.
// Call Run to start it.
func New(pool *pgxpool.Pool, maxBatch int) *Committer {
	return &Committer{pool: pool, reqs: make(chan *request), maxBatch: maxBatch}
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
			c.send(ctx, nil)
		}()
	}
	for range senders {
		<-done
	}
}

// RunOnDemand makes the committer start up to senders senders when requests come,
// each of which ends after idle without one (Run's senders run until its context
// ends). A committer that nothing uses holds no goroutine, so that a value that owns
// one (a Client) can be dropped and collected. Call it instead of Run.
func (c *Committer) RunOnDemand(senders int, idle time.Duration) {
	c.mu.Lock()
	c.want, c.idle = senders, idle
	c.mu.Unlock()
}

// arrive starts the senders RunOnDemand asks for before a request is queued, and
// counts the request pending until leave, so that no sender ends meanwhile.
func (c *Committer) arrive() {
	c.mu.Lock()
	c.pending++
	for c.running < c.want {
		c.running++
		if c.demand == nil {
			c.demand = &demand{quit: make(chan struct{})}
		}
		d := c.demand
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			c.send(context.Background(), d.quit)
		}()
	}
	c.mu.Unlock()
}

// EndIdle ends the senders of RunOnDemand, each as soon as no request is about to be
// queued (at once when none is under way), and returns when they have ended, or after
// endIdleWait while requests keep them busy (they end once the requests stop). A
// request that comes later starts senders again.
func (c *Committer) EndIdle() {
	c.mu.Lock()
	d := c.demand
	c.demand = nil
	c.mu.Unlock()
	if d == nil {
		return
	}
	close(d.quit)
	ended := make(chan struct{})
	go func() {
		d.wg.Wait()
		close(ended)
	}()
	// Senders still busy with requests that keep coming end once these stop; the
	// caller is not held for them longer than endIdleWait.
	t := time.NewTimer(endIdleWait)
	defer t.Stop()
	select {
	case <-ended:
	case <-t.C:
	}
}

// endIdleWait bounds how long EndIdle waits for senders busy with requests.
const endIdleWait = time.Second

func (c *Committer) leave() {
	c.mu.Lock()
	c.pending--
	c.mu.Unlock()
}

// idleEnd reports whether an idle sender of RunOnDemand ends: none is about to queue
// a request (one that is started the senders it needs when it arrived).
func (c *Committer) idleEnd() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending > 0 {
		return false
	}
	c.running--
	return true
}

// send sends batches until ctx is done or, for a sender of RunOnDemand, until it is
// idle, or quit is closed (EndIdle) and no request is about to be queued.
func (c *Committer) send(ctx context.Context, quit <-chan struct{}) {
	batch := make([]*request, 0, c.maxBatch)
	var last time.Time // when this sender's last batch went
	hold := false      // whether the next batch waits until gather after it
	var idle <-chan time.Time
	if c.idle > 0 {
		t := time.NewTicker(c.idle)
		defer t.Stop()
		idle = t.C
	}
	busy := false     // whether a request came since the last tick
	quitting := false // quit was closed: end as soon as no request is about to come
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			return
		case <-idle:
			if !busy && c.idleEnd() {
				return
			}
			busy = false
			continue
		case <-quit:
			if c.idleEnd() {
				return
			}
			// A request is about to be queued: take it first, and end after the
			// batch that carries it if no other is under way (not selecting quit
			// again, which stays closed: the loop would spin until the request came).
			quit, quitting = nil, true
			continue
		case r := <-c.reqs:
			batch = append(batch, r)
			busy = true
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
		if quitting && c.idleEnd() {
			return
		}
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

// commit runs the batch in one transaction block and releases its callers after
// the commit. When a statement fails, the transaction rolled everything back: each
// request then runs again on its own, so only the failing one sees its error.
func (c *Committer) commit(ctx context.Context, batch []*request) {
	c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	if len(batch) == 1 {
		r := batch[0]
		r.done <- r.alone(c.pool)
		return
	}
	units := c.plan(batch)
	var b pgx.Batch
	// The callers' statements share a transaction, and each was written for one of its
	// own at READ COMMITTED: under a stricter default_transaction_isolation they
	// would share one snapshot, and a conflict of any of them with a transaction
	// outside would fail them all. (A transaction block: SET TRANSACTION in a
	// pipeline's implicit transaction works, but makes Postgres log a WARNING.)
	b.Queue(beginSQL)
	locks := batchLocks(batch)
	for _, l := range locks {
		b.Queue(l.SQL, l.Args...)
	}
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
	b.Queue(commitSQL) // read by Close: its error is the commit's
	errs := make([]error, len(batch))
	ctx, cancel := batchContext(ctx, batch)
	defer cancel()
	br := c.pool.SendBatch(ctx, &b)
	_, err := br.Exec()
	failed := err != nil
	for range locks {
		if _, err := br.Exec(); err != nil {
			failed = true
		}
	}
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
			r.done <- r.alone(c.pool)
		}
		return
	}
	for i, r := range batch {
		r.done <- errs[i]
	}
}

// batchLocks returns the locks of the batch's requests, once each, in the order of
// their keys.
func batchLocks(batch []*request) []*Lock {
	var locks []*Lock
	for _, r := range batch {
		if r.lock != nil {
			locks = append(locks, r.lock)
		}
	}
	if len(locks) < 2 {
		return locks
	}
	slices.SortFunc(locks, func(a, b *Lock) int { return strings.Compare(a.Key, b.Key) })
	return slices.CompactFunc(locks, func(a, b *Lock) bool { return a.Key == b.Key })
}

// batchContext bounds a batch by its requests' deadlines: it ends at the latest of
// them (none when a request has none), so that a batch on a connection that stopped
// answering (a server crashed mid-request, a connect that hangs) fails when no caller
// waits for it any more, instead of holding every caller, and the sender, until the
// driver gives up: an execution waits for its write while its heartbeat renews its
// lease, so a batch that hung held its runs for as long.
func batchContext(ctx context.Context, batch []*request) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, r := range batch {
		d, ok := r.ctx.Deadline()
		if !ok {
			return ctx, func() {}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(ctx, latest)
}

// beginSQL and commitSQL enclose a batch's statements (see commit).
const (
	beginSQL  = `BEGIN ISOLATION LEVEL READ COMMITTED`
	commitSQL = `COMMIT`
)

// unit is one statement of a batch: a plain request's own, or the statement of all
// the requests of one Statement (reqs[j] is at index idx[j] of the batch).
type unit struct {
	sql    string
	args   []any
	stmt   *Statement
	reqs   []*request
	idx    []int
	merged bool // a Statement's for more than one request
}

// plan turns a batch into its statements: the requests of one Statement become one
// statement, in the place of the first of them; plain requests stay as they are.
func (c *Committer) plan(batch []*request) []unit {
	units := make([]unit, 0, len(batch))
	at := map[*Statement]int{} // a Statement -> its unit
	for i, r := range batch {
		if r.stmt != nil {
			if u, ok := at[r.stmt]; ok {
				units[u].reqs = append(units[u].reqs, r)
				units[u].idx = append(units[u].idx, i)
				continue
			}
			at[r.stmt] = len(units)
		}
		units = append(units, unit{sql: r.sql, args: r.args, stmt: r.stmt, reqs: []*request{r}, idx: []int{i}})
	}
	for i := range units {
		u := &units[i]
		if u.stmt == nil {
			continue
		}
		inputs := make([]any, len(u.reqs))
		for j, r := range u.reqs {
			inputs[j] = r.input
		}
		u.sql, u.args = u.stmt.Build(inputs)
		u.merged = len(u.reqs) > 1
	}
	return units
}

// read reads the unit's result into its requests' destinations and errs, and
// returns an error when the statement itself failed (not merely found no row).
func (u *unit) read(br pgx.BatchResults, errs []error) error {
	if u.stmt == nil {
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
	typeMap := rows.Conn().TypeMap()
	// The requests of a unit are of one statement, so their destinations are of the
	// same types: each column's scan is planned once per result, as pgx's Rows.Scan
	// does, not once per row (pgx.ScanRow plans every call).
	var plans []pgtype.ScanPlan
	var planned []reflect.Type
	for rows.Next() {
		values := rows.RawValues()
		var ord int64
		if err := typeMap.Scan(fields[0].DataTypeOID, fields[0].Format, values[0], &ord); err != nil {
			return err
		}
		if ord < 1 || ord > int64(len(u.reqs)) {
			return fmt.Errorf("committer: merged statement returned index %d of %d", ord, len(u.reqs))
		}
		i := u.idx[ord-1]
		dest := u.reqs[ord-1].dest
		if len(dest) != len(fields)-1 {
			return fmt.Errorf("committer: %d destinations for %d columns", len(dest), len(fields)-1)
		}
		if plans == nil {
			plans, planned = make([]pgtype.ScanPlan, len(dest)), make([]reflect.Type, len(dest))
		}
		for j, d := range dest {
			if d == nil {
				continue
			}
			f := fields[j+1]
			if t := reflect.TypeOf(d); plans[j] == nil || planned[j] != t {
				plans[j], planned[j] = typeMap.PlanScan(f.DataTypeOID, f.Format, d), t
			}
			if err := plans[j].Scan(values[j+1], d); err != nil {
				errs[i] = pgx.ScanArgError{ColumnIndex: j + 1, FieldName: f.Name, Err: err}
				return errs[i]
			}
		}
		errs[i] = nil
	}
	rows.Close()
	return rows.Err()
}

// QueryRow queues the statement; its Scan waits until the batch that carries it has
// committed.
func (c *Committer) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return &row{c: c, ctx: ctx, sql: sql, args: args}
}

// QueryRowLocked is QueryRow whose statement runs after lock, in the same transaction
// (see Lock). Alone, it costs a transaction block of its own, in the same round trip.
func (c *Committer) QueryRowLocked(ctx context.Context, lock Lock, sql string, args ...any) pgx.Row {
	return &row{c: c, ctx: ctx, sql: sql, args: args, lock: &lock}
}

// Write queues an input of the statement s and waits until the batch that carries
// it has committed, then scans the input's row into dest (pgx.ErrNoRows: none).
func (c *Committer) Write(ctx context.Context, s *Statement, input any, dest ...any) error {
	return c.do(&request{ctx: ctx, stmt: s, input: input, dest: dest})
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
	lock *Lock
}

func (r *row) Scan(dest ...any) error {
	return r.c.do(&request{ctx: r.ctx, sql: r.sql, args: r.args, lock: r.lock, dest: dest})
}

// do sends the request: at once on the caller's goroutine when nothing is in flight
// (nothing to share a commit with), else in the next batch.
func (c *Committer) do(req *request) error {
	if c.inFlight.Load() == 0 && c.released() && c.inFlight.CompareAndSwap(0, 1) {
		defer c.inFlight.Add(-1)
		return req.alone(c.pool)
	}
	req.done = make(chan error, 1)
	if c.idle > 0 {
		c.arrive()
	}
	var err error
	select {
	case c.reqs <- req:
	case <-req.ctx.Done():
		err = req.ctx.Err()
	}
	if c.idle > 0 {
		c.leave()
	}
	if err != nil {
		return err
	}
	return <-req.done
}

// Senders returns how many senders of RunOnDemand run.
func (c *Committer) Senders() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.running
}
