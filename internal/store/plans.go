package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Plans: the set-based statements reach runs by primary key whatever the tables'
// statistics say, and the claim uses its generic plan.

// KeyedPlansSQL is sent before the set-based statements (the committers' batches
// that hold one, the claim, the load of claimed runs' steps, the heartbeat, the
// hand-back) in the same transaction. They reach runs (and steps) by
// primary key, one lookup per run in their arrays, but a plan made while kagzi.runs
// is small, or before it was first analyzed, would rather scan the table (or every
// active run through runs_one_active_per_workflow_id) and join, and Postgres keeps a
// connection's generic plan until the table is analyzed again: with 20,000 runs in
// the table, such a plan made each claim and each end of 200 runs take 160-300 ms
// instead of 1-3. Without sequential and bitmap scans, and with their status tests
// wrapped in coalesce (status = 'RUNNING' would let the planner scan
// runs_one_active_per_workflow_id whole), the primary key is the only way left;
// TestSetBasedStatementsReachRunsByKeyWhateverTheTablesStatistics checks the plans.
const KeyedPlansSQL = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)`

// genericPlanSQL makes the statement sent after it in the same transaction use its
// generic plan (made once per connection) instead of one planned for its parameters,
// and plan it as KeyedPlansSQL says. It is set_config(..., true), which lasts until
// the transaction ends, as SET LOCAL would; the session's settings are untouched.
const genericPlanSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
	set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)`

// batcher is a DBTX that can pipeline statements (a pool, a connection, a transaction).
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// queryAfter runs setup (transaction-local settings: genericPlanSQL, KeyedPlansSQL)
// and then the query, in one round trip and one transaction (see beginSQL), when db
// can pipeline; otherwise the query alone. Inside the caller's own transaction the
// settings last until that transaction ends.
func queryAfter(ctx context.Context, db DBTX, setup, sql string, args ...any) (pgx.Rows, error) {
	return queryAfterWith(ctx, db, setup, nil, sql, args...)
}

// beginSQL opens the pipelined statements' transaction at READ COMMITTED whatever
// the database's or role's default_transaction_isolation says, and commitSQL ends it
// (a transaction block, not the implicit transaction of a pipeline: SET TRANSACTION
// there works but makes Postgres log a WARNING at every claim). The claim counts a
// limit's holders in a statement that starts after it locked the limit, so that it
// sees every claim that committed before: under REPEATABLE READ its snapshot would be
// the transaction's first, taken before the lock, and two claims could admit past a
// limit together; and a claim's SKIP LOCKED read of a run that another transaction
// updated since that snapshot fails with a serialization error instead of reading the
// run's new version (as would a heartbeat's lease renewal of a run whose end
// committed meanwhile). Inside a caller's transaction, which has its own isolation,
// neither is sent.
const (
	beginSQL  = `BEGIN ISOLATION LEVEL READ COMMITTED`
	commitSQL = `COMMIT`
)

// queryAfterWith is queryAfter with arguments for setup.
func queryAfterWith(ctx context.Context, db DBTX, setup string, setupArgs []any, sql string, args ...any) (pgx.Rows, error) {
	return queryAfterAll(ctx, db, []setupStmt{{setup, setupArgs}}, sql, args...)
}

// setupStmt is a statement queryAfterAll runs before its query.
type setupStmt struct {
	sql  string
	args []any
}

// queryAfterAll is queryAfter with several setup statements, run in order.
func queryAfterAll(ctx context.Context, db DBTX, setups []setupStmt, sql string, args ...any) (pgx.Rows, error) {
	b, ok := db.(batcher)
	if !ok {
		return db.Query(ctx, sql, args...)
	}
	var batch pgx.Batch
	_, inTx := db.(pgx.Tx)
	if !inTx {
		batch.Queue(beginSQL)
	}
	for _, s := range setups {
		batch.Queue(s.sql, s.args...)
	}
	batch.Queue(sql, args...)
	if !inTx {
		batch.Queue(commitSQL) // read by the rows' Close
	}
	before := len(setups) + 1 // the statements before the query: BEGIN and the setups
	if inTx {
		before--
	}
	br := b.SendBatch(ctx, &batch)
	for range before {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return nil, err
		}
	}
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// batchRows closes its batch with its rows.
type batchRows struct {
	pgx.Rows
	br  pgx.BatchResults
	err error // from closing the batch: the commit's, if it failed
}

func (r *batchRows) Close() {
	r.Rows.Close()
	if err := r.br.Close(); err != nil && r.Rows.Err() == nil {
		r.err = err
	}
}

func (r *batchRows) Err() error {
	if r.err != nil {
		return r.err
	}
	return r.Rows.Err()
}
