// Command orders is a small order service built on Kagzi: an HTTP API that records an
// order and starts its fulfilment workflow in one database transaction, and a worker
// in the same process that runs the workflow.
//
//	go run ./examples/orders [-addr 127.0.0.1:8080] [-confirm-wait 30s]
//
//	curl -i -X POST localhost:8080/orders \
//	    -d '{"order_id":"A-1","user_id":42,"items":["book","pen"],"total":27.5}'
//	curl -s localhost:8080/orders/A-1
//
// The workflow fetches the user, charges the card, waits durably for a confirmation
// window (-confirm-wait, or ORDERS_CONFIRM_WAIT; 30s by default), creates a shipment
// and sends an email. The external systems are fakes: nothing leaves the process.
//
// POST /orders starts the run with kagzi.StartTx inside the transaction that inserts
// the order row, so the run exists only if the order commits, and the reverse. The
// workflow id is "order-<order_id>", so a retried POST returns the run it started the
// first time instead of charging twice.
//
// PostgreSQL is the one KAGZI_DATABASE_URL or DATABASE_URL names, else
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable. The example creates
// the table public.orders there; Kagzi's own tables live in the "kagzi" schema, and
// the runs in the Kagzi namespace "orders". SIGINT or SIGTERM stop the HTTP server and
// drain the worker.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

const (
	defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	defaultConfirmWait = 30 * time.Second
	namespace          = "orders"
)

// ---------------------------------------------------------------------------
// The workflow

// OrderInput is the input of the order workflow.
type OrderInput struct {
	UserID int64    `json:"user_id"`
	Items  []string `json:"items"`
	Total  float64  `json:"total"`
}

// OrderOutput is the output of the order workflow.
type OrderOutput struct {
	OrderID string `json:"order_id"`
	Status  string `json:"status"`
}

// User, Payment and Shipment are what the fake external systems return.
type User struct {
	ID    int64  `json:"id"`
	Email string `json:"email"`
}

type Payment struct {
	TransactionID string `json:"transaction_id"`
}

type Shipment struct {
	TrackingNo string `json:"tracking_no"`
}

// workflowIDPrefix + order id is the workflow id of an order's run.
const workflowIDPrefix = "order-"

// newOrderWorkflow defines the order workflow. confirmWait is the durable sleep
// between charging and shipping; its wake time is recorded when the sleep first
// runs, so a restart with another -confirm-wait does not move a sleeping order.
func newOrderWorkflow(confirmWait time.Duration, logger *slog.Logger) *kagzi.Workflow[OrderInput, OrderOutput] {
	return kagzi.Define("order", func(ctx *kagzi.Context, in OrderInput) (OrderOutput, error) {
		// Code outside steps runs again on every resume, so it must be deterministic:
		// the order id comes from the workflow id, not from a clock or a query.
		orderID := strings.TrimPrefix(ctx.WorkflowID(), workflowIDPrefix)

		user, err := kagzi.Step(ctx, "fetch-user", func(ctx context.Context) (User, error) {
			return fetchUser(ctx, in.UserID)
		})
		if err != nil {
			return OrderOutput{}, err
		}

		// A recorded step never runs again, so a resumed or recovered run does not
		// charge twice (a step body may run twice only if the process dies while it
		// runs; the payment provider's idempotency key covers that).
		payment, err := kagzi.Step(ctx, "charge-card", func(ctx context.Context) (Payment, error) {
			return chargeCard(ctx, orderID, user, in.Total)
		}, kagzi.WithStepTimeout(2*time.Minute))
		if err != nil {
			return OrderOutput{}, err
		}

		// Longer than the worker's MaxInProcessSleep, the run is released here: it
		// holds no goroutine and no slot until a worker resumes it at its wake time.
		if err := ctx.Sleep("wait-confirmation", confirmWait); err != nil {
			return OrderOutput{}, err
		}

		shipment, err := kagzi.Step(ctx, "create-shipment", func(ctx context.Context) (Shipment, error) {
			return createShipment(ctx, orderID, in.Items)
		})
		if err != nil {
			return OrderOutput{}, err
		}

		if _, err := kagzi.Step(ctx, "send-email", func(ctx context.Context) (bool, error) {
			return sendEmail(ctx, logger, user.Email, fmt.Sprintf(
				"Order %s shipped: tracking %s, payment %s", orderID, shipment.TrackingNo, payment.TransactionID))
		}); err != nil {
			return OrderOutput{}, err
		}

		return OrderOutput{OrderID: orderID, Status: "shipped"}, nil
	})
}

