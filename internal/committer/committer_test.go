package committer_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi/internal/committer"
	"github.com/kagzi/kagzi/internal/testdb"
)

type batchCounter struct{ batches, queries, merged atomic.Int64 }

func (b *batchCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	b.queries.Add(1)
	return ctx
}
func (b *batchCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (b *batchCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	b.batches.Add(1)
	return ctx
}
func (b *batchCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if d.SQL == mergedInsert {
		b.merged.Add(1)
	}
}
func (b *batchCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func setup(t *testing.T) (*committer.Committer, *pgxpool.Pool, *batchCounter) {
	t.Helper()
	t.Parallel()
	url := testdb.New(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	bc := &batchCounter{}
	cfg.ConnConfig.Tracer = bc
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE t (id int PRIMARY KEY, v int CHECK (v >= 0))`); err != nil {
		t.Fatal(err)
	}
	c := committer.New(pool, 64)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx, 2) }()
	t.Cleanup(func() { cancel(); <-done })
	return c, pool, bc
}

func TestConcurrentStatementsShareBatchesAndEachGetsItsOwnResult(t *testing.T) {
	c, pool, bc := setup(t)
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var got int
			err := c.QueryRow(context.Background(), `INSERT INTO t VALUES ($1, $1 * 2) RETURNING v`, i).Scan(&got)
			if err == nil && got != i*2 {
				err = fmt.Errorf("statement %d got %d", i, got)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var rows int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM t`).Scan(&rows); err != nil || rows != n {
		t.Fatalf("%d rows, %v; want %d", rows, err, n)
	}
	if trips := bc.batches.Load() + bc.queries.Load() - 2; trips >= n { // minus the setup and the count
		t.Fatalf("%d round trips for %d concurrent statements: nothing was batched", trips, n)
	}
}

func TestAFailingStatementFailsAloneAndTheOthersCommit(t *testing.T) {
	c, pool, _ := setup(t)
	var wg sync.WaitGroup
	results := make([]error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := i
			if i == 7 {
				v = -1 // violates the check
			}
			var got int
			results[i] = c.QueryRow(context.Background(), `INSERT INTO t VALUES ($1, $2) RETURNING v`, i, v).Scan(&got)
		}()
	}
	wg.Wait()
	for i, err := range results {
		if (i == 7) != (err != nil) {
			t.Fatalf("statement %d: %v", i, err)
		}
	}
	var rows int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM t`).Scan(&rows); err != nil || rows != 19 {
		t.Fatalf("%d rows, %v; want the 19 good ones", rows, err)
	}
}

func TestACallerIsReleasedOnlyAfterItsRowCommitted(t *testing.T) {
	c, pool, _ := setup(t)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var got int
			if err := c.QueryRow(context.Background(), `INSERT INTO t VALUES ($1, 1) RETURNING id`, i).Scan(&got); err != nil {
				t.Error(err)
				return
			}
			var seen bool // another connection must see it already
			if err := pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM t WHERE id = $1)`, i).Scan(&seen); err != nil || !seen {
				t.Errorf("row %d not visible after its Scan returned (%v)", i, err)
			}
		}()
	}
	wg.Wait()
}

func TestNoRowsIsReportedToItsCaller(t *testing.T) {
	c, _, _ := setup(t)
	var got int
	if err := c.QueryRow(context.Background(), `SELECT v FROM t WHERE id = -5`).Scan(&got); err != pgx.ErrNoRows {
		t.Fatalf("got %v, want pgx.ErrNoRows", err)
	}
}

func TestALoneStatementGoesOutOnItsCallersGoroutine(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), testdb.New(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c := committer.New(pool, 8) // never Run: only the direct path can answer
	var one int
	if err := c.QueryRow(context.Background(), `SELECT 1`).Scan(&one); err != nil || one != 1 {
		t.Fatalf("got %d, %v", one, err)
	}
}

