package ui_test

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/testdb"
	"github.com/kagzi/kagzi/ui"
)

var benchRuns = flag.Int("console.runs", 1_000_000, "runs BenchmarkConsolePages fills the namespace with")

// fillRuns inserts n runs of ten workflow types into the namespace, created over the
// last 30 days, the newest 20,000 in the last hour: finished runs (96% COMPLETED, 3%
// FAILED, 1% CANCELLED) but for the newest 3,000, which are PENDING (some delayed),
// RUNNING (some past their lease) or SLEEPING. Run ids are UUIDv7 made from the
// creation time, as Start makes them.
func fillRuns(b *testing.B, pool *pgxpool.Pool, n int) {
	b.Helper()
	ctx := context.Background()
	const insert = `
WITH g AS (
	SELECT i, CASE WHEN i > $1 - 20000 THEN now() - (($1 - i) * interval '180 millisecond')
		ELSE now() - interval '1 hour' - (($1 - 20000 - i)::float8 / ($1 - 20000) * interval '30 days') END AS ts,
		md5(i::text) AS h
	FROM generate_series($2::int, $3::int) i
), r AS (
	SELECT i, ts, (lpad(to_hex((extract(epoch FROM ts) * 1000)::bigint), 12, '0') || '7' || substr(h, 1, 3) || '8'
		|| substr(h, 4, 15))::uuid AS id,
		CASE WHEN i > $1 - 3000 THEN (ARRAY['PENDING', 'PENDING', 'RUNNING', 'SLEEPING'])[1 + i % 4]
		     WHEN (i / 10) % 100 < 3 THEN 'FAILED' WHEN (i / 10) % 100 = 3 THEN 'CANCELLED' ELSE 'COMPLETED' END AS status
	FROM g
), ins AS (
	INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input, output, error, attempt,
		available_at, locked_by, lease_epoch, created_at, started_at, finished_at, updated_at, takeovers)
	SELECT id, 'default', 'wf-' || i, 'type-' || (i % 10), status, jsonb_build_object('order', i, 'sku', 'SKU-' || (i % 977)),
		CASE WHEN status = 'COMPLETED' THEN jsonb_build_object('ok', true, 'total', i % 1000) END,
		CASE WHEN status = 'FAILED' THEN jsonb_build_object('code', CASE WHEN i % 2 = 0 THEN 'STEP_ERROR' ELSE 'TIMEOUT' END,
			'message', 'upstream returned 503', 'subject', 'charge#1') END,
		1,
		CASE status WHEN 'PENDING' THEN ts + CASE WHEN i % 8 = 0 THEN interval '1 hour' ELSE interval '0' END
			WHEN 'RUNNING' THEN now() + CASE WHEN i % 40 = 2 THEN interval '-30 second' ELSE interval '10 second' END
			WHEN 'SLEEPING' THEN now() + interval '2 hour' ELSE ts END,
		CASE WHEN status = 'RUNNING' THEN 'worker-' || (i % 5) END, CASE WHEN status = 'PENDING' THEN 0 ELSE 1 END,
		ts, ts + interval '5 millisecond',
		CASE WHEN status IN ('COMPLETED', 'FAILED', 'CANCELLED') THEN ts + (i % 2000) * interval '1 millisecond' END,
		ts, CASE WHEN i % 997 = 0 THEN 1 ELSE 0 END
	FROM r
	RETURNING namespace, created_at, run_id
)
INSERT INTO kagzi.runs_created (namespace, created_at, run_id) SELECT * FROM ins`
	const batch = 100_000
	for lo := 1; lo <= n; lo += batch {
		if _, err := pool.Exec(ctx, insert, n, lo, min(lo+batch-1, n)); err != nil {
			b.Fatalf("filling runs %d..: %v", lo, err)
		}
	}
	if _, err := pool.Exec(ctx, `
		INSERT INTO kagzi.workers (namespace, worker_id, hostname, pid, version, workflow_types, max_concurrent,
			heartbeat_interval_ms, status, last_heartbeat_at)
		SELECT 'default', 'worker-' || i, 'host-' || i, 1000 + i, '0.1.0',
			ARRAY['type-0', 'type-1', 'type-2', 'type-3', 'type-4', 'type-5', 'type-6', 'type-7', 'type-8'], 50, 3600000,
			CASE WHEN i < 5 THEN 'ONLINE' ELSE 'OFFLINE' END, now()
		FROM generate_series(0, 7) i;
		INSERT INTO kagzi.console_audit (namespace, who, action, target, run_ids, run_count, outcome, finished_at)
		SELECT 'default', 'ops@example.com', 'cancel', 'run', ARRAY[gen_random_uuid()], 1, 'ok', now()
		FROM generate_series(1, 5000)`); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE kagzi.runs, kagzi.runs_created, kagzi.workers, kagzi.console_audit`); err != nil {
		b.Fatal(err)
	}
}

var benchOrder = kagzi.Define("bench-order", func(ctx *kagzi.Context, n int) (int, error) {
	for i := range 8 {
		if _, err := kagzi.Step(ctx, fmt.Sprint("step-", i), func(context.Context) (int, error) { return i, nil }); err != nil {
			return 0, err
		}
	}
	kids := make([]*kagzi.ChildRun[int], 3)
	for i := range kids {
		k, err := kagzi.StartChild(ctx, "ship", benchShip, i)
		if err != nil {
			return 0, err
		}
		kids[i] = k
	}
	for _, k := range kids {
		if _, err := k.Get(); err != nil {
			return 0, err
		}
	}
	return n, ctx.SetEvent("stage", "done")
})

var benchShip = kagzi.Define("bench-ship", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })

// BenchmarkConsolePages fills a namespace with -console.runs runs (default a million)
// and measures the server time of each page of the console: the handler's whole
// work, queries and rendering, without the network.
//
//	go test ./ui -run '^$' -bench ConsolePages -benchtime 20x
func BenchmarkConsolePages(b *testing.B) {
	ctx := context.Background()
	pool, _ := testdb.NewPool(b)
	began := time.Now()
	fillRuns(b, pool, *benchRuns)
	b.Logf("filled %d runs in %v", *benchRuns, time.Since(began).Round(time.Second))
	client, err := kagzi.NewClient(pool, kagzi.Config{Logger: quiet()})
	if err != nil {
		b.Fatal(err)
	}
	w, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, benchOrder, benchShip)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() { stop(); <-done }()
	order, err := kagzi.Start(ctx, client, benchOrder, 1)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := order.Wait(ctx); err != nil {
		b.Fatal(err)
	}
	for i := range 20 {
		if _, err := client.CreateSchedule(ctx, kagzi.Schedule{ID: fmt.Sprint("report-", i), WorkflowType: "type-1",
			Cron: "*/15 * * * *", TimeZone: "Europe/Berlin"}); err != nil {
			b.Fatal(err)
		}
	}
	h := ui.Handler(client, ui.Options{Actions: true, Authorize: allowAll, Logger: quiet()})
	get := func(path string) string {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/"+path, nil))
		if rec.Code != 200 {
			b.Fatalf("GET %s: %d\n%s", path, rec.Code, rec.Body.String())
		}
		return rec.Body.String()
	}
	next := regexp.MustCompile(`id="next-page" href="n/default/runs\?([^"]+)"`).FindStringSubmatch(get("n/default/runs"))
	pages := []struct{ name, path string }{
		{"overview", "n/default/"},
		{"runs", "n/default/runs"},
		{"runs_page2", "n/default/runs?" + htmlUnescape(next[1])},
		{"runs_failed", "n/default/runs?status=FAILED"},
		{"runs_type", "n/default/runs?type=type-3"},
		{"runs_type_failed_week", "n/default/runs?type=type-3&status=FAILED&created_after=" +
			time.Now().Add(-7*24*time.Hour).UTC().Format("2006-01-02T15:04")},
		{"runs_workflow_id", "n/default/runs?workflow_id=wf-123456"},
		{"runs_pending", "n/default/runs?status=PENDING"},
		{"run", "n/default/runs/" + order.RunID},
		{"workers", "n/default/workers"},
		{"schedules", "n/default/schedules"},
		{"schedule", "n/default/schedules/report-3"},
		{"audit", "n/default/audit"},
		{"bulk_confirm_failed_type", "n/default/bulk?action=rerun&type=type-3&status=FAILED"},
		{"bulk_confirm_pending_type", "n/default/bulk?action=cancel&type=type-3&status=PENDING"},
		{"runs_no_match", "n/default/runs?type=no-such-type"},
	}
	for _, p := range pages {
		get(p.path) // warm the connection and the plan cache
		b.Run(p.name, func(b *testing.B) {
			for b.Loop() {
				get(p.path)
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/page")
		})
	}
}

func htmlUnescape(s string) string { return regexp.MustCompile(`&amp;`).ReplaceAllString(s, "&") }
