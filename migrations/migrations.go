// Package migrations holds Kagzi's schema as goose SQL files, embedded so that
// kagzi.Migrate can apply them without any file on disk. The same files work with
// the goose command-line tool (see the README for the flags).
package migrations

import "embed"

// FS holds the goose SQL migrations, one file per schema version.
//
//go:embed *.sql
var FS embed.FS

// VersionTable is the name of goose's version table for Kagzi's schema. It differs
// from goose's default so it never clashes with the application's own goose table.
const VersionTable = "kagzi_goose_db_version"
