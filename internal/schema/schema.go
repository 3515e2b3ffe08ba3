// Package schema applies Kagzi's goose migrations to a database.
package schema

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
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
func Up(ctx context.Context, pool *pgxpool.Pool) error {
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
// A database without the version table (never migrated) is at version 0. Unlike
// goose's provider, Version never creates the table.
func Version(ctx context.Context, pool *pgxpool.Pool) (current, latest int64, err error) {
	if latest, err = Latest(); err != nil {
		return 0, 0, err
	}
	// The table name is unqualified: goose creates it in the connection's current
	// schema and reads it through the search path, as this does.
	err = pool.QueryRow(ctx, `SELECT coalesce(max(version_id), 0) FROM `+
		pgx.Identifier{migrations.VersionTable}.Sanitize()).Scan(&current)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table: never migrated
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
