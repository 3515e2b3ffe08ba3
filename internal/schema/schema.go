// Package schema applies Kagzi's goose migrations to a database.
package schema

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/kagzi/kagzi/migrations"
)

// Up applies every pending migration. Concurrent callers are serialised by a
// Postgres advisory lock held for the duration.
//
// It first creates the kagzi schema if it is missing: goose creates its version table,
// which lives in that schema, before it runs any migration.
func Up(ctx context.Context, pool *pgxpool.Pool) error {
	if err := ensureSchema(ctx, pool); err != nil {
		return err
	}
	p, closeDB, err := provider(pool)
	if err != nil {
		return err
	}
	defer closeDB()
	_, err = p.Up(ctx)
	return err
}

// Version returns the applied schema version and the newest one this build knows.
//
// It takes no lock, so it answers at once even while a migration runs (or another
// process holds goose's migration lock): the applied version is read with a plain
// SELECT from goose's version table, as goose itself reads it (the highest
// version_id), and the newest one from the names of the embedded migration files.
// A database without the version table or without the kagzi schema (never migrated)
// is at version 0. Unlike goose's provider, Version never creates either.
func Version(ctx context.Context, pool *pgxpool.Pool) (current, latest int64, err error) {
	if latest, err = Latest(); err != nil {
		return 0, 0, err
	}
	err = pool.QueryRow(ctx, `SELECT coalesce(max(version_id), 0) FROM `+versionTable()).Scan(&current)
	var pgErr *pgconn.PgError
	// undefined_table (the schema or the table is missing), invalid_schema_name: never migrated.
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") {
		return 0, latest, nil
	}
	if err != nil {
		return 0, latest, err
	}
	return current, latest, nil
}

// Latest returns the newest schema version this build knows: the highest version
// among the embedded migration files (goose's NNNNN_name.sql).
func Latest() (int64, error) {
	return latestOnce()
}

var latestOnce = sync.OnceValues(func() (int64, error) {
	files, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		return 0, err
	}
	var latest int64
	for _, f := range files {
		v, err := goose.NumericComponent(f)
		if err != nil {
			return 0, fmt.Errorf("migration %s: %w", f, err)
		}
		latest = max(latest, v)
	}
	return latest, nil
})

// versionTable returns migrations.VersionTable quoted for SQL.
func versionTable() string {
	schemaName, table, _ := strings.Cut(migrations.VersionTable, ".")
	return pgx.Identifier{schemaName, table}.Sanitize()
}

// ensureSchema creates the kagzi schema unless it exists. It looks first, so a role
// without the CREATE privilege on the database can still migrate a database whose
// schema an administrator created. Another process may create it at the same moment:
// its duplicate is no error.
func ensureSchema(ctx context.Context, pool *pgxpool.Pool) error {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`,
		migrations.Schema).Scan(&exists); err != nil {
		return fmt.Errorf("look for schema %s: %w", migrations.Schema, err)
	}
	if exists {
		return nil
	}
	_, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{migrations.Schema}.Sanitize())
	var pgErr *pgconn.PgError
	// duplicate_schema, or unique_violation on pg_namespace: a concurrent CREATE won.
	if errors.As(err, &pgErr) && (pgErr.Code == "42P06" || pgErr.Code == "23505") {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create schema %s: %w", migrations.Schema, err)
	}
	return nil
}

func provider(pool *pgxpool.Pool) (*goose.Provider, func(), error) {
	db := stdlib.OpenDBFromPool(pool)
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("migration lock: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithTableName(migrations.VersionTable), goose.WithSessionLocker(locker))
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return p, func() { db.Close() }, nil
}
