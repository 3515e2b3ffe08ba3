package kagzi

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi/internal/clientdb"
)

// The console (package ui) reads the client's database with statements of its own;
// see internal/clientdb.
func init() {
	clientdb.Pool = func(c any) *pgxpool.Pool { return c.(*Client).pool }
	clientdb.ReadPool = func(c any) *pgxpool.Pool { return c.(*Client).read }
	clientdb.ListRunsPrimary = func(ctx context.Context, c, f any) (any, error) {
		client := c.(*Client)
		return client.listRuns(ctx, client.pool, f.(RunFilter))
	}
}
