package schema_test

import (
	"context"
	"errors"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi/internal/schema"
	"github.com/kagzi/kagzi/internal/testdb"
	"github.com/kagzi/kagzi/migrations"
)

func emptyPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testdb.NewEmpty(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

type versionRow struct {
	Version int64
	Applied bool
}

// versionRows returns the rows of the version table in insertion (id) order.
func versionRows(t *testing.T, pool *pgxpool.Pool) []versionRow {
	t.Helper()
	rows, _ := pool.Query(context.Background(), `SELECT version_id, is_applied FROM `+migrations.VersionTable+` ORDER BY id`)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[versionRow])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// Up builds goose's version table as goose v3 builds it for PostgreSQL, with its version
// 0 row, records each migration as goose does, and does nothing the second time.
func TestUpRecordsVersionsInGooseVersionTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyPool(t)
	if err := schema.Up(ctx, pool); err != nil {
		t.Fatal(err)
	}
	latest, err := schema.Latest()
	if err != nil {
		t.Fatal(err)
	}

	rows, _ := pool.Query(ctx, `
		SELECT column_name || ' ' || data_type || ' ' || is_nullable || ' ' || is_identity || ' ' ||
			coalesce(identity_generation, '') || ' ' || coalesce(column_default, '')
		FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'goose_db_version'
		ORDER BY ordinal_position`, migrations.Schema)
	columns, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	wantColumns := []string{
		"id integer NO YES BY DEFAULT ",
		"version_id bigint NO NO  ",
		"is_applied boolean NO NO  ",
		"tstamp timestamp without time zone NO NO  now()",
	}
	if !slices.Equal(columns, wantColumns) {
		t.Fatalf("version table columns:\n%q\nwant goose's:\n%q", columns, wantColumns)
	}
	var pk string
	if err := pool.QueryRow(ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'p'`,
		migrations.VersionTable).Scan(&pk); err != nil || pk != "PRIMARY KEY (id)" {
		t.Fatalf("primary key %q, %v", pk, err)
	}

	want := []versionRow{{0, true}}
	files, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files { // one row per file, in version order (versions may skip)
		v, err := strconv.ParseInt(f[:strings.IndexByte(f, '_')], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, versionRow{v, true})
	}
	if want[len(want)-1].Version != latest {
		t.Fatalf("newest file is version %d, Latest says %d", want[len(want)-1].Version, latest)
	}
	if got := versionRows(t, pool); !slices.Equal(got, want) {
		t.Fatalf("version rows %v, want %v", got, want)
	}
	if err := schema.Up(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if got := versionRows(t, pool); !slices.Equal(got, want) {
		t.Fatalf("after a second Up: version rows %v, want %v", got, want)
	}
	if current, l, err := schema.Version(ctx, pool); err != nil || current != latest || l != latest {
		t.Fatalf("Version = %d, %d, %v; want %d", current, l, err, latest)
	}
}

// Each migration runs in a transaction of its own with its version row, so a failing one
// leaves nothing of itself behind and the ones before it recorded; a NO TRANSACTION file
// runs outside any (CREATE INDEX CONCURRENTLY cannot run inside one).
func TestUpAppliesEachMigrationInATransactionOfItsOwnUnlessTheFileSaysNot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyPool(t)
	files := fstest.MapFS{
		"00001_table.sql": {Data: []byte(`-- +goose Up
CREATE TABLE kagzi.t (id int);
-- +goose StatementBegin
CREATE FUNCTION kagzi.one() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    RETURN 1;
END;
$$;
-- +goose StatementEnd

-- +goose Down
DROP TABLE kagzi.t;
`)},
		"00002_index.sql": {Data: []byte(`-- +goose NO TRANSACTION
-- +goose Up
CREATE INDEX CONCURRENTLY t_id ON kagzi.t (id);
`)},
		"00003_fails.sql": {Data: []byte(`-- +goose Up
CREATE TABLE kagzi.t3 (id int);
SELECT 1/0;
`)},
		"README.md": {Data: []byte("not a migration")},
	}
	err := schema.UpFS(ctx, pool, files)
	if err == nil || !strings.Contains(err.Error(), "00003_fails.sql") {
		t.Fatalf("Up = %v, want the error of 00003_fails.sql", err)
	}
	if got, want := versionRows(t, pool), []versionRow{{0, true}, {1, true}, {2, true}}; !slices.Equal(got, want) {
		t.Fatalf("version rows %v, want %v", got, want)
	}
	var one int
	var index, t3 bool
	if err := pool.QueryRow(ctx, `SELECT kagzi.one(), to_regclass('kagzi.t_id') IS NOT NULL, to_regclass('kagzi.t3') IS NOT NULL`).
		Scan(&one, &index, &t3); err != nil || one != 1 || !index || t3 {
		t.Fatalf("one() = %d, index %v, t3 %v, %v; want 1, the index, no t3", one, index, t3, err)
	}

	files["00003_fails.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\nCREATE TABLE kagzi.t3 (id int);\n")}
	if err := schema.UpFS(ctx, pool, files); err != nil {
		t.Fatal(err)
	}
	if got, want := versionRows(t, pool), []versionRow{{0, true}, {1, true}, {2, true}, {3, true}}; !slices.Equal(got, want) {
		t.Fatalf("version rows %v, want %v", got, want)
	}
}

// As goose without -allow-missing: a file older than the newest applied version that was
// never applied is an error, not applied out of order.
func TestUpRefusesAMissingOlderMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyPool(t)
	files := fstest.MapFS{
		"00001_a.sql": {Data: []byte("-- +goose Up\nCREATE TABLE kagzi.a (id int);\n")},
		"00003_c.sql": {Data: []byte("-- +goose Up\nCREATE TABLE kagzi.c (id int);\n")},
	}
	if err := schema.UpFS(ctx, pool, files); err != nil {
		t.Fatal(err)
	}
	files["00002_b.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\nCREATE TABLE kagzi.b (id int);\n")}
	if err := schema.UpFS(ctx, pool, files); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("Up with a missing migration 2 below 3 = %v, want an error", err)
	}
}

func TestUpRefusesBadlyNamedOrDuplicateFiles(t *testing.T) {
	t.Parallel()
	pool := emptyPool(t)
	for name, files := range map[string]fstest.MapFS{
		"no version": {"baseline.sql": {Data: []byte("-- +goose Up\n")}},
		"duplicate":  {"00001_a.sql": {Data: []byte("-- +goose Up\n")}, "001_b.sql": {Data: []byte("-- +goose Up\n")}},
	} {
		if err := schema.UpFS(context.Background(), pool, files); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// advisoryLockHolders counts the sessions holding (or waiting for) the migration lock
// in the pool's database.
func advisoryLockHolders(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `
		SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND ((classid::bigint << 32) | objid::bigint) = $1 AND objsubid = 1`, schema.LockID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Up waits for the session lock goose's Postgres session locker takes (its default
// key), and releases it when done, while keeping its connection in the pool.
func TestUpWaitsForTheMigrationLockAndReleasesIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyPool(t)
	other, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(ctx, `SELECT pg_advisory_lock($1)`, schema.LockID); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := schema.Up(short, pool); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Up while another session holds the lock = %v, want it to wait until its deadline", err)
	}
	if current, _, err := schema.Version(ctx, pool); err != nil || current != 0 {
		t.Fatalf("Version after a cancelled Up = %d, %v; want 0", current, err)
	}

	done := make(chan error, 1)
	go func() { done <- schema.Up(ctx, pool) }()
	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Up returned %v while the lock was held", err)
	default:
	}
	if _, err := other.Exec(ctx, `SELECT pg_advisory_unlock($1)`, schema.LockID); err != nil {
		t.Fatal(err)
	}
	other.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := advisoryLockHolders(t, pool); n != 0 {
		t.Fatalf("%d sessions still hold the migration lock after Up", n)
	}
	current, latest, err := schema.Version(ctx, pool)
	if err != nil || current != latest {
		t.Fatalf("Version = %d of %d, %v", current, latest, err)
	}
}

// Found from outside: under a database default of REPEATABLE READ the migration
// transaction's snapshot was taken by its lock statement, before it waited, so a
// migrator that waited for another read the applied versions from before and applied
// a migration again (or failed on "relation already exists").
func TestConcurrentUpsApplyEachMigrationOnceUnderARepeatableReadDefault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.NewEmpty(t)
	admin := emptyPoolURL(t, url)
	var db string
	if err := admin.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET default_transaction_isolation = 'repeatable read'`); err != nil {
		t.Fatal(err)
	}
	const migrators = 6
	errs := make(chan error, migrators)
	for range migrators {
		go func() {
			pool, err := pgxpool.New(ctx, url)
			if err != nil {
				errs <- err
				return
			}
			defer pool.Close()
			errs <- schema.Up(ctx, pool)
		}()
	}
	for range migrators {
		if err := <-errs; err != nil {
			t.Fatalf("a concurrent Up under repeatable read: %v", err)
		}
	}
	seen := map[int64]int{}
	for _, r := range versionRows(t, admin) {
		seen[r.Version]++
	}
	for v, n := range seen {
		if n != 1 {
			t.Errorf("version %d recorded %d times", v, n)
		}
	}
}

