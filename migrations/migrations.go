// Package migrations holds Kagzi's schema as goose SQL files, embedded so that
// kagzi.Migrate can apply them without any file on disk. kagzi.Migrate applies them
// with a runner of its own that reads and records them as goose does; the same files
// work with the goose command-line tool (docs/workers-in-production.md has the flags).
//
// The migrations are append-only from the first release (0.1.0) on: a released file is
// never edited, renumbered or deleted, since databases out there have recorded it as
// applied. A change to the schema is a new file, NNNNN_what.sql with the next number,
// with a Down section that undoes it. 00001_baseline.sql is the schema as it stood at
// the first release (the development history was squashed into it before then).
//
// snapshot/schema.sql is the whole schema as pg_dump prints it after every migration,
// checked by TestSchemaSnapshot: commit it, regenerated, with each new migration
// (go test ./migrations -run TestSchemaSnapshot -update). It lives in a directory of
// its own because the goose CLI takes every .sql file of its -dir for a migration.
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
// of Kagzi. The table is created before the first migration runs, so the schema must
// exist first: kagzi.Migrate creates it; with the goose CLI, create it by hand.
const VersionTable = Schema + ".goose_db_version"
