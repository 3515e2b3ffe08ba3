// Package testdb gives each test a database of its own on a real PostgreSQL server,
// cloned from a template that holds Kagzi's migrated schema, so tests run in
// parallel without seeing each other's rows.
//
// The server is the one DATABASE_URL (or KAGZI_DATABASE_URL) names, else the one on
// 127.0.0.1:5432 as user postgres. scripts/test finds or starts one and sets
// DATABASE_URL; a test run that finds none fails with a message saying how to get one.
package testdb

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi/internal/schema"
	"github.com/kagzi/kagzi/migrations"
)

// DefaultURL is the server tests use when no environment variable names one.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// ServerURL returns the URL of the server tests run against.
func ServerURL() string {
	for _, v := range []string{"KAGZI_DATABASE_URL", "DATABASE_URL"} {
		if u := os.Getenv(v); u != "" {
			return u
		}
	}
	return DefaultURL
}

// WithDatabase returns the server URL pointed at another database.
func WithDatabase(serverURL, name string) string {
	if u, err := url.Parse(serverURL); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		return u.String()
	}
	return serverURL + " dbname=" + name
}

var (
	templateOnce sync.Once
	templateName string
	templateErr  error
)

// New creates an empty, migrated database for the test, dropped when the test ends,
// and returns its URL.
func New(t testing.TB) string {
	t.Helper()
	dbURL, drop, err := Create(context.Background())
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(drop)
	return dbURL
}

// Create creates an empty, migrated database and returns its URL and a function
// that drops it.
func Create(ctx context.Context) (dbURL string, drop func(), err error) {
	templateOnce.Do(func() { templateName, templateErr = ensureTemplate(ctx) })
	if templateErr != nil {
		return "", nil, templateErr
	}
	admin, err := connect(ctx)
	if err != nil {
		return "", nil, err
	}
	defer admin.Close(ctx)
	name := "kagzi_test_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:16]
	// Concurrent clones of one template can collide on its lock: try again.
	for range 50 {
		_, err = admin.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+templateName)
		if err == nil || !strings.Contains(err.Error(), "being accessed by other users") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return "", nil, fmt.Errorf("create database: %w", err)
	}
	return WithDatabase(ServerURL(), name), func() { dropDatabase(name) }, nil
}

func dropDatabase(name string) {
	ctx := context.Background()
	admin, err := connect(ctx)
	if err != nil {
		return
	}
	defer admin.Close(ctx)
	_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
}

// NewPool is New with a pool on the database, closed when the test ends.
func NewPool(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	dbURL := New(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool, dbURL
}

// NewEmpty creates a database without Kagzi's schema, for tests of what happens
// before migration.
func NewEmpty(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	admin, err := connect(ctx)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	defer admin.Close(ctx)
	name := "kagzi_test_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:16]
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("testdb: create database: %v", err)
	}
	t.Cleanup(func() { dropDatabase(name) })
	return WithDatabase(ServerURL(), name)
}

func connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, ServerURL())
	if err != nil {
		return nil, fmt.Errorf("no PostgreSQL at %s: %w\n"+
			"Run the tests with scripts/test (it finds or starts a server), or set DATABASE_URL",
			redact(ServerURL()), err)
	}
	return conn, nil
}

// ensureTemplate builds the template database for the current migrations once per
// server: its name carries a hash of the migration files and of where goose's version
// table lives, so a change to either builds a new template.
func ensureTemplate(ctx context.Context) (string, error) {
	h := sha256.New()
	h.Write([]byte(migrations.VersionTable + "\n"))
	err := fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.FS, path)
		h.Write([]byte(path))
		h.Write(b)
		return err
	})
	if err != nil {
		return "", err
	}
	name := "kagzi_template_" + hex.EncodeToString(h.Sum(nil))[:12]

	admin, err := connect(ctx)
	if err != nil {
		return "", err
	}
	defer admin.Close(ctx)
	// One builder at a time across test processes.
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock(7461001)"); err != nil {
		return "", err
	}
	defer admin.Exec(ctx, "SELECT pg_advisory_unlock(7461001)") //nolint:errcheck
	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}
	building := name + "_building"
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+building+" WITH (FORCE)"); err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+building); err != nil {
		return "", err
	}
	pool, err := pgxpool.New(ctx, WithDatabase(ServerURL(), building))
	if err != nil {
		return "", err
	}
	err = schema.Up(ctx, pool)
	pool.Close()
	if err != nil {
		return "", fmt.Errorf("migrate template: %w", err)
	}
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+building+" RENAME TO "+name); err != nil {
		return "", err
	}
	return name, nil
}

func redact(u string) string {
	if p, err := url.Parse(u); err == nil && p.User != nil {
		if _, has := p.User.Password(); has {
			p.User = url.UserPassword(p.User.Username(), "xxx")
		}
		return p.String()
	}
	return u
}