// A role without CREATE on the database migrates a database whose kagzi schema an
// administrator created for it (the baseline looks before it creates the schema).
func TestUpByARoleWithoutCreateOnTheDatabaseUsesTheSchemaAnAdministratorMade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.NewEmpty(t)
	admin := emptyPoolURL(t, url)
	var db string
	if err := admin.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	role := "kagzi_migrator_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, q := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`REVOKE CREATE ON DATABASE ` + pgx.Identifier{db}.Sanitize() + ` FROM public`,
		`CREATE SCHEMA kagzi AUTHORIZATION ` + role,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		admin.Exec(context.Background(), `DROP SCHEMA kagzi CASCADE`)
		admin.Exec(context.Background(), `DROP OWNED BY `+role)
		admin.Exec(context.Background(), `DROP ROLE `+role)
	})
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := schema.Up(ctx, pool); err != nil {
		t.Fatalf("Up by a role without CREATE on the database, into the schema made for it: %v", err)
	}
}

func emptyPoolURL(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// A migration that needs a lock a long transaction holds (an ALTER TABLE behind a
// forgotten BEGIN that read the table) does not queue every other session's statement on
// that table behind its request until the transaction ends: its lock waits time out
// (lock_timeout), and it tries again, so other statements go on meanwhile, and it
// applies once the transaction ends (found from outside: a Migrate at a rolling deploy
// froze every start for as long as an open transaction lasted).
func TestAMigrationWaitingForATableLockLetsOtherStatementsThroughAndAppliesLater(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyPool(t)
	files := fstest.MapFS{
		"00001_table.sql": {Data: []byte("-- +goose Up\nCREATE TABLE kagzi.things (id int);\n")},
	}
	if err := schema.UpFS(ctx, pool, files); err != nil {
		t.Fatal(err)
	}
	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, `SELECT count(*) FROM kagzi.things`); err != nil {
		t.Fatal(err)
	}
	files["00002_alter.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\nALTER TABLE kagzi.things ADD COLUMN name text;\n")}
	done := make(chan error, 1)
	go func() { done <- schema.UpFS(ctx, pool, files) }()
	time.Sleep(500 * time.Millisecond) // the migration most likely waits for its lock by now
	for i := range 3 {
		read, cancel := context.WithTimeout(ctx, 20*time.Second)
		_, err := pool.Exec(read, `SELECT count(*) FROM kagzi.things`)
		cancel()
		if err != nil {
			t.Fatalf("read %d of the table while the migration waits for its lock: %v", i+1, err)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("the migration ended (%v) while the transaction holding its lock is open", err)
	default:
	}
	if err := blocker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the migration after the transaction ended: %v", err)
	}
	if _, err := pool.Exec(ctx, `SELECT name FROM kagzi.things`); err != nil {
		t.Fatalf("the migration was not applied: %v", err)
	}
}
