package migrations_test

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi/internal/schema"
	"github.com/kagzi/kagzi/internal/schemadump"
	"github.com/kagzi/kagzi/internal/testdb"
)

// snapshotFile is the checked-in schema. It is not beside the migrations: the goose CLI
// reads every *.sql file of its -dir as a migration.
const snapshotFile = "snapshot/schema.sql"

var update = flag.Bool("update", false, "rewrite "+snapshotFile+" from a freshly migrated database")

// TestSchemaSnapshot migrates an empty database and checks that the kagzi schema, as
// pg_dump prints it, is the one in snapshot/schema.sql: a change to the schema shows up
// in review as a change to that file, and a migration that does not build what the
// snapshot says fails here.
func TestSchemaSnapshot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testdb.NewEmpty(t)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := schema.Up(ctx, pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	got := schemadump.Dump(t, pool, dbURL)

	if *update {
		if err := os.MkdirAll(filepath.Dir(snapshotFile), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(snapshotFile, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", snapshotFile)
		return
	}
	want, err := os.ReadFile(snapshotFile)
	if err != nil {
		t.Fatalf("%v\nCreate it with: go test ./migrations -run TestSchemaSnapshot -update", err)
	}
	if got != string(want) {
		t.Errorf("the migrated schema differs from migrations/%s (- snapshot, + migrated):\n%s\n"+
			"If the change is intended, regenerate the snapshot and commit it with the migration:\n"+
			"    go test ./migrations -run TestSchemaSnapshot -update\n"+
			"(from the repository root, with DATABASE_URL set or scripts/test's PostgreSQL running)",
			snapshotFile, schemadump.Diff(string(want), got))
	}
}
