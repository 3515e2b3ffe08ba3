package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

// Behind PgBouncer in transaction mode, the application's pool goes through the
// pooler and the client's direct connection (its LISTEN connection, which also holds
// its workers' liveness locks) goes to PostgreSQL itself. Nothing connects until
// used, so this example runs without either server.
func ExampleConfig_directConnConfig() {
	ctx := context.Background()
	poolConfig, err := pgxpool.ParseConfig("postgres://app@pgbouncer.internal:6432/app?pool_max_conns=8")
	if err != nil {
		panic(err)
	}
	// PgBouncer before 1.21, or without max_prepared_statements, keeps no prepared
	// statement across its server connections: describe once, execute unnamed.
	poolConfig.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	pool, err := pgxpool.NewWithConfig(ctx, poolConfig)
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	direct, err := pgx.ParseConfig("postgres://app@postgres.internal:5432/app")
	if err != nil {
		panic(err)
	}
	client, err := kagzi.NewClient(pool, kagzi.Config{
		DirectConnConfig: direct,
		MaxConnections:   9, // this process's share: fails at once if the pool is larger
	})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	// The pool's 8 (to PgBouncer) and 1 direct (to PostgreSQL), whatever the workers.
	fmt.Println(client.Connections())
	// Output:
	// 9
}

var deployHello = kagzi.Define("deploy-hello", func(ctx *kagzi.Context, name string) (string, error) {
	return kagzi.Step(ctx, "greet", func(context.Context) (string, error) { return "hello " + name, nil })
})

// Where only a pooler is reachable, the client opens no connection outside its
// pool: workers poll for runs (every second by default) and hold no liveness lock.
func ExampleConfig_disableDirectConn() {
	pool, cleanup := exampleDB() // in production: a pool through PgBouncer
	defer cleanup()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := kagzi.NewClient(pool, kagzi.Config{DisableDirectConn: true, Logger: quietLogger()})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	w, err := kagzi.NewWorker(client, kagzi.WorkerConfig{}, deployHello)
	if err != nil {
		panic(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- w.Run(wctx) }()
	defer func() { stop(); <-done }()

	run, err := kagzi.Start(ctx, client, deployHello, "pooler")
	if err != nil {
		panic(err)
	}
	out, err := run.Wait(ctx)
	fmt.Println(out, err, client.Connections() == int(pool.Config().MaxConns))
	// Output:
	// hello pooler <nil> true
}

// Listings can read from a replica. Here the "replica" is the primary's own
// database; in production, a pool on a hot standby.
func ExampleConfig_readPool() {
	pool, cleanup := exampleDB()
	defer cleanup()
	ctx := context.Background()
	replica, err := pgxpool.NewWithConfig(ctx, pool.Config().Copy()) // e.g. pgxpool.New(ctx, replicaURL)
	if err != nil {
		panic(err)
	}
	defer replica.Close()
	client, err := kagzi.NewClient(pool, kagzi.Config{ReadPool: replica, Logger: quietLogger()})
	if err != nil {
		panic(err)
	}
	defer client.Close()

	run, err := kagzi.Start(ctx, client, deployHello, "replica", kagzi.WithID("greeting-1")) // the primary
	if err != nil {
		panic(err)
	}
	info, _ := client.GetRun(ctx, run.RunID) // the primary: always sees the start
	fmt.Println(info.WorkflowID, info.Status)
	page, _ := client.ListRuns(ctx, kagzi.RunFilter{}) // the replica: once replicated
	fmt.Println(len(page.Runs))
	// Output:
	// greeting-1 PENDING
	// 1
}

// A process started with a pool larger than its share of the server's connections
// fails at once.
func ExampleConfig_maxConnections() {
	pool, err := pgxpool.New(context.Background(), "postgres://app@postgres.internal:5432/app?pool_max_conns=10")
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	_, err = kagzi.NewClient(pool, kagzi.Config{MaxConnections: 8})
	fmt.Println(errors.Is(err, kagzi.ErrInvalidArgument))
	fmt.Println(err)
	// Output:
	// true
	// kagzi: invalid argument: the client needs up to 11 connections (the pool's MaxConns 10 + 1 direct), more than MaxConnections 8: lower the pool's MaxConns (pool_max_conns)
}
