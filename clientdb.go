package kagzi

import (
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi/internal/clientdb"
)

// The console (package ui) reads the client's database with statements of its own;
// see internal/clientdb.
func init() {
	clientdb.Pool = func(c any) *pgxpool.Pool { return c.(*Client).pool }
	clientdb.ReadPool = func(c any) *pgxpool.Pool { return c.(*Client).read }
}