// ---------------------------------------------------------------------------
// Fake external systems: deterministic, no network.

func fetchUser(ctx context.Context, userID int64) (User, error) {
	if err := pause(ctx, 20*time.Millisecond); err != nil {
		return User{}, err
	}
	return User{ID: userID, Email: fmt.Sprintf("user%d@example.com", userID)}, nil
}

func chargeCard(ctx context.Context, orderID string, user User, total float64) (Payment, error) {
	if err := pause(ctx, 50*time.Millisecond); err != nil {
		return Payment{}, err
	}
	return Payment{TransactionID: "txn_" + fakeID(orderID, user.Email, fmt.Sprint(total))}, nil
}

func createShipment(ctx context.Context, orderID string, items []string) (Shipment, error) {
	if err := pause(ctx, 30*time.Millisecond); err != nil {
		return Shipment{}, err
	}
	return Shipment{TrackingNo: "TRK" + strings.ToUpper(fakeID(append([]string{orderID}, items...)...))}, nil
}

func sendEmail(ctx context.Context, logger *slog.Logger, to, body string) (bool, error) {
	if err := pause(ctx, 10*time.Millisecond); err != nil {
		return false, err
	}
	logger.Info("email sent", "to", to, "body", body)
	return true, nil
}

// pause stands in for the latency of a remote call, and honours ctx as one would.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func fakeID(parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(sum[:6])
}

// ---------------------------------------------------------------------------
// The application: its table, the HTTP API and the worker.

// ordersTableSQL creates the application's own table. total > 0 is left to the
// database on purpose: an order it rejects rolls back the run started in the same
// transaction.
const ordersTableSQL = `CREATE TABLE IF NOT EXISTS public.orders (
	order_id   text PRIMARY KEY,
	user_id    bigint NOT NULL,
	items      text[] NOT NULL,
	total      numeric NOT NULL CONSTRAINT orders_total_positive CHECK (total > 0),
	run_id     uuid NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now()
)`

type app struct {
	pool     *pgxpool.Pool
	client   *kagzi.Client
	workflow *kagzi.Workflow[OrderInput, OrderOutput]
	logger   *slog.Logger
}

// newApp creates the orders table if needed and returns the application over pool,
// whose database must be migrated (kagzi.Migrate).
func newApp(ctx context.Context, pool *pgxpool.Pool, confirmWait time.Duration, logger, kagziLogger *slog.Logger) (*app, error) {
	if _, err := pool.Exec(ctx, ordersTableSQL); err != nil {
		return nil, fmt.Errorf("create table orders: %w", err)
	}
	client, err := kagzi.NewClient(pool, kagzi.Config{Namespace: namespace, Logger: kagziLogger})
	if err != nil {
		return nil, err
	}
	return &app{pool: pool, client: client, workflow: newOrderWorkflow(confirmWait, logger), logger: logger}, nil
}

// newWorker returns a worker for the order workflow.
func (a *app) newWorker(cfg kagzi.WorkerConfig) (*kagzi.Worker, error) {
	return kagzi.NewWorker(a.client, cfg, a.workflow)
}

// handler serves POST /orders and GET /orders/{id}.
func (a *app) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", a.createOrder)
	mux.HandleFunc("GET /orders/{id}", a.getOrder)
	return mux
}

type createOrderRequest struct {
	OrderID string   `json:"order_id"`
	UserID  int64    `json:"user_id"`
	Items   []string `json:"items"`
	Total   float64  `json:"total"`
}

type createOrderResponse struct {
	RunID         string `json:"run_id"`
	WorkflowID    string `json:"workflow_id"`
	AlreadyExists bool   `json:"already_exists"`
}

var orderIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,100}$`)

func (a *app) createOrder(w http.ResponseWriter, r *http.Request) {
	var req createOrderRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "malformed JSON body: "+err.Error())
		return
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, "malformed JSON body: more than one value")
		return
	}
	switch {
	case !orderIDPattern.MatchString(req.OrderID):
		writeError(w, http.StatusBadRequest, "order_id must be 1 to 100 letters, digits, '-' or '_'")
		return
	case req.UserID <= 0:
		writeError(w, http.StatusBadRequest, "user_id must be a positive integer")
		return
	case len(req.Items) == 0:
		writeError(w, http.StatusBadRequest, "items must not be empty")
		return
	}

	ctx := r.Context()
	tx, err := a.pool.Begin(ctx)
	if err != nil {
		a.internalError(w, "begin", err)
		return
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit

	input := OrderInput{UserID: req.UserID, Items: req.Items, Total: req.Total}
	// IDReuseNever keeps the order id an idempotency key after the run finished too:
	// a POST retried a day later still returns the first run.
	run, err := kagzi.StartTx(ctx, tx, a.client, a.workflow, input,
		kagzi.WithID(workflowIDPrefix+req.OrderID), kagzi.WithIDReuse(kagzi.IDReuseNever))
	if err != nil {
		a.internalError(w, "start workflow", err)
		return
	}

	if run.AlreadyExists {
		// A retry: the order row committed with the run. Accept it only if it asks
		// for the same order.
		var same bool
		err := tx.QueryRow(ctx, `SELECT user_id = $2 AND items = $3 AND total = $4::numeric
			FROM public.orders WHERE order_id = $1`,
			req.OrderID, req.UserID, req.Items, req.Total).Scan(&same)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && !same) {
			writeError(w, http.StatusConflict, fmt.Sprintf("order %s already exists with other contents", req.OrderID))
			return
		}
		if err != nil {
			a.internalError(w, "read order", err)
			return
		}
	} else {
		_, err := tx.Exec(ctx, `INSERT INTO public.orders (order_id, user_id, items, total, run_id)
			VALUES ($1, $2, $3, $4, $5)`, req.OrderID, req.UserID, req.Items, req.Total, run.RunID)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23514" { // check_violation
			// Returning rolls the transaction back, and the run with it.
			writeError(w, http.StatusUnprocessableEntity, "order rejected: "+pgErr.Message)
			return
		}
		if err != nil {
			a.internalError(w, "insert order", err)
			return
		}
	}

	if err := tx.Commit(ctx); err != nil {
		a.internalError(w, "commit", err)
		return
	}
	if !run.AlreadyExists {
		a.logger.Info("order accepted", "order_id", req.OrderID, "run_id", run.RunID)
	}
	w.Header().Set("Location", "/orders/"+req.OrderID)
	writeJSON(w, http.StatusAccepted, createOrderResponse{
		RunID: run.RunID, WorkflowID: run.WorkflowID, AlreadyExists: run.AlreadyExists,
	})
}

type orderStatusResponse struct {
	OrderID    string             `json:"order_id"`
	RunID      string             `json:"run_id"`
	WorkflowID string             `json:"workflow_id"`
	Status     kagzi.RunStatus    `json:"status"`
	Steps      []string           `json:"steps"`
	Output     json.RawMessage    `json:"output,omitempty"`
	Error      *kagzi.ErrorDetail `json:"error,omitempty"`
	CreatedAt  time.Time          `json:"created_at"`
	FinishedAt *time.Time         `json:"finished_at,omitempty"`
}

func (a *app) getOrder(w http.ResponseWriter, r *http.Request) {
	orderID := r.PathValue("id")
	if !orderIDPattern.MatchString(orderID) {
		writeError(w, http.StatusNotFound, "no such order")
		return
	}
	info, err := a.client.GetRunByWorkflowID(r.Context(), workflowIDPrefix+orderID)
	if errors.Is(err, kagzi.ErrNotFound) {
		writeError(w, http.StatusNotFound, "no such order")
		return
	}
	if err != nil {
		a.internalError(w, "get run", err)
		return
	}
	steps, err := a.client.ListSteps(r.Context(), info.RunID)
	if err != nil {
		a.internalError(w, "list steps", err)
		return
	}
	resp := orderStatusResponse{
		OrderID: orderID, RunID: info.RunID, WorkflowID: info.WorkflowID, Status: info.Status,
		Steps: []string{}, Output: info.Output, Error: info.Error,
		CreatedAt: info.CreatedAt, FinishedAt: info.FinishedAt,
	}
	for _, s := range steps {
		resp.Steps = append(resp.Steps, s.Key+" "+string(s.Status))
	}
	writeJSON(w, http.StatusOK, resp)
}

func (a *app) internalError(w http.ResponseWriter, what string, err error) {
	a.logger.Error("request failed", "op", what, "err", err)
	writeError(w, http.StatusInternalServerError, "internal error")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// ---------------------------------------------------------------------------
// The process

type config struct {
	DatabaseURL string
	Addr        string
	ConfirmWait time.Duration
	Worker      kagzi.WorkerConfig
	Logger      *slog.Logger // the application's logs
	KagziLogger *slog.Logger // Kagzi's logs
	// Ready, if set, is called with the server's address once it listens.
	Ready func(addr net.Addr)
}

// run serves the API and runs the worker until ctx is done, then shuts the server
// down and drains the worker.
func run(ctx context.Context, cfg config) error {
	pool, err := connect(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := kagzi.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	a, err := newApp(ctx, pool, cfg.ConfirmWait, cfg.Logger, cfg.KagziLogger)
	if err != nil {
		return err
	}
	worker, err := a.newWorker(cfg.Worker)
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: a.handler(), ReadHeaderTimeout: 10 * time.Second}
	serveDone := make(chan error, 1)
	go func() { serveDone <- srv.Serve(ln) }()

	// The worker gets a context of its own, so that on shutdown the API stops taking
	// orders first and the worker drains after.
	workerCtx, stopWorker := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWorker()
	workerDone := make(chan error, 1)
	go func() { workerDone <- worker.Run(workerCtx) }()

	cfg.Logger.Info("orders service ready", "addr", "http://"+ln.Addr().String(),
		"confirm_wait", cfg.ConfirmWait, "worker", worker.ID())
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr())
	}

	var serveErr error
	select {
	case <-ctx.Done():
		cfg.Logger.Info("shutting down")
	case serveErr = <-serveDone:
		// The server failed on its own; stop everything.
	case err := <-workerDone:
		workerDone <- err
		serveErr = fmt.Errorf("worker stopped: %w", err)
	}

	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		cfg.Logger.Warn("http shutdown", "err", err)
	}
	stopWorker()
	// Running workflows get the worker's DrainTimeout to finish; the rest go back to
	// PENDING for the next process. Sleeping orders hold nothing and just wait.
	if err := <-workerDone; err != nil && serveErr == nil {
		serveErr = fmt.Errorf("worker: %w", err)
	}
	if errors.Is(serveErr, http.ErrServerClosed) {
		serveErr = nil
	}
	cfg.Logger.Info("stopped")
	return serveErr
}

// connect opens a pool and checks that the server answers, with a hint when it does not.
func connect(ctx context.Context, dbURL string) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, dbURL)
	if err == nil {
		pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = pool.Ping(pingCtx)
		cancel()
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf(`cannot reach PostgreSQL at %s: %w

