package kagzi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/kagzi/kagzi/internal/store"
)

// Error classification, in one place: what a failure records (its ErrorDetail), why
// an execution stopped, and which driver errors are Kagzi's typed errors or worth
// another try.

// dbError turns driver errors Kagzi knows into its own: a missing schema (or one of
// another version, whose functions or columns differ) becomes ErrSchemaNotMigrated, a
// data exception (a value the database cannot hold) ErrInvalidArgument, a closed pool
// ErrClosed, and a database that cannot be reached (see unavailable) an
// *UnavailableError. Others are wrapped as they are.
func dbError(op string, err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42P01", "3F000": // undefined_table, invalid_schema_name
			return fmt.Errorf("%s: %w: %v", op, ErrSchemaNotMigrated, err)
		case "42883", "42703": // undefined_function, undefined_column: another version's schema
			return fmt.Errorf("%s: %w (the database's schema does not match this version of the library: "+
				"migrate it with this version, or run the version that migrated it): %v", op, ErrSchemaNotMigrated, err)
		}
		if strings.HasPrefix(pgErr.Code, "22") {
			// A data exception: a value the database cannot hold (a NUL character in
			// JSON or text, bytes that are not UTF-8, a time past PostgreSQL's range,
			// a number past its column's): the caller's input, refused as a whole.
			return fmt.Errorf("%s: %w: %v", op, ErrInvalidArgument, err)
		}
	}
	if closedPool(err) {
		return fmt.Errorf("%s: %w", op, ErrClosed)
	}
	if ok, mayHaveCommitted := unavailable(err); ok {
		return &UnavailableError{Op: op, MayHaveCommitted: mayHaveCommitted, Err: err}
	}
	return fmt.Errorf("%s: %w", op, err)
}

// unavailable reports whether err is a transient failure to reach the database,
// and if so whether the request may have committed all the same.
//
// Transient: an error the server sent for the connection itself (class 08,
// connection exception; 57P01 admin shutdown, 57P02 crash shutdown, 57P03 cannot
// connect now), or a network error of the driver (refused, reset, EOF, timeout, a
// connection the driver had closed). The request did not commit when the driver
// says it sent nothing (pgconn.SafeToRetry), when the connection was never made,
// or when the server answered with an error (a statement that fails rolls back;
// Kagzi's statements outside a caller's transaction are autocommit), but for one
// that ended the session (57P01, 57P02: it may come after the request's COMMIT).
// After any other network error the connection broke with the request sent: its
// outcome is unknown.
//
// A context that ended is the caller's doing, not the database's: not transient;
// except a connection attempt that timed out (the pool's connect timeout, a DSN's
// connect_timeout: a server that does not answer), which is transient whoever set the
// deadline, and sent nothing. A server that refuses a connection for want of slots
// (53300 too_many_connections) is transient too.
func unavailable(err error) (ok, mayHaveCommitted bool) {
	var connectErr *pgconn.ConnectError
	if err == nil || errors.Is(err, context.Canceled) {
		return false, false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return errors.As(err, &connectErr), false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "08P01":
			// protocol_violation: a request the server will refuse again (PgBouncer in
			// statement mode refuses transaction blocks so); but PgBouncer also reports
			// a server it cannot reach, or has no connection for, with this code.
			return poolerUnavailable(pgErr.Message)
		case pgErr.Code == "57P01", pgErr.Code == "57P02":
			// admin_shutdown (a fast shutdown, pg_terminate_backend), crash_shutdown: the
			// server ends the session whatever it was doing, also after a COMMIT of the
			// request and before its answer (found from outside: a start said it did not
			// commit, and its retry found its run).
			return true, true
		case strings.HasPrefix(pgErr.Code, "08"), pgErr.Code == "57P03", pgErr.Code == "53300":
			return true, false
		}
		return false, false
	}
	if pgconn.SafeToRetry(err) {
		return true, false
	}
	var netErr net.Error
	network := errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
	if !network {
		return false, false
	}
	if errors.As(err, &connectErr) {
		return true, false // no connection, nothing sent
	}
	return true, true
}

// mayHaveCommitted reports whether a statement that failed with err may have
// committed: it was sent, and no answer of the server says it rolled back (a claim
// or an eager start whose runs a worker then hands back: see lostclaims.go).
func mayHaveCommitted(err error) bool {
	var connectErr *pgconn.ConnectError
	if err == nil || pgconn.SafeToRetry(err) || errors.As(err, &connectErr) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		_, may := unavailable(err) // the server's error: rolled back, unless a pooler's word for a lost server
		return may
	}
	return true
}

// poolerUnavailable reports whether a protocol_violation (08P01) with this message is
// PgBouncer's word for a database it cannot reach or has no room for now, and if so
// whether the request may have committed (a server connection that broke or timed out
// under a query that had been sent to it). Other 08P01 errors are not transient.
func poolerUnavailable(msg string) (ok, mayHaveCommitted bool) {
	for _, m := range []string{
		"server_login_retry",       // "server login has been failing, try again later"
		"cannot connect to server", // "pgbouncer cannot connect to server"
		"max_client_conn",          // "no more connections allowed (max_client_conn)"
		"query_wait_timeout",       // waited for a server connection, never ran
		"client_login_timeout",     // "client_login_timeout (server down)"
		"database removed",
		"database configuration changed",
		"pgbouncer shutting down", "server shutting down", "pooler is shut down",
	} {
		if strings.Contains(msg, m) {
			return true, false
		}
	}
	for _, m := range []string{"server conn crashed", "query_timeout", "query timeout", "server closed the connection"} {
		if strings.Contains(msg, m) {
			return true, true
		}
	}
	return false, false
}

