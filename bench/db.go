package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// serverURL is the PostgreSQL server the benchmark creates its databases on.
func serverURL() string {
	for _, k := range []string{"KAGZI_DATABASE_URL", "DATABASE_URL"} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// counter counts the database round trips of every pool it is the tracer of: each
// query or exec (BEGIN and COMMIT included), each pipelined batch and each COPY
// counts one. Statement preparation on a connection's first use of a statement is
// not counted. With stats set, it also keeps the count and time of each statement.
type counter struct {
	n     atomic.Int64
	stats *sqlStats
}

func (c *counter) load() int64 {
	if c == nil {
		return 0
	}
	return c.n.Load()
}

type traceKey struct{}

type traceStart struct {
	sql string
	at  time.Time
}

func (c *counter) start(ctx context.Context, sql string) context.Context {
	c.n.Add(1)
	if c.stats == nil {
		return ctx
	}
	return context.WithValue(ctx, traceKey{}, traceStart{sql: sql, at: time.Now()})
}

func (c *counter) end(ctx context.Context) {
	if c.stats == nil {
		return
	}
	if s, ok := ctx.Value(traceKey{}).(traceStart); ok {
		c.stats.add(s.sql, time.Since(s.at))
	}
}

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return c.start(ctx, d.SQL)
}
func (c *counter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	c.end(ctx)
}
func (c *counter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	sql := "BATCH"
	if d.Batch != nil {
		var parts []string
		for _, q := range d.Batch.QueuedQueries {
			parts = append(parts, shortSQL(q.SQL))
		}
		sql = "BATCH[" + strings.Join(parts, " ; ") + "]"
	}
	return c.start(ctx, sql)
}
func (c *counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *counter) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	c.end(ctx)
}
func (c *counter) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceCopyFromStartData) context.Context {
	return c.start(ctx, "COPY "+d.TableName.Sanitize())
}
func (c *counter) TraceCopyFromEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromEndData) {
	c.end(ctx)
}

// sqlStats keeps the count and total time of statements, by their first words.
type sqlStats struct {
	mu sync.Mutex
	m  map[string]*sqlStat
}

type sqlStat struct {
	n     int64
	total time.Duration
}

func (s *sqlStats) add(sql string, d time.Duration) {
	k := shortSQL(sql)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]*sqlStat{}
	}
	st := s.m[k]
	if st == nil {
		st = &sqlStat{}
		s.m[k] = st
	}
	st.n++
	st.total += d
}

// shortSQL is a statement with its whitespace folded, cut to 90 characters.
func shortSQL(sql string) string {
	s := strings.Join(strings.Fields(sql), " ")
	if len(s) > 90 {
		s = s[:90] + "…"
	}
	return s
}

// print writes the statements, most total time first.
func (s *sqlStats) print(w io.Writer, title string, top int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	type row struct {
		k string
		v *sqlStat
	}
	var rows []row
	for k, v := range s.m {
		rows = append(rows, row{k, v})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].v.total > rows[j].v.total })
	fmt.Fprintf(w, "statements of %s, most total time first (count, mean ms, total s):\n", title)
	for i, r := range rows {
		if i == top {
			break
		}
		fmt.Fprintf(w, "  %9d %8.3f %8.2f  %s\n", r.v.n, float64(r.v.total)/float64(r.v.n)/1e6, r.v.total.Seconds(), r.k)
	}
}

// database is one database created for one system variant and dropped at the end.
type database struct {
	name string
	cfg  *pgxpool.Config // a template: connects to this database
}

// createDatabase creates kagzi_bench_<label>_<random> on the server.
func createDatabase(ctx context.Context, label string) (*database, error) {
	cfg, err := pgxpool.ParseConfig(serverURL())
	if err != nil {
		return nil, fmt.Errorf("parse server URL: %w", err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "kagzi_bench_" + label + "_" + hex.EncodeToString(b[:])
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", cfg.ConnConfig.Host, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create database %s: %w", name, err)
	}
	dbCfg := cfg.Copy()
	dbCfg.ConnConfig.Database = name
	return &database{name: name, cfg: dbCfg}, nil
}

// drop drops the database, closing any connection left on it.
func (d *database) drop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(serverURL())
	if err != nil {
		return err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{d.name}.Sanitize()+" WITH (FORCE)")
	return err
}

// pool opens a pool of at most maxConns connections on the database, traced by c
// when c is not nil.
func (d *database) pool(ctx context.Context, maxConns int32, c *counter) (*pgxpool.Pool, error) {
	cfg := d.cfg.Copy()
	cfg.MaxConns = maxConns
	if c != nil {
		cfg.ConnConfig.Tracer = c
	} else {
		cfg.ConnConfig.Tracer = nil
	}
	if ms := os.Getenv("KAGZI_BENCH_EXPLAIN_MS"); ms != "" && c != nil {
		// Print the plans of the statements (nested ones too) slower than ms.
		cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
			fmt.Fprintf(os.Stderr, "%s\n", n.Message)
		}
		cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			for _, sql := range []string{"LOAD 'auto_explain'", "SET auto_explain.log_min_duration = " + ms,
				"SET auto_explain.log_nested_statements = on", "SET auto_explain.log_analyze = on",
				"SET client_min_messages = log"} {
				if _, err := conn.Exec(ctx, sql); err != nil {
					return err
				}
			}
			return nil
		}
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// waitUntil polls query (untraced) every interval until it returns 0 or the deadline
// passes, and returns whether it reached 0. query tells whether any unfinished run is
// left (0 or 1): it stops at the first one, so a poll costs the same whatever the
// backlog (counting the whole backlog every 10 ms loaded the database under test
// with the observer's own scans).
func waitUntil(ctx context.Context, obs *pgxpool.Pool, interval time.Duration, deadline time.Time, query string, args ...any) (bool, error) {
	for {
		var left int64
		if err := obs.QueryRow(ctx, query, args...).Scan(&left); err != nil {
			return false, err
		}
		if left == 0 {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(interval):
		}
	}
}

// count runs a query that returns one integer.
func count(ctx context.Context, obs *pgxpool.Pool, query string, args ...any) (int64, error) {
	var n int64
	err := obs.QueryRow(ctx, query, args...).Scan(&n)
	return n, err
}

// walMark returns the server's current WAL position and the database's oid.
func walMark(ctx context.Context, obs *pgxpool.Pool) (string, uint32) {
	var lsn string
	var oid uint32
	if err := obs.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text, oid FROM pg_database WHERE datname = current_database()`).Scan(&lsn, &oid); err != nil {
		return "?", 0
	}
	return lsn, oid
}