// mergedInsert is the statement of inserts: one request or many, each an [id, v].
const mergedInsert = `
	WITH i AS (SELECT * FROM unnest($1::int[], $2::int[]) WITH ORDINALITY AS i(id, v, ord)),
	ins AS (INSERT INTO t SELECT id, v FROM i ON CONFLICT DO NOTHING RETURNING id, v)
	SELECT i.ord, ins.v FROM ins JOIN i ON i.id = ins.id`

var inserts = &committer.Statement{Name: "inserts", Build: func(inputs []any) (string, []any) {
	ids, vs := make([]int, len(inputs)), make([]int, len(inputs))
	for i, in := range inputs {
		ids[i], vs[i] = in.([2]int)[0], in.([2]int)[1]
	}
	return mergedInsert, []any{ids, vs}
}}

// concurrentInserts runs insert for ids 0..n-1 at once, with value 2*id (or bad for
// the id bad), and returns each caller's value and error.
func concurrentInserts(c *committer.Committer, n, bad int) ([]int, []error) {
	got, errs := make([]int, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := i * 2
			if i == bad {
				v = -1 // violates the check
			}
			errs[i] = c.Write(context.Background(), inserts, [2]int{i, v}, &got[i])
		}()
	}
	wg.Wait()
	return got, errs
}

func TestMergedStatementsGiveEachCallerItsOwnRowOrNoRows(t *testing.T) {
	c, pool, bc := setup(t)
	if _, err := pool.Exec(context.Background(), `INSERT INTO t SELECT g, 0 FROM generate_series(0, 199, 10) g`); err != nil {
		t.Fatal(err)
	}
	got, errs := concurrentInserts(c, 200, -1)
	for i := range 200 {
		switch {
		case i%10 == 0 && errs[i] != pgx.ErrNoRows:
			t.Fatalf("id %d was taken: got %d, %v; want pgx.ErrNoRows", i, got[i], errs[i])
		case i%10 != 0 && (errs[i] != nil || got[i] != 2*i):
			t.Fatalf("id %d: got %d, %v; want %d", i, got[i], errs[i], 2*i)
		}
	}
	if bc.merged.Load() == 0 {
		t.Fatal("no merged statement was sent: concurrent inserts went one by one")
	}
	var rows int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM t WHERE v = id * 2 AND v > 0`).Scan(&rows); err != nil || rows != 180 {
		t.Fatalf("%d new rows, %v; want 180", rows, err)
	}
}

func TestAFailingMergedStatementFailsOnlyTheBadRequest(t *testing.T) {
	c, pool, _ := setup(t)
	got, errs := concurrentInserts(c, 100, 42)
	for i := range 100 {
		if (i == 42) != (errs[i] != nil) || (i != 42 && got[i] != 2*i) {
			t.Fatalf("id %d: got %d, %v", i, got[i], errs[i])
		}
	}
	var rows int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM t`).Scan(&rows); err != nil || rows != 99 {
		t.Fatalf("%d rows, %v; want the 99 good ones", rows, err)
	}
}

func TestBatchesRunAtReadCommittedWhateverTheDatabasesDefault(t *testing.T) {
	t.Parallel()
	url := testdb.New(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.Exec(ctx, `DO $$ BEGIN
		EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = ''repeatable read''', current_database());
	END $$`)
	admin.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	bc := &batchCounter{}
	cfg.ConnConfig.Tracer = bc
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c := committer.New(pool, 64)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); c.Run(runCtx, 2) }()
	t.Cleanup(func() { cancel(); <-done })

	const n = 200
	var wg sync.WaitGroup
	var readCommitted, other atomic.Int64
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var iso string
			if err := c.QueryRow(ctx, `SELECT current_setting('transaction_isolation')`).Scan(&iso); err != nil {
				t.Error(err)
				return
			}
			if iso == "read committed" {
				readCommitted.Add(1)
			} else {
				other.Add(1)
			}
		}()
	}
	wg.Wait()
	// A statement sent alone runs at the default; every one sent in a batch at READ
	// COMMITTED.
	alone := bc.queries.Load()
	if bc.batches.Load() == 0 {
		t.Fatal("nothing was batched")
	}
	if readCommitted.Load() != n-alone || other.Load() != alone {
		t.Fatalf("%d statements ran at read committed and %d at the default, with %d sent alone; want every batched one at read committed",
			readCommitted.Load(), other.Load(), alone)
	}
}