// readError is wrapStoreErr for a read: a read that lost its connection wrote
// nothing, whatever the driver could tell of its outcome.
func readError(op string, err error) error {
	err = wrapStoreErr(op, err)
	var u *UnavailableError
	if errors.As(err, &u) {
		u.read, u.MayHaveCommitted = true, false
	}
	return err
}

// writeError is wrapStoreErr for a write to db: in the caller's transaction (a
// pgx.Tx: CancelTx, SignalTx) nothing commits before the caller's own COMMIT, which a
// connection the server ended cannot send, so the write did not commit.
func writeError(op string, db store.DBTX, err error) error {
	err = wrapStoreErr(op, err)
	var u *UnavailableError
	if _, inTx := db.(pgx.Tx); inTx && errors.As(err, &u) {
		u.MayHaveCommitted = false
	}
	return err
}

// wrapStoreErr maps store errors to Kagzi's.
func wrapStoreErr(op string, err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	return dbError(op, err)
}

// failureDetail is the detail to record for an error a workflow function or step body
// returned (code is the default code, subject what failed): errorOf's, with CodePanic
// and the stack for a recovered panic.
func failureDetail(err error, code, subject string) ErrorDetail {
	var pe *panicError
	if errors.As(err, &pe) {
		code = CodePanic
	}
	d := errorOf(err, code, subject)
	if pe != nil {
		d.Metadata = map[string]string{"stack": pe.stack}
	}
	return d
}

// errorOf turns an error returned by a workflow or step into the detail to record:
// an *Error in the chain sets the code, retry-after and metadata; a *StepError (a
// step that failed for good, returned by the workflow) keeps its recorded detail.
func errorOf(err error, code, subject string) ErrorDetail {
	var de *detailError
	if errors.As(err, &de) {
		return de.detail
	}
	var se *StepError
	if errors.As(err, &se) {
		return se.Detail // the step's recorded detail, as it is: code, message, subject
	}
	d := ErrorDetail{Code: code, Message: err.Error(), Subject: subject}
	var ke *Error
	if errors.As(err, &ke) {
		if ke.Code != "" {
			d.Code = ke.Code
		}
		d.RetryAfter, d.Metadata = ke.RetryAfter, ke.Metadata
	}
	if errors.Is(err, ErrNonRetryable) {
		d.NonRetryable = true
	}
	return d
}

// stepDetail is the error detail to record for a failed attempt.
func stepDetail(err error, timedOut bool, key string) ErrorDetail {
	d := failureDetail(err, CodeStepError, key)
	if timedOut {
		d.Code = CodeDeadlineExceeded
	}
	return d
}

// panicError is a recovered panic with its stack.
type panicError struct {
	value any
	stack string
}

func (e *panicError) Error() string { return fmt.Sprintf("panic: %v", e.value) }

// goexited is the failure of a workflow function, branch or step body that called
// runtime.Goexit (testing's FailNow and SkipNow do; so does a durable call made with a
// Context kept after its function returned): a panic, with where it happened.
func goexited(where string) *panicError {
	return &panicError{value: "runtime.Goexit called in " + where + " (testing's FailNow and SkipNow call it)",
		stack: string(debug.Stack())}
}

// reasonFor maps the cause of the run context's cancellation to an exit reason.
func reasonFor(cause error) exitReason {
	switch {
	case errors.Is(cause, errLeaseLost):
		return exitLeaseLost
	case errors.Is(cause, errShutdown):
		return exitShutdown
	case errors.Is(cause, errRunDeadline):
		return exitDeadline
	case errors.Is(cause, errRecoveryExhausted):
		return exitRecoveryExhausted
	default:
		return exitCancelled
	}
}

// closedPool reports whether err is pgxpool's refusal of a closed pool (it has no
// error value of its own).
func closedPool(err error) bool {
	return errors.Is(err, ErrClosed) || strings.Contains(err.Error(), "closed pool")
}

// transient reports whether a failed statement may succeed if tried again: the
// database could not be reached or the connection broke (see unavailable), the
// attempt ran out of time, or the server refused it for a reason that passes
// (connection, rollback such as a serialization failure or deadlock, resources,
// shutdown, system). Anything else, an answer from the database (a step already
// recorded, a row not found) as much as a value it refuses, is as final as the
// statement: tried again it fails again. Judged the other way round (whatever the
// server did not send was transient), a fenced write that found its step already
// recorded, its first try having committed with the connection breaking before the
// answer came, was retried for as long as the heartbeats renewed the run's lease:
// for ever, the run stuck RUNNING on a live worker (found by a crash of PostgreSQL
// under load).
func transient(err error) bool {
	if ok, _ := unavailable(err); ok {
		return true
	}
	var connectErr *pgconn.ConnectError
	if errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) || errors.As(err, &connectErr) {
		return true // the attempt's own time ran out, or no connection was made: nothing final
	}
	if errors.Is(err, context.Canceled) {
		// Not the attempt's (its context is its own, with a deadline): a committer
		// stopped under a batch in flight (an interrupted drain). Tried again, the
		// write goes on its own.
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code[:2] {
	case "08", "40", "53", "57", "58": // connection, rollback, resources, shutdown, system
		return true
	}
	return false
}

// detailError is an error that already knows the ErrorDetail to record for it.
type detailError struct{ detail ErrorDetail }

func (e *detailError) Error() string { return e.detail.String() }

func (e *detailError) Unwrap() error {
	if e.detail.NonRetryable {
		return ErrNonRetryable
	}
	return nil
}
