// Package schema applies Kagzi's goose migrations to a database.
package schema

import (
	"context"
	"fmt"

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
func Version(ctx context.Context, pool *pgxpool.Pool) (current, latest int64, err error) {
	p, closeDB, err := provider(pool)
	if err != nil {
		return 0, 0, err
	}
	defer closeDB()
	if current, err = p.GetDBVersion(ctx); err != nil {
		return 0, 0, err
	}
	sources := p.ListSources()
	if len(sources) > 0 {
		latest = sources[len(sources)-1].Version
	}
	return current, latest, nil
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
