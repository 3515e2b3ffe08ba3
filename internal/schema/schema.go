// Package schema applies Kagzi's migrations (the goose SQL files of package migrations)
// to a database. It does what goose's provider would, with pgx alone, so that the core
// module does not depend on goose: the same statements, the same version table
// (migrations.VersionTable, goose's columns and rows) and the same advisory lock. A
// database migrated here looks migrated to the goose CLI, and the other way round;
// internal/gooseinterop checks that against goose itself.
package schema

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi/migrations"
)

// LockID is the key of the advisory lock held while migrating: goose's
// lock.DefaultLockID, the key of goose's Postgres session locker, so that Kagzi and a
// goose provider using that locker never migrate at the same time. Kagzi takes it
// transaction-level (pg_advisory_xact_lock), which conflicts with goose's
// session-level one on the same key.
const LockID int64 = 4097083626

// Up applies every pending migration, each in a transaction of its own with its version
// row (or, for a file marked NO TRANSACTION, statement by statement). Each
// transaction first takes the advisory lock LockID transaction-level, then reads
// which migrations are applied, so concurrent callers (and goose's session locker)
// apply each migration once, in order; a caller waits for the lock as long as ctx
// allows. No session state is left behind, so Up works through a pooler in
// transaction mode (PgBouncer's pool_mode=transaction), except for a NO TRANSACTION
// file (none of Kagzi's is), which needs the lock session-level on one connection.
//
// It first creates the kagzi schema if it is missing, since the version table lives in
// it, then the version table if it is missing, with goose's version 0 row.
func Up(ctx context.Context, pool *pgxpool.Pool) error {
	return up(ctx, pool, migrations.FS)
}

// migration is one goose SQL file.
type migration struct {
	version int64
	name    string
}

// parsed is a migration file's statements.
type parsed struct {
	stmts []string
	useTx bool
}

// up applies the migrations of fsys (tests pass their own).
func up(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS) (err error) {
	files, err := collect(fsys)
	if err != nil {
		return err
	}
	if err := ensureSchema(ctx, pool); err != nil {
		return err
	}
	vt, found, err := resolveVersionTable(ctx, pool)
	if err != nil {
		return err
	}
	if !found {
		if err := ensureVersionTable(ctx, pool); err != nil {
			return err
		}
	}
	pending, err := pendingMigrations(ctx, pool, vt, files)
	if err != nil {
		return err
	}
	// Parse every file to apply before applying any, as goose does.
	apply := make(map[int64]parsed, len(pending))
	for _, m := range pending {
		p, err := parseFile(fsys, m)
		if err != nil {
			return err
		}
		apply[m.version] = p
	}
	for wait := lockRetry; ; {
		done, err := applyNext(ctx, pool, vt, fsys, files, apply)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available: see migrationLockTimeout
			select {
			case <-ctx.Done():
				return fmt.Errorf("%w (waiting for a lock another transaction holds: %w)", ctx.Err(), err)
			case <-time.After(wait + rand.N(wait)):
			}
			wait = min(2*wait, 8*lockRetry)
			continue
		}
		if err != nil || done {
			return err
		}
	}
}

// migrationLockTimeout is the lock_timeout of a migration's statements. A migration
// that alters a table waits for the transactions that read it to end, and every other
// statement on the table queues behind its request meanwhile: behind a long
// transaction (a forgotten BEGIN), every start and claim would wait as long. Its waits
// time out instead, the migration's transaction rolls back, and it is tried again after
// lockRetry (doubling, with jitter, to 8 times that) until the caller's context ends.
const (
	migrationLockTimeout = "1s"
	lockRetry            = 500 * time.Millisecond
)

// parseFile reads and parses the migration m of fsys.
func parseFile(fsys fs.FS, m migration) (parsed, error) {
	f, err := fsys.Open(m.name)
	if err != nil {
		return parsed{}, err
	}
	defer f.Close()
	stmts, useTx, err := parseUp(f)
	if err != nil {
		return parsed{}, fmt.Errorf("migration %s: %w", m.name, err)
	}
	return parsed{stmts, useTx}, nil
}

