package kagzi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// safeToRetryError is what pgconn returns for a request it never sent.
type safeToRetryError struct{}

func (safeToRetryError) Error() string     { return "write failed before anything was sent" }
func (safeToRetryError) SafeToRetry() bool { return true }

// These tests need no database: the errors are built by hand (the refused
// connection dials a port nothing listens on).

func TestUnavailableClassifiesConnectionFailuresAndWhetherTheRequestMayHaveCommitted(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, refused := pgconn.Connect(context.Background(), "postgres://postgres@"+addr+"/postgres?sslmode=disable&connect_timeout=5")
	var connectErr *pgconn.ConnectError
	if !errors.As(refused, &connectErr) {
		t.Fatalf("connecting to a closed port: %T %v, want a *pgconn.ConnectError", refused, refused)
	}
	// A server that accepts the connection and never answers: the DSN's connect_timeout.
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
			defer c.Close()
		}
	}()
	_, timedOut := pgconn.Connect(context.Background(), "postgres://postgres@"+silent.Addr().String()+"/postgres?sslmode=disable&connect_timeout=1")
	if !errors.Is(timedOut, context.DeadlineExceeded) {
		t.Fatalf("connecting to a server that never answers: %v, want the connect timeout", timedOut)
	}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	for _, c := range []struct {
		name             string
		err              error
		unavailable      bool
		mayHaveCommitted bool
	}{
		{"admin shutdown 57P01", &pgconn.PgError{Severity: "FATAL", Code: "57P01"}, true, true},
		{"crash shutdown 57P02", &pgconn.PgError{Severity: "FATAL", Code: "57P02"}, true, true},
		{"cannot connect now 57P03", &pgconn.PgError{Severity: "FATAL", Code: "57P03"}, true, false},
		{"connection failure 08006", &pgconn.PgError{Severity: "FATAL", Code: "08006"}, true, false},
		{"protocol violation 08P01 (PgBouncer in statement mode)", &pgconn.PgError{Severity: "ERROR", Code: "08P01",
			Message: "transaction blocks not allowed in statement pooling mode"}, false, false},
		{"PgBouncer: server login failing 08P01", &pgconn.PgError{Severity: "FATAL", Code: "08P01",
			Message: "server login has been failing, try again later (server_login_retry)"}, true, false},
		{"PgBouncer: cannot connect to server 08P01", &pgconn.PgError{Severity: "ERROR", Code: "08P01",
			Message: "pgbouncer cannot connect to server"}, true, false},
		{"PgBouncer: max_client_conn 08P01", &pgconn.PgError{Severity: "FATAL", Code: "08P01",
			Message: "no more connections allowed (max_client_conn)"}, true, false},
		{"PgBouncer: query_wait_timeout 08P01", &pgconn.PgError{Severity: "ERROR", Code: "08P01",
			Message: "query_wait_timeout"}, true, false},
		{"PgBouncer: server conn crashed 08P01", &pgconn.PgError{Severity: "FATAL", Code: "08P01",
			Message: "server conn crashed?"}, true, true},
		{"wrapped 57P01", fmt.Errorf("insert: %w", &pgconn.PgError{Code: "57P01"}), true, true},
		{"unique violation 23505", &pgconn.PgError{Code: "23505"}, false, false},
		{"query canceled 57014", &pgconn.PgError{Code: "57014"}, false, false},
		{"safe to retry", fmt.Errorf("send: %w", safeToRetryError{}), true, false},
		{"conn closed by the driver", fmt.Errorf("query: %w", pgconn.ErrConnClosed), true, true},
		{"connection refused", refused, true, false},
		{"connect timeout of a server that does not answer", timedOut, true, false},
		{"too many connections 53300", &pgconn.PgError{Severity: "FATAL", Code: "53300"}, true, false},
		{"connection reset after sending", reset, true, true},
		{"unexpected EOF after sending", fmt.Errorf("receive message: %w", io.ErrUnexpectedEOF), true, true},
		{"EOF after sending", io.EOF, true, true},
		{"broken pipe", &net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE}, true, true},
		{"context deadline", context.DeadlineExceeded, false, false},
		{"context canceled", fmt.Errorf("query: %w", context.Canceled), false, false},
		{"other error", errors.New("cannot scan into *int"), false, false},
	} {
		ok, may := unavailable(c.err)
		if ok != c.unavailable || may != c.mayHaveCommitted {
			t.Errorf("%s (%v): unavailable %v, may have committed %v; want %v, %v",
				c.name, c.err, ok, may, c.unavailable, c.mayHaveCommitted)
		}
		err := dbError("kagzi: op", c.err)
		var u *UnavailableError
		if errors.Is(err, ErrUnavailable) != c.unavailable || errors.As(err, &u) != c.unavailable {
			t.Errorf("%s: dbError = %v, want errors.Is ErrUnavailable and errors.As *UnavailableError = %v", c.name, err, c.unavailable)
			continue
		}
		if !errors.Is(err, c.err) {
			t.Errorf("%s: dbError = %v no longer wraps the driver's error", c.name, err)
		}
		if u != nil && u.MayHaveCommitted != c.mayHaveCommitted {
			t.Errorf("%s: MayHaveCommitted = %v, want %v", c.name, u.MayHaveCommitted, c.mayHaveCommitted)
		}
	}
}

func TestDbErrorKeepsSchemaAndClosedPoolErrorsOutOfUnavailable(t *testing.T) {
	for _, c := range []struct {
		err  error
		want error
	}{
		{&pgconn.PgError{Code: "42P01"}, ErrSchemaNotMigrated},
		{&pgconn.PgError{Code: "3F000"}, ErrSchemaNotMigrated},
		{&pgconn.PgError{Code: "42883"}, ErrSchemaNotMigrated}, // another version's functions
		{&pgconn.PgError{Code: "42703"}, ErrSchemaNotMigrated}, // another version's columns
		{errors.New("closed pool"), ErrClosed},
	} {
		err := dbError("kagzi: op", c.err)
		if !errors.Is(err, c.want) || errors.Is(err, ErrUnavailable) {
			t.Errorf("dbError(%v) = %v, want %v and not ErrUnavailable", c.err, err, c.want)
		}
	}
}

func TestUnavailableErrorSaysWhetherTheStartMayHaveCommitted(t *testing.T) {
	cause := io.ErrUnexpectedEOF
	for _, c := range []struct {
		e    UnavailableError
		want string
	}{
		{UnavailableError{Op: "kagzi: start x", MayHaveCommitted: true, Err: cause, start: true},
			"the start may have committed; starting again with the same WithID is safe and returns the run if it did"},
		{UnavailableError{Op: "kagzi: start x", Err: cause, start: true}, "the start did not commit"},
		{UnavailableError{Op: "kagzi: list runs", MayHaveCommitted: true, Err: cause}, "the request may have committed"},
		{UnavailableError{Op: "kagzi: list runs", Err: cause}, "the request did not commit"},
	} {
		msg := c.e.Error()
		if !strings.Contains(msg, c.want) || !strings.HasPrefix(msg, c.e.Op) || !strings.HasSuffix(msg, cause.Error()) {
			t.Errorf("Error() = %q; want the op, %q and the cause", msg, c.want)
		}
	}
}
