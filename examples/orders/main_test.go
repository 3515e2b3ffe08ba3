package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

// These tests need a PostgreSQL server: the one KAGZI_DATABASE_URL or DATABASE_URL
// names, else postgres@127.0.0.1:5432 (scripts/test finds or starts one). Each test
// creates a database of its own and drops it when it ends.

const confirmWait = 300 * time.Millisecond // longer than MaxInProcessSleep: the run is released

func testLogger() *slog.Logger {
	if os.Getenv("KAGZI_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// newDatabase creates an empty database for the test, dropped WITH (FORCE) when the
// test ends, and returns its URL.
func newDatabase(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	serverURL := databaseURL()
	admin, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		t.Fatalf("cannot reach PostgreSQL at %s: %v\n(set DATABASE_URL, or run the tests with scripts/test)", redact(serverURL), err)
	}
	defer admin.Close(ctx)

	b := make([]byte, 8)
	_, _ = rand.Read(b)
	name := "kagzi_orders_test_" + hex.EncodeToString(b)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, serverURL)
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
			return
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	return withDatabase(serverURL, name)
}

// withDatabase points a server URL (or key=value connection string) at another database.
func withDatabase(serverURL, name string) string {
	if u, err := url.Parse(serverURL); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		return u.String()
	}
	return serverURL + " dbname=" + name
}

func testWorkerConfig() kagzi.WorkerConfig {
	return kagzi.WorkerConfig{PollInterval: 500 * time.Millisecond, DrainTimeout: 2 * time.Second}
}

type testEnv struct {
	app  *app
	pool *pgxpool.Pool
	srv  *httptest.Server
}

// newTestEnv gives the test a migrated database, the API on an httptest server and
// a worker, all stopped when the test ends.
func newTestEnv(t *testing.T) *testEnv {
	t.Helper()
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, newDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := kagzi.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	a, err := newApp(ctx, pool, confirmWait, testLogger(), testLogger())
	if err != nil {
		t.Fatal(err)
	}
	w, err := a.newWorker(testWorkerConfig())
	if err != nil {
		t.Fatal(err)
	}
	workerCtx, stopWorker := context.WithCancel(ctx)
	workerDone := make(chan error, 1)
	go func() { workerDone <- w.Run(workerCtx) }()

	srv := httptest.NewServer(a.handler())
	// Cleanups run last-in first-out: the server closes, then the worker drains,
	// then the pool closes and the database is dropped.
	t.Cleanup(func() {
		stopWorker()
		if err := <-workerDone; err != nil {
			t.Errorf("worker.Run: %v", err)
		}
	})
	t.Cleanup(srv.Close)
	return &testEnv{app: a, pool: pool, srv: srv}
}

func postOrder(t *testing.T, baseURL, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(baseURL+"/orders", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return decodeResponse(t, resp)
}

func getOrder(t *testing.T, baseURL, orderID string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(baseURL + "/orders/" + orderID)
	if err != nil {
		t.Fatal(err)
	}
	return decodeResponse(t, resp)
}

func decodeResponse(t *testing.T, resp *http.Response) (int, map[string]any) {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s %s: status %d, body %q is not a JSON object: %v",
			resp.Request.Method, resp.Request.URL, resp.StatusCode, b, err)
	}
	return resp.StatusCode, m
}