// readCommitted is the isolation of the migration transactions, whatever the
// database's default_transaction_isolation: each reads what is applied after it took
// the migration lock, so its statements' snapshots must follow the lock (under
// REPEATABLE READ the lock statement's snapshot, taken before it waited, hid what the
// lock's holder had just applied).
var readCommitted = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// applyNext applies the first pending migration, in a transaction that holds the
// migration lock from before it reads what is applied; done when none is pending.
func applyNext(ctx context.Context, pool *pgxpool.Pool, vt string, fsys fs.FS, files []migration, apply map[int64]parsed) (done bool, err error) {
	var next *migration
	err = pgx.BeginTxFunc(ctx, pool, readCommitted, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, LockID); err != nil {
			return fmt.Errorf("take the migration lock: %w", err)
		}
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', '`+migrationLockTimeout+`', true)`); err != nil {
			return err
		}
		pending, err := pendingMigrations(ctx, tx, vt, files)
		if err != nil || len(pending) == 0 {
			return err
		}
		next = &pending[0]
		p, ok := apply[next.version]
		if !ok { // applied, then migrated down by someone else since we looked
			if p, err = parseFile(fsys, *next); err != nil {
				return err
			}
			apply[next.version] = p
		}
		if !p.useTx {
			return nil // below, outside a transaction
		}
		if err := run(ctx, tx, vt, next.version, p.stmts); err != nil {
			return fmt.Errorf("migration %s: %w", next.name, err)
		}
		return nil
	})
	switch {
	case err != nil:
		return false, err
	case next == nil:
		return true, nil
	case apply[next.version].useTx:
		return false, nil
	}
	return false, applyWithoutTx(ctx, pool, vt, files, *next, apply[next.version])
}

// applyWithoutTx applies a NO TRANSACTION migration statement by statement, holding
// the migration lock session-level on one connection (it cannot be held by a
// transaction that the statements are outside of).
func applyWithoutTx(ctx context.Context, pool *pgxpool.Pool, vt string, files []migration, m migration, p parsed) (err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, LockID); err != nil {
		// The lock may have been granted as the wait was cancelled: drop the session.
		conn.Conn().Close(context.WithoutCancel(ctx)) //nolint:errcheck
		return fmt.Errorf("take the migration lock: %w", err)
	}
	defer func() {
		unlockCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		var unlocked bool
		if uerr := conn.QueryRow(unlockCtx, `SELECT pg_advisory_unlock($1)`, LockID).Scan(&unlocked); uerr != nil || !unlocked {
			// Never hand a connection that may still hold the lock back to the pool:
			// closing it ends the session, which releases the lock.
			conn.Conn().Close(unlockCtx) //nolint:errcheck
			if err == nil && uerr != nil {
				err = fmt.Errorf("release the migration lock: %w", uerr)
			}
		}
	}()
	pending, err := pendingMigrations(ctx, conn, vt, files)
	if err != nil || len(pending) == 0 || pending[0].version != m.version {
		return err // another caller applied it meanwhile: the next applyNext goes on
	}
	if err := run(ctx, conn, vt, m.version, p.stmts); err != nil {
		return fmt.Errorf("migration %s: %w", m.name, err)
	}
	return nil
}

// run runs the statements of a migration and records its version in vt.
func run(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, vt string, version int64, stmts []string) error {
	for _, stmt := range stmts {
		// No arguments: pgx sends it with the simple protocol, as goose's
		// database/sql Exec through pgx does.
		if _, err := db.Exec(ctx, stmt); err != nil {
			return err
		}
	}
	_, err := db.Exec(ctx, `INSERT INTO `+vt+` (version_id, is_applied) VALUES ($1, $2)`, version, true)
	return err
}

