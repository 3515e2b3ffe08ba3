// Package clientdb hands the packages of this module (the console, package ui) the
// pool a *kagzi.Client holds, which the root package does not export: the console
// runs its own reads (internal/store) on the client's database, confined to the
// client's namespace. The root package sets Pool when it is initialised.
package clientdb

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Pool returns the pool of a *kagzi.Client (passed as any: this package cannot
// import the root package, which imports it).
var Pool func(client any) *pgxpool.Pool

// ReadPool returns the pool a *kagzi.Client reads its listings from
// (kagzi.Config.ReadPool, or its pool): the console's page reads go there, its
// audit writes to Pool.
var ReadPool func(client any) *pgxpool.Pool

// ListRunsPrimary is the client's ListRuns (filter a kagzi.RunFilter, the result a
// *kagzi.RunPage) read from its pool, not its read pool: a bulk confirmation counts
// there the runs the action, on the primary, will change.
var ListRunsPrimary func(ctx context.Context, client, filter any) (any, error)
