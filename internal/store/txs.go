package store

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Transactions of more than one statement. Such a transaction holds its locks between
// its statements, and a process stopped there (SIGSTOP, a paused VM, a debugger, a
// stop-the-world pause gone wrong) keeps its connection, and so its transaction and
// its locks: a schedule row its scheduler claimed stays locked, and every other
// process's scheduler passes it over (SKIP LOCKED) for as long as the stop lasts; a
// run that a continue-as-new was ending cannot be taken over. PostgreSQL ends a
// session that stays idle inside its transaction for longer than its
// idle_in_transaction_session_timeout, rolling the transaction back and releasing its
// locks; the library's transactions set it for themselves (SET LOCAL, in the BEGIN's
// own round trip), so a stopped process holds them up for that long at most.

// TxIdleLimit bounds how long a transaction of the library's may stay idle between
// two of its statements (its process stopped) before PostgreSQL ends its session,
// where no lease gives a bound of its own (history maintenance, administration).
const TxIdleLimit = 10 * time.Second

// InTx runs fn in a READ COMMITTED transaction of db (whatever the database's
// default_transaction_isolation: the library's statements are written for it) that
// PostgreSQL ends, with its session, once it has been idle between two statements for
// longer than idle (under a millisecond: no limit). A db that cannot begin one with
// options (a transaction: fn then runs in a savepoint) begins a plain one: the outer
// transaction is its owner's.
func InTx(ctx context.Context, db Beginner, idle time.Duration, fn func(pgx.Tx) error) error {
	b, ok := db.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	})
	if !ok {
		return pgx.BeginFunc(ctx, db, fn)
	}
	if idle.Milliseconds() <= 0 {
		return pgx.BeginTxFunc(ctx, b, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, fn)
	}
	return pgx.BeginTxFunc(ctx, b, pgx.TxOptions{BeginQuery: "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL idle_in_transaction_session_timeout = " +
		strconv.FormatInt(idle.Milliseconds(), 10)}, fn)
}
