package gooseinterop_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for goose
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/schema"
	"github.com/kagzi/kagzi/internal/schemadump"
	"github.com/kagzi/kagzi/internal/testdb"
	"github.com/kagzi/kagzi/migrations"
)

const snapshotFile = "../../migrations/snapshot/schema.sql"

func TestMain(m *testing.M) {
	// The goose CLI runs goose's package-level API with these settings
	// (goose -dir migrations -table kagzi.goose_db_version postgres "$DATABASE_URL" ...).
	goose.SetBaseFS(migrations.FS)
	goose.SetTableName(migrations.VersionTable)
	goose.SetLogger(goose.NopLogger())
	if err := goose.SetDialect("postgres"); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

type database struct {
	url  string
	pool *pgxpool.Pool
	db   *sql.DB
}

// emptyDatabase returns a database of its own, without the kagzi schema.
func emptyDatabase(t *testing.T) *database {
	t.Helper()
	url := testdb.NewEmpty(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &database{url: url, pool: pool, db: db}
}

// createSchema does what the README tells goose CLI users to do first: goose creates
// its version table, inside the kagzi schema, before it runs the first migration.
func (d *database) createSchema(t *testing.T) {
	t.Helper()
	if _, err := d.pool.Exec(context.Background(), `CREATE SCHEMA kagzi`); err != nil {
		t.Fatal(err)
	}
}

// provider is goose's library API, with the session locker Kagzi used to configure.
func (d *database) provider(t *testing.T, opts ...lock.SessionLockerOption) *goose.Provider {
	t.Helper()
	locker, err := lock.NewPostgresSessionLocker(opts...)
	if err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, d.db, migrations.FS,
		goose.WithTableName(migrations.VersionTable), goose.WithSessionLocker(locker))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type versionRow struct {
	ID      int64
	Version int64
	Applied bool
}

func (d *database) versionRows(t *testing.T) []versionRow {
	t.Helper()
	rows, _ := d.pool.Query(context.Background(), `SELECT id, version_id, is_applied FROM `+migrations.VersionTable+` ORDER BY id`)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[versionRow])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// objects lists the tables, sequences, indexes and functions of the kagzi schema.
func (d *database) objects(t *testing.T) []string {
	t.Helper()
	rows, _ := d.pool.Query(context.Background(), `
		SELECT c.relkind::text || ' ' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'kagzi'
		UNION ALL
		SELECT 'f ' || p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'kagzi'
		ORDER BY 1`)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// checkCurrent checks that Kagzi sees the schema at the newest version and that it is,
// object for object, the snapshot the migrations build.
func (d *database) checkCurrent(t *testing.T) {
	t.Helper()
	d.checkSchema(t, func(dump string) string { return dump })
}

// checkCurrentAfterRace is checkCurrent after goose raced Kagzi to create the
// version table: goose's Provider.Up first asks HasPending, which creates a missing
// version table without the migration lock (goose retries when creators collide),
// and when several CREATE TABLEs run at once, Postgres may name the winner's identity
// sequence goose_db_version_id_seq1 (the name of a loser's sequence was taken when it
// chose). The name is all that differs; it is read as the usual one.
func (d *database) checkCurrentAfterRace(t *testing.T) {
	t.Helper()
	seq := regexp.MustCompile(`goose_db_version_id_seq[0-9]+\b`)
	d.checkSchema(t, func(dump string) string { return seq.ReplaceAllString(dump, "goose_db_version_id_seq") })
}

func (d *database) checkSchema(t *testing.T, normalize func(string) string) {
	t.Helper()
	current, latest, err := schema.Version(context.Background(), d.pool)
	if err != nil || current != latest || latest == 0 {
		t.Fatalf("Kagzi's schema version = %d of %d, %v", current, latest, err)
	}
	want, err := os.ReadFile(snapshotFile)
	if err != nil {
		t.Fatal(err)
	}
	if got := normalize(schemadump.Dump(t, d.pool, d.url)); got != string(want) {
		t.Fatalf("the schema differs from migrations/snapshot/schema.sql (- snapshot, + this database):\n%s",
			schemadump.Diff(string(want), got))
	}
}

func latest(t *testing.T) int64 {
	t.Helper()
	v, err := schema.Latest()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// (a) After kagzi.Migrate, goose sees every migration applied and has nothing to do,
// through its provider and through the package-level API its CLI runs.
func TestGooseSeesTheSchemaKagziMigratedAsCurrent(t *testing.T) {
	ctx := context.Background()
	d := emptyDatabase(t)
	if err := kagzi.Migrate(ctx, d.pool); err != nil {
		t.Fatal(err)
	}
	rows := d.versionRows(t)

	p := d.provider(t)
	status, err := p.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(status) == 0 {
		t.Fatal("goose found no migrations")
	}
	for _, s := range status {
		if s.State != goose.StateApplied || s.AppliedAt.IsZero() {
			t.Errorf("goose: migration %d is %s (applied at %v), want applied", s.Source.Version, s.State, s.AppliedAt)
		}
	}
	if pending, err := p.HasPending(ctx); err != nil || pending {
		t.Fatalf("goose HasPending = %v, %v", pending, err)
	}
	if v, err := p.GetDBVersion(ctx); err != nil || v != latest(t) {
		t.Fatalf("goose GetDBVersion = %d, %v; want %d", v, err, latest(t))
	}
	if res, err := p.Up(ctx); err != nil || len(res) != 0 {
		t.Fatalf("goose Up = %v, %v; want nothing to do", res, err)
	}

	// The CLI's code path: goose status / version / up.
	if v, err := goose.GetDBVersionContext(ctx, d.db); err != nil || v != latest(t) {
		t.Fatalf("goose version (CLI) = %d, %v; want %d", v, err, latest(t))
	}
	if err := goose.UpContext(ctx, d.db, "."); err != nil {
		t.Fatalf("goose up (CLI): %v", err)
	}
	if got := d.versionRows(t); !slices.Equal(got, rows) {
		t.Fatalf("goose changed the version table: %v, was %v", got, rows)
	}
	d.checkCurrent(t)
}

// (b) After goose applied the migrations, kagzi.Migrate has nothing to do and the
// schema is the snapshot, whether goose's provider or its CLI applied them.
func TestKagziSeesTheSchemaGooseMigratedAsCurrent(t *testing.T) {
	for _, tc := range []struct {
		name string
		up   func(*testing.T, *database) error
	}{
		{"provider", func(t *testing.T, d *database) error { _, err := d.provider(t).Up(context.Background()); return err }},
		{"CLI", func(t *testing.T, d *database) error { return goose.UpContext(context.Background(), d.db, ".") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			d := emptyDatabase(t)
			d.createSchema(t)
			if err := tc.up(t, d); err != nil {
				t.Fatalf("goose up: %v", err)
			}
			rows := d.versionRows(t)
			if len(rows) != int(latest(t))+1 || rows[0].Version != 0 {
				t.Fatalf("goose's version rows %v", rows)
			}
			if err := kagzi.Migrate(ctx, d.pool); err != nil {
				t.Fatal(err)
			}
			if got := d.versionRows(t); !slices.Equal(got, rows) {
				t.Fatalf("kagzi.Migrate changed the version table: %v, was %v", got, rows)
			}
			d.checkCurrent(t)
		})
	}
}

// (c) goose migrates a database kagzi.Migrate built down to 0, which leaves the kagzi
// schema holding only goose's version table; kagzi.Migrate builds it all again.
func TestGooseDownToZeroThenKagziMigrateUp(t *testing.T) {
	for _, tc := range []struct {
		name string
		down func(*testing.T, *database) error
	}{
		{"provider", func(t *testing.T, d *database) error {
			_, err := d.provider(t).DownTo(context.Background(), 0)
			return err
		}},
		{"CLI", func(t *testing.T, d *database) error { return goose.DownToContext(context.Background(), d.db, ".", 0) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			d := emptyDatabase(t)
			if err := kagzi.Migrate(ctx, d.pool); err != nil {
				t.Fatal(err)
			}
			migrated := d.objects(t)
			if !slices.Contains(migrated, "r runs") || !slices.Contains(migrated, "f run_changed") {
				t.Fatalf("after Migrate the kagzi schema holds %q", migrated)
			}

			if err := tc.down(t, d); err != nil {
				t.Fatalf("goose down to 0: %v", err)
			}
			want := []string{"S goose_db_version_id_seq", "i goose_db_version_pkey", "r goose_db_version"}
			if got := d.objects(t); !slices.Equal(got, want) {
				t.Fatalf("after down to 0 the kagzi schema holds %q, want only goose's version table %q", got, want)
			}
			if current, _, err := schema.Version(ctx, d.pool); err != nil || current != 0 {
				t.Fatalf("Kagzi's schema version after down to 0 = %d, %v; want 0", current, err)
			}

			if err := kagzi.Migrate(ctx, d.pool); err != nil {
				t.Fatalf("kagzi.Migrate after down to 0: %v", err)
			}
			if got := d.objects(t); !slices.Equal(got, migrated) {
				t.Fatalf("after Migrate again the kagzi schema holds %q, want %q", got, migrated)
			}
			d.checkCurrent(t)
		})
	}
}

// kagzi.Migrate and goose's Postgres session locker take the same advisory lock, so
// neither migrates while the other does.
func TestKagziAndGooseSessionLockerExcludeEachOther(t *testing.T) {
	if schema.LockID != lock.DefaultLockID {
		t.Fatalf("Kagzi's migration lock is %d, goose's default %d", schema.LockID, lock.DefaultLockID)
	}
	ctx := context.Background()
	d := emptyDatabase(t)

	// goose holds the lock: kagzi.Migrate waits.
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := d.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := locker.SessionLock(ctx, conn); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := kagzi.Migrate(short, d.pool); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("kagzi.Migrate while goose holds its lock = %v, want it to wait until its deadline", err)
	}
	if err := locker.SessionUnlock(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if err := kagzi.Migrate(ctx, d.pool); err != nil {
		t.Fatal(err)
	}

	// Kagzi's lock is held (as while kagzi.Migrate runs): goose's provider cannot take its own.
	held, err := d.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	if _, err := held.Exec(ctx, `SELECT pg_advisory_lock($1)`, schema.LockID); err != nil {
		t.Fatal(err)
	}
	defer held.Exec(ctx, `SELECT pg_advisory_unlock($1)`, schema.LockID) //nolint:errcheck
	p := d.provider(t, lock.WithLockTimeout(1, 1))
	if _, err := p.DownTo(ctx, 0); err == nil {
		t.Fatal("goose migrated down while Kagzi's migration lock was held")
	}
	if current, latestV, err := schema.Version(ctx, d.pool); err != nil || current != latestV {
		t.Fatalf("schema version %d of %d, %v: goose ran", current, latestV, err)
	}
}

// kagzi.Migrate and goose's provider run at once on a new database: the migrations are
// applied and recorded once.
func TestKagziAndGooseMigrateAtOnce(t *testing.T) {
	ctx := context.Background()
	d := emptyDatabase(t)
	d.createSchema(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Go(func() {
			if i%2 == 0 {
				errs <- kagzi.Migrate(ctx, d.pool)
			} else {
				_, err := d.provider(t).Up(ctx)
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var versions []int64
	for _, r := range d.versionRows(t) {
		versions = append(versions, r.Version)
	}
	want := []int64{0}
	for v := int64(1); v <= latest(t); v++ {
		want = append(want, v)
	}
	if !slices.Equal(versions, want) {
		t.Fatalf("version rows %v, want each version once: %v", versions, want)
	}
	d.checkCurrentAfterRace(t)
}

// (f) The bare goose command (goose -dir migrations postgres "$DSN" up, no -table)
// records Kagzi's migrations in goose's default table, goose_db_version in the search
// path: kagzi.Migrate and the schema version read that table then, and a migration
// Migrate applies is recorded there, where the command sees it.
func TestKagziMigratesAndReadsTheSchemaTheBareGooseCommandMigrated(t *testing.T) {
	ctx := context.Background()
	d := emptyDatabase(t)
	bare := func() *goose.Provider { // goose's default version table
		p, err := goose.NewProvider(goose.DialectPostgres, d.db, migrations.FS)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	latest := latest(t)
	if _, err := bare().UpTo(ctx, latest-1); err != nil {
		t.Fatalf("bare goose up to %d: %v", latest-1, err)
	}
	if current, _, err := schema.Version(ctx, d.pool); err != nil || current != latest-1 {
		t.Fatalf("schema version after the bare command: %d, %v; want %d", current, err, latest-1)
	}
	if err := kagzi.Migrate(ctx, d.pool); err != nil {
		t.Fatalf("kagzi.Migrate after the bare goose command: %v", err)
	}
	if current, _, err := schema.Version(ctx, d.pool); err != nil || current != latest {
		t.Fatalf("schema version after Migrate: %d, %v; want %d", current, err, latest)
	}
	var own bool
	if err := d.pool.QueryRow(ctx, `SELECT to_regclass('kagzi.goose_db_version') IS NOT NULL`).Scan(&own); err != nil || own {
		t.Fatalf("Migrate made a version table of its own (%v, %v): the command's records the schema", own, err)
	}
	if pending, err := bare().HasPending(ctx); err != nil || pending {
		t.Fatalf("the bare command after Migrate: pending %v, %v; want the migration Migrate applied recorded", pending, err)
	}
	c, err := kagzi.NewClient(d.pool, kagzi.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if h := c.Health(ctx); !h.SchemaCurrent {
		t.Fatalf("health after the bare command and Migrate: %+v; want the schema current", h)
	}

	// The documents' other form of the command, `-table kagzi.goose_db_version status`,
	// creates that table, empty: the bare command's table still records the schema
	// (found from outside: every later Migrate re-ran the baseline and failed).
	if _, _, err := d.provider(t).GetVersions(ctx); err != nil {
		t.Fatalf("goose status with -table: %v", err)
	}
	if err := d.pool.QueryRow(ctx, `SELECT to_regclass('kagzi.goose_db_version') IS NOT NULL`).Scan(&own); err != nil || !own {
		t.Fatalf("goose status with -table made no table (%v, %v): the case is not reproduced", own, err)
	}
	if err := kagzi.Migrate(ctx, d.pool); err != nil {
		t.Fatalf("kagzi.Migrate after goose created an empty kagzi.goose_db_version: %v", err)
	}
	if current, _, err := schema.Version(ctx, d.pool); err != nil || current != latest {
		t.Fatalf("schema version with an empty kagzi.goose_db_version: %d, %v; want %d", current, err, latest)
	}
}