// ensureVersionTable creates goose's version table unless it exists, with the row of
// version 0 goose inserts with it, in one transaction that holds the migration lock
// (transaction-level, as applyNext does): concurrent migrators, Kagzi's or goose's
// session locker, create it once. A migrator that creates it without the lock may
// still race this one: its duplicate is no error.
func ensureVersionTable(ctx context.Context, conn *pgxpool.Pool) error {
	schemaName, table, _ := strings.Cut(migrations.VersionTable, ".")
	exists := func(db interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) (bool, error) {
		var ok bool
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = $2)`,
			schemaName, table).Scan(&ok)
		return ok, err
	}
	if ok, err := exists(conn); err != nil || ok {
		return err
	}
	err := pgx.BeginTxFunc(ctx, conn, readCommitted, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, LockID); err != nil {
			return fmt.Errorf("take the migration lock: %w", err)
		}
		if ok, err := exists(tx); err != nil || ok {
			return err
		}
		// goose v3's statements for PostgreSQL (internal/dialects/postgres.go).
		if _, err := tx.Exec(ctx, `CREATE TABLE `+versionTable()+` (
		id integer PRIMARY KEY GENERATED BY DEFAULT AS IDENTITY,
		version_id bigint NOT NULL,
		is_applied boolean NOT NULL,
		tstamp timestamp NOT NULL DEFAULT now()
	)`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+versionTable()+` (version_id, is_applied) VALUES ($1, $2)`, 0, true)
		return err
	})
	var pgErr *pgconn.PgError
	// duplicate_table, duplicate_object (its row type), or unique_violation on
	// pg_type: a concurrent CREATE without the lock won.
	if errors.As(err, &pgErr) && (pgErr.Code == "42P07" || pgErr.Code == "42710" || pgErr.Code == "23505") {
		if ok, err := exists(conn); err != nil || ok {
			return err
		}
	}
	if err != nil {
		return fmt.Errorf("create version table %s: %w", migrations.VersionTable, err)
	}
	return nil
}

// pendingMigrations returns the migrations to apply, in version order, as goose's
// provider chooses them: a version is applied if the version table has a row for it
// (goose deletes the row when it migrates down). A file older than the newest applied
// version but not applied itself is an error, as it is for goose without
// -allow-missing: migrations are append-only, so it means the table was edited.
func pendingMigrations(ctx context.Context, conn interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, vt string, files []migration) ([]migration, error) {
	rows, _ := conn.Query(ctx, `SELECT version_id FROM `+vt)
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", migrations.VersionTable, err)
	}
	if len(applied) == 0 {
		return nil, fmt.Errorf("%s: missing zero version migration", migrations.VersionTable)
	}
	dbMax := slices.Max(applied)
	var missing []string
	var pending []migration
	for _, m := range files {
		switch {
		case slices.Contains(applied, m.version):
		case m.version < dbMax:
			missing = append(missing, strconv.FormatInt(m.version, 10))
		default:
			pending = append(pending, m)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s: detected %d missing (out-of-order) migrations lower than database version (%d): %s",
			migrations.VersionTable, len(missing), dbMax, strings.Join(missing, ","))
	}
	return pending, nil
}

// collect returns the migration files of fsys (*.sql at its root), in version order.
// Every one must be named as goose wants, NNNNN_name.sql, with a version of its own.
func collect(fsys fs.FS) ([]migration, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	var files []migration
	for _, name := range names {
		v, err := fileVersion(name)
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", name, err)
		}
		if i := slices.IndexFunc(files, func(m migration) bool { return m.version == v }); i >= 0 {
			return nil, fmt.Errorf("found duplicate migration version %d: %s and %s", v, files[i].name, name)
		}
		files = append(files, migration{version: v, name: name})
	}
	slices.SortFunc(files, func(a, b migration) int { return cmp.Compare(a.version, b.version) })
	return files, nil
}

// Version returns the applied schema version and the newest one this build knows.
//
// It takes no lock, so it answers at once even while a migration runs (or another
// process holds the migration lock): the applied version is read with a plain SELECT
// from the version table, as goose itself reads it (the highest version_id), and the
// newest one from the names of the embedded migration files. A database without the
// version table or without the kagzi schema (never migrated) is at version 0. Unlike
// Up, Version never creates either.
func Version(ctx context.Context, pool *pgxpool.Pool) (current, latest int64, err error) {
	if latest, err = Latest(); err != nil {
		return 0, 0, err
	}
	vt, _, err := resolveVersionTable(ctx, pool)
	if err != nil {
		return 0, latest, err
	}
	err = pool.QueryRow(ctx, `SELECT coalesce(max(version_id), 0) FROM `+vt).Scan(&current)
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
	files, err := collect(migrations.FS)
	if err != nil {
		return 0, err
	}
	if len(files) == 0 {
		return 0, nil
	}
	return files[len(files)-1].version, nil
})

// versionTable returns migrations.VersionTable quoted for SQL.
func versionTable() string {
	schemaName, table, _ := strings.Cut(migrations.VersionTable, ".")
	return pgx.Identifier{schemaName, table}.Sanitize()
}

// resolveVersionTable returns the version table that records Kagzi's migrations,
// quoted for SQL, and whether it exists: migrations.VersionTable, the one Migrate
// creates (and goose's CLI given -table kagzi.goose_db_version uses), unless it records
// no migration while Kagzi's schema exists and goose's default table (goose_db_version
// in the search path) exists: then the goose CLI applied the migrations without -table
// (as `goose -dir migrations postgres "$DSN" up`), and that table records them, for
// Migrate and Version as for goose. (Records no migration: missing, or empty, or with
// goose's version 0 only, as `goose -table kagzi.goose_db_version status` leaves it when
// it creates it.)
func resolveVersionTable(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (table string, found bool, err error) {
	var own bool
	var cli *string
	err = db.QueryRow(ctx, `
		SELECT to_regclass($1) IS NOT NULL,
			CASE WHEN to_regclass($2) IS NOT NULL THEN
				(SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname)
				 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
				 WHERE c.oid = to_regclass('goose_db_version') AND c.oid IS DISTINCT FROM to_regclass($1))
			END`, versionTable(), pgx.Identifier{migrations.Schema, "runs"}.Sanitize()).Scan(&own, &cli)
	if err != nil {
		return "", false, fmt.Errorf("look for %s: %w", migrations.VersionTable, err)
	}
	if own && cli != nil {
		var records bool
		if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+versionTable()+` WHERE version_id > 0)`).Scan(&records); err != nil {
			return "", false, fmt.Errorf("read %s: %w", migrations.VersionTable, err)
		}
		own = records
	}
	switch {
	case own:
		return versionTable(), true, nil
	case cli != nil:
		return *cli, true, nil
	}
	return versionTable(), false, nil
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
