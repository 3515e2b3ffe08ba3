package schema_test

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi/internal/schema"
	"github.com/kagzi/kagzi/internal/testdb"
)

// The down migrations leave the kagzi schema holding goose's version table alone (goose
// records each down migration there), and the schema migrates up again from there.
func TestDownToZeroLeavesOnlyGooseTableAndUpAgainWorks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.NewEmpty(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	if err := schema.Up(ctx, pool); err != nil {
		t.Fatal(err)
	}
	objects := func() []string {
		rows, _ := pool.Query(ctx, `
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
	migrated := objects()
	if !slices.Contains(migrated, "r runs") || !slices.Contains(migrated, "f run_changed") {
		t.Fatalf("after Up the kagzi schema holds %q", migrated)
	}

	p, closeDB, err := schema.Provider(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer closeDB()
	if _, err := p.DownTo(ctx, 0); err != nil {
		t.Fatalf("down to 0: %v", err)
	}
	want := []string{"S goose_db_version_id_seq", "i goose_db_version_pkey", "r goose_db_version"}
	if got := objects(); !slices.Equal(got, want) {
		t.Fatalf("after down to 0 the kagzi schema holds %q, want only goose's version table %q", got, want)
	}
	if current, _, err := schema.Version(ctx, pool); err != nil || current != 0 {
		t.Fatalf("Version after down to 0 = %d, %v; want 0", current, err)
	}

	if err := schema.Up(ctx, pool); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if got := objects(); !slices.Equal(got, migrated) {
		t.Fatalf("after up again the kagzi schema holds %q, want %q", got, migrated)
	}
	current, latest, err := schema.Version(ctx, pool)
	if err != nil || current != latest || latest == 0 {
		t.Fatalf("Version after up again = %d of %d, %v", current, latest, err)
	}
}