// A batch on a server that stopped answering ends with its callers' deadlines: it
// held every caller (an execution waiting for its write while its heartbeat renewed
// its lease) until the driver gave up, minutes later.
func TestABatchToAServerThatDoesNotAnswerEndsAtItsCallersDeadlines(t *testing.T) {
	t.Parallel()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close() // accepted, never answered
		}
	}()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@"+silent.Addr().String()+"/postgres?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c := committer.New(pool, 64)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Run(ctx, 1)
	// Keep the committer busy so that the requests below go out as a batch.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, rcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer rcancel()
			var n int
			errs <- c.QueryRow(rctx, `SELECT $1::int`, i).Scan(&n)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("requests with 300 ms deadlines to a server that does not answer had not returned after a minute")
	}
	close(errs)
	for err := range errs {
		if err == nil {
			t.Fatal("a request to a server that does not answer succeeded")
		}
	}
}

// A locked request's statement runs after its lock, in its transaction, alone or in a
// batch: it waits while another transaction holds the lock, and then sees what that
// transaction committed (its snapshot is taken after the lock). Batches of locked
// requests on the same keys in every order take the locks in one order and never
// deadlock.
func TestALockedRequestSeesWhatTheLocksHolderCommitted(t *testing.T) {
	c, pool, _ := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lock := func(k int) committer.Lock {
		return committer.Lock{Key: fmt.Sprint(k), SQL: `SELECT pg_advisory_xact_lock($1::bigint)`, Args: []any{int64(k)}}
	}
	for _, concurrent := range []int{1, 40} {
		if _, err := pool.Exec(ctx, `TRUNCATE t`); err != nil {
			t.Fatal(err)
		}
		holder, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for k := range 3 {
			if _, err := holder.Exec(ctx, `SELECT pg_advisory_xact_lock($1::bigint)`, int64(k)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := holder.Exec(ctx, `INSERT INTO t VALUES (1, 1)`); err != nil {
			t.Fatal(err)
		}
		counts := make(chan int, concurrent)
		errs := make(chan error, concurrent)
		for i := range concurrent {
			go func() {
				var n int
				// Each request locks one key, in an order that differs from its neighbours'.
				err := c.QueryRowLocked(ctx, lock((i*7)%3), `SELECT count(*) FROM t`).Scan(&n)
				counts <- n
				errs <- err
			}()
		}
		time.Sleep(50 * time.Millisecond) // the requests go out and wait for the locks
		if err := holder.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		for range concurrent {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
			if n := <-counts; n != 1 {
				t.Fatalf("%d concurrent: a locked request saw %d rows, want the lock holder's 1", concurrent, n)
			}
		}
	}
}

// EndIdle ends the senders RunOnDemand started before it returns (a Client's Close,
// so that a closed client holds no goroutine), and later requests start them again.
func TestEndIdleEndsTheOnDemandSendersBeforeItReturnsAndLaterRequestsStartThemAgain(t *testing.T) {
	t.Parallel()
	url := testdb.New(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE t (id int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	c := committer.New(pool, 64)
	c.RunOnDemand(2, time.Hour) // idle senders would outlive the test but for EndIdle
	next := 0
	insertMany := func() {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, 50)
		for range 50 {
			next++
			id := next
			wg.Go(func() {
				errs <- c.QueryRow(context.Background(), `INSERT INTO t VALUES ($1) RETURNING id`, id).Scan(new(int))
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	for round := range 3 {
		for c.Senders() == 0 { // concurrent requests: some go through senders
			insertMany()
		}
		c.EndIdle()
		if n := c.Senders(); n != 0 {
			t.Fatalf("round %d: %d senders after EndIdle, want none", round, n)
		}
	}
	c.EndIdle() // none to end
}
