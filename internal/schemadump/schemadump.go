// Package schemadump prints the kagzi schema of a database as pg_dump does, normalized,
// for the tests that compare a migrated schema with migrations/snapshot/schema.sql
// (migrations.TestSchemaSnapshot, and internal/gooseinterop for a schema goose built).
package schemadump

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Dump returns pg_dump's schema-only dump of the kagzi schema, normalized.
func Dump(t testing.TB, pool *pgxpool.Pool, dbURL string) string {
	t.Helper()
	var serverVersionNum int
	if err := pool.QueryRow(context.Background(), "SELECT current_setting('server_version_num')::int").Scan(&serverVersionNum); err != nil {
		t.Fatal(err)
	}
	pgDump, err := findPgDump(serverVersionNum / 10000)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(pgDump, "--schema-only", "--schema=kagzi", "--no-owner", "--no-privileges",
		"--no-tablespaces", "--dbname="+dbURL)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", pgDump, err, stderr.String())
	}
	return Header + normalizeDump(string(out))
}

// Header heads the dump, and the snapshot file.
const Header = `-- The kagzi schema as the migrations build it: pg_dump --schema-only --schema=kagzi
-- --no-owner --no-privileges --no-tablespaces of a freshly migrated database, without
-- pg_dump's comments and session settings. Generated; do not edit. After changing the
-- migrations, regenerate it with: go test ./migrations -run TestSchemaSnapshot -update

`

// findPgDump finds pg_dump: $PG_DUMP, else the one of the server's major version in
// Debian's layout, else the one in PATH, else the newest in Debian's layout.
func findPgDump(serverMajor int) (string, error) {
	if p := os.Getenv("PG_DUMP"); p != "" {
		return p, nil
	}
	if p := fmt.Sprintf("/usr/lib/postgresql/%d/bin/pg_dump", serverMajor); isExecutable(p) {
		return p, nil
	}
	if p, err := exec.LookPath("pg_dump"); err == nil {
		return p, nil
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_dump")
	sort.Slice(found, func(i, j int) bool { return majorOf(found[i]) < majorOf(found[j]) })
	if len(found) > 0 {
		return found[len(found)-1], nil
	}
	return "", fmt.Errorf("pg_dump not found (not in PATH nor in /usr/lib/postgresql/*/bin; set PG_DUMP to its path): "+
		"the schema snapshot test needs PostgreSQL's client tools, version %d or newer "+
		"(Debian: apt-get install postgresql-client)", serverMajor)
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

func majorOf(p string) int {
	var v int
	fmt.Sscanf(filepath.Base(filepath.Dir(filepath.Dir(p))), "%d", &v) //nolint:errcheck
	return v
}

// dumpNoise matches the lines of a dump that change with the pg_dump build, the run or
// the session rather than with the schema: comments (object headers, version banners),
// session settings, and the random key of \restrict / \unrestrict.
var dumpNoise = regexp.MustCompile(`^(--.*|SET .*|SELECT pg_catalog\.set_config\(.*|\\(un)?restrict .*)$`)

// normalizeDump drops dumpNoise lines, trailing spaces and runs of blank lines.
func normalizeDump(dump string) string {
	var b strings.Builder
	blank := true // drop leading blank lines
	for _, line := range strings.Split(dump, "\n") {
		line = strings.TrimRight(line, " \t\r")
		if dumpNoise.MatchString(line) {
			continue
		}
		if line == "" {
			if !blank {
				b.WriteString("\n")
			}
			blank = true
			continue
		}
		blank = false
		b.WriteString(line)
		b.WriteString("\n")
	}
	return strings.TrimRight(b.String(), "\n") + "\n"
}

// Diff is a small unified-style line diff (longest common subsequence) with three
// lines of context around each change.
func Diff(a, b string) string {
	x, y := strings.Split(a, "\n"), strings.Split(b, "\n")
	lcs := make([][]int, len(x)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(y)+1)
	}
	for i := len(x) - 1; i >= 0; i-- {
		for j := len(y) - 1; j >= 0; j-- {
			if x[i] == y[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	type op struct {
		kind byte
		text string
	}
	var ops []op
	i, j := 0, 0
	for i < len(x) || j < len(y) {
		switch {
		case i < len(x) && j < len(y) && x[i] == y[j]:
			ops = append(ops, op{' ', x[i]})
			i++
			j++
		case i < len(x) && (j == len(y) || lcs[i+1][j] >= lcs[i][j+1]):
			ops = append(ops, op{'-', x[i]})
			i++
		default:
			ops = append(ops, op{'+', y[j]})
			j++
		}
	}
	// Print the changes with three lines of context, "@@" between distant ones.
	const ctxLines = 3
	keep := make([]bool, len(ops))
	for k, o := range ops {
		if o.kind != ' ' {
			for c := max(0, k-ctxLines); c <= min(len(ops)-1, k+ctxLines); c++ {
				keep[c] = true
			}
		}
	}
	var out strings.Builder
	prev := -1
	for k, o := range ops {
		if !keep[k] {
			continue
		}
		if prev >= 0 && k > prev+1 {
			out.WriteString("@@\n")
		}
		fmt.Fprintf(&out, "%c %s\n", o.kind, o.text)
		prev = k
	}
	return out.String()
}
