package schema

import (
	"io/fs"
	"slices"
	"strings"
	"testing"

	"github.com/kagzi/kagzi/migrations"
)

// The cases follow goose v3's own parser tests (internal/sqlparser), which this parser
// passed when it was written: what goose runs, Kagzi runs.
func TestParseUpSplitsStatementsAsGooseDoes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sql   string
		want  []string
		useTx bool
	}{
		{
			name: "statements end at a line ending in a semicolon; comments before one are dropped, inside one kept",
			sql: `-- +goose Up
-- a comment before the first statement

CREATE TABLE a (
    -- a comment inside
    id int
);
SELECT 1; -- a comment after the semicolon
SELECT 2 -- not the end;
, 3;

-- +goose Down
DROP TABLE a;
`,
			want: []string{
				"CREATE TABLE a (\n    -- a comment inside\n    id int\n);",
				"SELECT 1; -- a comment after the semicolon",
				"SELECT 2 -- not the end;\n, 3;",
			},
			useTx: true,
		},
		{
			name: "a StatementBegin/StatementEnd block is one statement",
			sql: `-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    RETURN 1;
END;
$$;
-- +goose StatementEnd
SELECT f();
-- +goose Down
-- +goose StatementBegin
DROP FUNCTION f();
-- +goose StatementEnd
`,
			want: []string{
				"CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$\nBEGIN\n    RETURN 1;\nEND;\n$$;",
				"SELECT f();",
			},
			useTx: true,
		},
		{
			name: "NO TRANSACTION",
			sql: `-- +goose NO TRANSACTION
-- +goose Up
CREATE INDEX CONCURRENTLY i ON t (c);
`,
			want:  []string{"CREATE INDEX CONCURRENTLY i ON t (c);"},
			useTx: false,
		},
		{
			name:  "an empty Up section",
			sql:   "-- +goose Up\n-- +goose Down\nSELECT 1;\n",
			want:  nil,
			useTx: true,
		},
		{
			name:  "annotations in any case",
			sql:   "-- +goose up\n-- +goose statementbegin\nSELECT 1\n-- +goose statementend\n",
			want:  []string{"SELECT 1"},
			useTx: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, useTx, err := parseUp(strings.NewReader(tc.sql))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) || useTx != tc.useTx {
				t.Fatalf("got %q (in a transaction: %v), want %q (%v)", got, useTx, tc.want, tc.useTx)
			}
		})
	}
}

func TestParseUpRefusesWhatGooseRefuses(t *testing.T) {
	for name, sql := range map[string]string{
		"no Up annotation":                "SELECT 1;\n",
		"Down before Up":                  "-- +goose Down\nSELECT 1;\n-- +goose Up\nSELECT 2;\n",
		"two Up annotations":              "-- +goose Up\nSELECT 1;\n-- +goose Up\nSELECT 2;\n",
		"no final semicolon":              "-- +goose Up\nSELECT 1;\nSELECT 2\n",
		"no semicolon before Down":        "-- +goose Up\nSELECT 1\n-- +goose Down\nSELECT 2;\n",
		"StatementBegin without end":      "-- +goose Up\n-- +goose StatementBegin\nSELECT 1;\n",
		"StatementEnd without begin":      "-- +goose Up\nSELECT 1;\n-- +goose StatementEnd\n",
		"an unknown annotation":           "-- +goose Up\n-- +goose Sideways\nSELECT 1;\n",
		"an indented annotation":          "-- +goose Up\n  -- +goose StatementBegin\nSELECT 1;\n",
		"ENVSUB, which Kagzi does not do": "-- +goose Up\n-- +goose ENVSUB ON\nSELECT '${X}';\n",
	} {
		if _, _, err := parseUp(strings.NewReader(sql)); err == nil {
			t.Errorf("%s: no error for %q", name, sql)
		}
	}
}

func TestFileVersion(t *testing.T) {
	for name, want := range map[string]int64{
		"00001_baseline.sql": 1, "00042_x_y.sql": 42, "20240101120000_ts.sql": 20240101120000,
		"00001.sql": -1, "00000_zero.sql": -1, "x_name.sql": -1, "00001_a.go": -1, "00001_a.txt": -1,
	} {
		got, err := fileVersion(name)
		if want < 0 && err == nil || want >= 0 && (err != nil || got != want) {
			t.Errorf("fileVersion(%q) = %d, %v; want %d", name, got, err, want)
		}
	}
}

func TestEmbeddedMigrationsParse(t *testing.T) {
	files, err := collect(migrations.FS)
	if err != nil || len(files) == 0 {
		t.Fatalf("collect = %v, %v", files, err)
	}
	for _, m := range files {
		b, err := fs.ReadFile(migrations.FS, m.name)
		if err != nil {
			t.Fatal(err)
		}
		stmts, _, err := parseUp(strings.NewReader(string(b)))
		if err != nil || len(stmts) == 0 {
			t.Errorf("%s: %d statements, %v", m.name, len(stmts), err)
		}
	}
	if latest, err := Latest(); err != nil || latest != files[len(files)-1].version {
		t.Fatalf("Latest() = %d, %v", latest, err)
	}
}
