package store

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi/internal/testdb"
)

func TestInTxLimitsItsOwnTransactionsIdleTimeAndLeavesTheSessionsAlone(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	show := func(db DBTX) string {
		var v string
		if err := db.QueryRow(ctx, `SHOW idle_in_transaction_session_timeout`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := show(conn)
	err = InTx(ctx, conn.Conn(), 1500*time.Millisecond, func(tx pgx.Tx) error {
		if got := show(tx); got != "1500ms" {
			t.Errorf("inside the transaction: %s, want 1500ms", got)
		}
		// Begun inside a transaction, it is a savepoint of it: the outer one keeps its
		// own limit.
		return InTx(ctx, tx, time.Minute, func(sp pgx.Tx) error {
			if got := show(sp); got != "1500ms" {
				t.Errorf("inside the savepoint: %s, want the transaction's 1500ms", got)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if after := show(conn); after != before {
		t.Fatalf("after the transaction the session's limit is %s, want %s as before", after, before)
	}
	// No limit below a millisecond: the session's own setting holds.
	if err := InTx(ctx, conn.Conn(), 0, func(tx pgx.Tx) error {
		if got := show(tx); got != before {
			t.Errorf("with no limit: %s, want the session's %s", got, before)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// A transaction that stays idle past its limit is ended with its session.
	err = InTx(ctx, pool, 200*time.Millisecond, func(tx pgx.Tx) error {
		time.Sleep(time.Second)
		_, err := tx.Exec(ctx, `SELECT 1`)
		return err
	})
	if err == nil {
		t.Fatal("a transaction idle for 1 s under a 200 ms limit went on")
	}
}
