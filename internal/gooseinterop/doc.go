// Package gooseinterop holds only tests: they check, against goose itself, that a
// database kagzi.Migrate migrated looks migrated to goose and the other way round, that
// goose can migrate it down and kagzi.Migrate up again, and that both take the same lock.
//
// It is a module of its own so that goose, with everything its go.mod lists, is a
// dependency of these tests only and never of the core module. Nothing imports it.
package gooseinterop
