// Package migrations holds Kagzi's schema as goose SQL files, embedded so that
// kagzi.Migrate can apply them without any file on disk. The same files work with
// the goose command-line tool (see the README for the flags).
package migrations

import "embed"

// FS holds the goose SQL migrations, one file per schema version.
//
//go:embed *.sql
var FS embed.FS

// Schema is the PostgreSQL schema that holds every Kagzi table, and goose's version
// table for them.
const Schema = "kagzi"

// VersionTable is goose's version table for Kagzi's schema, schema-qualified: it lives
// inside the kagzi schema, so it never clashes with the application's own goose table
// (goose_db_version in the search path), and dropping the schema removes every trace
// of Kagzi. goose creates this table before it runs the first migration, so the schema
// must exist first: kagzi.Migrate creates it; with the goose CLI, create it by hand.
const VersionTable = Schema + ".goose_db_version"