Point the example at a server with DATABASE_URL (or KAGZI_DATABASE_URL), e.g.
  DATABASE_URL='postgres://user:password@localhost:5432/dbname?sslmode=disable' go run ./examples/orders
or run scripts/quickstart once to see how a local server is found or started (scripts/pg.sh)`,
			redact(dbURL), err)
	}
	return pool, nil
}

// redact hides a password in a URL for printing.
func redact(dbURL string) string {
	if u, err := url.Parse(dbURL); err == nil && u.Scheme != "" {
		return u.Redacted()
	}
	if strings.Contains(dbURL, "password") {
		return "(connection string)"
	}
	return dbURL
}

// databaseURL is KAGZI_DATABASE_URL, else DATABASE_URL, else a local default.
func databaseURL() string {
	for _, v := range []string{"KAGZI_DATABASE_URL", "DATABASE_URL"} {
		if u := os.Getenv(v); u != "" {
			return u
		}
	}
	return defaultDatabaseURL
}

func main() {
	confirmDefault := defaultConfirmWait
	if v := os.Getenv("ORDERS_CONFIRM_WAIT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			fmt.Fprintf(os.Stderr, "orders: ORDERS_CONFIRM_WAIT=%q: %v\n", v, err)
			os.Exit(2)
		}
		confirmDefault = d
	}
	addr := flag.String("addr", "127.0.0.1:8080", "address the HTTP API listens on")
	confirmWait := flag.Duration("confirm-wait", confirmDefault,
		"durable sleep between charging and shipping (env ORDERS_CONFIRM_WAIT)")
	flag.Parse()
	if *confirmWait < 0 {
		fmt.Fprintln(os.Stderr, "orders: -confirm-wait must not be negative")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, config{
		DatabaseURL: databaseURL(),
		Addr:        *addr,
		ConfirmWait: *confirmWait,
		Logger:      slog.New(slog.NewTextHandler(os.Stderr, nil)),
		KagziLogger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}