// waitCompleted polls GET /orders/{id} until the run is COMPLETED (20 s at most).
func waitCompleted(t *testing.T, baseURL, orderID string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, m := getOrder(t, baseURL, orderID)
		if code != http.StatusOK {
			t.Fatalf("GET /orders/%s: status %d, body %v", orderID, code, m)
		}
		switch m["status"] {
		case string(kagzi.StatusCompleted):
			return m
		case string(kagzi.StatusFailed), string(kagzi.StatusCancelled):
			t.Fatalf("order %s ended %v: %v", orderID, m["status"], m["error"])
		}
		if time.Now().After(deadline) {
			t.Fatalf("order %s not COMPLETED after 20s; last status %v", orderID, m)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func countOrders(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM public.orders").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func countRuns(t *testing.T, c *kagzi.Client) int {
	t.Helper()
	page, err := c.ListRuns(context.Background(), kagzi.RunFilter{})
	if err != nil {
		t.Fatal(err)
	}
	return len(page.Runs)
}

func TestOrderIsFulfilledAndARetriedPostReturnsTheSameRun(t *testing.T) {
	e := newTestEnv(t)
	body := `{"order_id":"A-1","user_id":42,"items":["book","pen"],"total":27.5}`

	code, first := postOrder(t, e.srv.URL, body)
	if code != http.StatusAccepted || first["already_exists"] != false || first["workflow_id"] != "order-A-1" {
		t.Fatalf("first POST: status %d, body %v; want 202, a new run of workflow id order-A-1", code, first)
	}
	runID, _ := first["run_id"].(string)
	if runID == "" {
		t.Fatalf("first POST returned no run_id: %v", first)
	}

	code, second := postOrder(t, e.srv.URL, body)
	if code != http.StatusAccepted || second["already_exists"] != true || second["run_id"] != runID {
		t.Fatalf("retried POST: status %d, body %v; want 202, already_exists and run %s", code, second, runID)
	}

	done := waitCompleted(t, e.srv.URL, "A-1")
	if done["run_id"] != runID {
		t.Errorf("GET run_id = %v, want %s", done["run_id"], runID)
	}
	out, _ := done["output"].(map[string]any)
	if out["order_id"] != "A-1" || out["status"] != "shipped" {
		t.Errorf("output = %v, want order_id A-1 and status shipped", done["output"])
	}
	wantSteps := []any{"fetch-user#1 COMPLETED", "charge-card#1 COMPLETED", "wait-confirmation#1 COMPLETED",
		"create-shipment#1 COMPLETED", "send-email#1 COMPLETED"}
	if got, _ := json.Marshal(done["steps"]); !bytes.Equal(got, mustJSON(t, wantSteps)) {
		t.Errorf("steps = %s, want %s", got, mustJSON(t, wantSteps))
	}

	// The order id stays an idempotency key after the run finished.
	code, third := postOrder(t, e.srv.URL, body)
	if code != http.StatusAccepted || third["already_exists"] != true || third["run_id"] != runID {
		t.Fatalf("POST after completion: status %d, body %v; want 202, already_exists and run %s", code, third, runID)
	}
	if n := countOrders(t, e.pool); n != 1 {
		t.Errorf("%d order rows, want 1", n)
	}
	if n := countRuns(t, e.app.client); n != 1 {
		t.Errorf("%d runs, want 1", n)
	}

	// The charge ran once: its step has one attempt.
	steps, err := e.app.client.ListSteps(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		if s.Key == "charge-card#1" && len(s.Attempts) != 1 {
			t.Errorf("charge-card has %d attempts, want 1", len(s.Attempts))
		}
		if s.Key == "wait-confirmation#1" && (s.WakeAt == nil || s.WakeAt.Sub(s.CreatedAt) < confirmWait-50*time.Millisecond) {
			t.Errorf("wait-confirmation wakes at %v, created %v; want about %v later", s.WakeAt, s.CreatedAt, confirmWait)
		}
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestMalformedOrderIsRejectedWith400AndWritesNothing(t *testing.T) {
	e := newTestEnv(t)
	for name, body := range map[string]string{
		"not JSON":        `{"order_id":"A-2",`,
		"wrong type":      `{"order_id":"A-2","user_id":"42","items":["book"],"total":5}`,
		"unknown field":   `{"order_id":"A-2","user_id":42,"items":["book"],"total":5,"coupon":"X"}`,
		"two values":      `{"order_id":"A-2","user_id":42,"items":["book"],"total":5} {}`,
		"no order id":     `{"user_id":42,"items":["book"],"total":5}`,
		"bad order id":    `{"order_id":"a/b","user_id":42,"items":["book"],"total":5}`,
		"no user":         `{"order_id":"A-2","items":["book"],"total":5}`,
		"no items":        `{"order_id":"A-2","user_id":42,"items":[],"total":5}`,
		"empty body":      ``,
		"JSON but no obj": `[1,2]`,
	} {
		code, m := postOrder(t, e.srv.URL, body)
		if code != http.StatusBadRequest || m["error"] == nil {
			t.Errorf("%s: status %d, body %v; want 400 with an error", name, code, m)
		}
	}
	if n := countOrders(t, e.pool); n != 0 {
		t.Errorf("%d order rows, want 0", n)
	}
	if n := countRuns(t, e.app.client); n != 0 {
		t.Errorf("%d runs, want 0", n)
	}
}

func TestOrderTheDatabaseRejectsStartsNoRun(t *testing.T) {
	e := newTestEnv(t)
	// The run is started inside the transaction before the order row is inserted;
	// the CHECK (total > 0) fails the insert, and the rollback takes the run with it.
	code, m := postOrder(t, e.srv.URL, `{"order_id":"B-1","user_id":7,"items":["lamp"],"total":-3}`)
	if code != http.StatusUnprocessableEntity {
		t.Fatalf("status %d, body %v; want 422", code, m)
	}
	if code, m := getOrder(t, e.srv.URL, "B-1"); code != http.StatusNotFound {
		t.Errorf("GET /orders/B-1: status %d, body %v; want 404", code, m)
	}
	if _, err := e.app.client.GetRunByWorkflowID(context.Background(), "order-B-1"); !errors.Is(err, kagzi.ErrNotFound) {
		t.Errorf("GetRunByWorkflowID(order-B-1) = %v, want ErrNotFound", err)
	}
	if n := countOrders(t, e.pool); n != 0 {
		t.Errorf("%d order rows, want 0", n)
	}

	// The same order id with a valid total goes through afterwards.
	code, m = postOrder(t, e.srv.URL, `{"order_id":"B-1","user_id":7,"items":["lamp"],"total":3}`)
	if code != http.StatusAccepted || m["already_exists"] != false {
		t.Fatalf("valid POST: status %d, body %v; want 202 and a new run", code, m)
	}
	waitCompleted(t, e.srv.URL, "B-1")
}

func TestSameOrderIDWithOtherContentsConflictsAndChangesNothing(t *testing.T) {
	e := newTestEnv(t)
	code, first := postOrder(t, e.srv.URL, `{"order_id":"C-1","user_id":9,"items":["mug"],"total":12.25}`)
	if code != http.StatusAccepted {
		t.Fatalf("first POST: status %d, body %v", code, first)
	}
	for _, body := range []string{
		`{"order_id":"C-1","user_id":9,"items":["mug"],"total":99}`,
		`{"order_id":"C-1","user_id":10,"items":["mug"],"total":12.25}`,
		`{"order_id":"C-1","user_id":9,"items":["mug","spoon"],"total":12.25}`,
	} {
		if code, m := postOrder(t, e.srv.URL, body); code != http.StatusConflict {
			t.Errorf("POST %s: status %d, body %v; want 409", body, code, m)
		}
	}
	var total float64
	if err := e.pool.QueryRow(context.Background(), "SELECT total FROM public.orders WHERE order_id = 'C-1'").Scan(&total); err != nil {
		t.Fatal(err)
	}
	if total != 12.25 {
		t.Errorf("stored total = %v, want 12.25", total)
	}
	if n := countRuns(t, e.app.client); n != 1 {
		t.Errorf("%d runs, want 1", n)
	}
	waitCompleted(t, e.srv.URL, "C-1")
}

func TestUnknownOrderIsNotFound(t *testing.T) {
	e := newTestEnv(t)
	for _, id := range []string{"nope", "bad%20id"} {
		if code, m := getOrder(t, e.srv.URL, id); code != http.StatusNotFound {
			t.Errorf("GET /orders/%s: status %d, body %v; want 404", id, code, m)
		}
	}
}

func TestRunServesOrdersAndStopsWhenItsContextIsCancelled(t *testing.T) {
	t.Parallel()
	dbURL := newDatabase(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, config{
			DatabaseURL: dbURL, Addr: "127.0.0.1:0", ConfirmWait: confirmWait, Worker: testWorkerConfig(),
			Logger: testLogger(), KagziLogger: testLogger(),
			Ready: func(addr net.Addr) { ready <- addr },
		})
	}()
	var baseURL string
	select {
	case addr := <-ready:
		baseURL = "http://" + addr.String()
	case err := <-done:
		t.Fatalf("run returned before serving: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("run did not start serving within 20s")
	}

	code, m := postOrder(t, baseURL, `{"order_id":"D-1","user_id":1,"items":["tea"],"total":4}`)
	if code != http.StatusAccepted {
		t.Fatalf("POST: status %d, body %v", code, m)
	}
	waitCompleted(t, baseURL, "D-1")

	cancel() // what SIGINT/SIGTERM do through signal.NotifyContext
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run returned %v, want nil after a graceful shutdown", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return within 20s of its context being cancelled")
	}
	if _, err := http.Get(baseURL + "/orders/D-1"); err == nil {
		t.Error("the server still answers after run returned")
	}
}
