package kagziadmin_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kagzi/kagzi"
	kagziadmin "github.com/kagzi/kagzi/admin"
	"github.com/kagzi/kagzi/admin/adminpb"
	"github.com/kagzi/kagzi/internal/testdb"
)

// quietLogger keeps test output for failures: set KAGZI_TEST_LOG=1 to see logs.
func quietLogger() *slog.Logger {
	if os.Getenv("KAGZI_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

const (
	nsA   = "team-a"
	nsB   = "team-b"
	token = "s3cret-admin-token"
	// tokenB may read team-b only.
	tokenB = "team-b-token"
)

type greetIn struct {
	Name string `json:"name"`
}

// Greet records two steps: "compose", and "flaky", whose first attempt fails.
var Greet = kagzi.Define("greet", func(ctx *kagzi.Context, in greetIn) (string, error) {
	msg, err := kagzi.Step(ctx, "compose", func(context.Context) (string, error) { return "hello " + in.Name, nil })
	if err != nil {
		return "", err
	}
	runID := ctx.RunID()
	return kagzi.Step(ctx, "flaky", func(context.Context) (string, error) {
		if _, failedBefore := flakySeen.LoadOrStore(runID, true); !failedBefore {
			return "", &kagzi.Error{Code: "FLAKY", Message: "try again"}
		}
		return msg + "!", nil
	}, kagzi.WithRetry(kagzi.Linear(3, 10*time.Millisecond)))
})

// flakySeen remembers the runs whose flaky step failed once already.
var flakySeen sync.Map

// Boom fails for good.
var Boom = kagzi.Define("boom", func(ctx *kagzi.Context, _ struct{}) (string, error) {
	return kagzi.Step(ctx, "explode", func(context.Context) (string, error) {
		return "", &kagzi.Error{Code: "KABOOM", Message: "it exploded", NonRetryable: true}
	})
})

// fixture is one database with runs, steps, workers and schedules in two namespaces,
// and an admin server over it on 127.0.0.1.
type fixture struct {
	pool    *pgxpool.Pool
	a, b    *kagzi.Client
	greets  []string // run ids of completed greet runs in team-a, oldest first
	failed  string   // run id of the failed boom run in team-a
	pending string   // run id of a PENDING run of an unregistered type in team-a
	cancel  string   // run id of a CANCELLED run in team-a
	bRun    string   // run id of the only run in team-b
	worker  string   // id of team-a's (stopped, OFFLINE) worker
	addr    string
}

func newClient(t *testing.T, pool *pgxpool.Pool, ns string) *kagzi.Client {
	t.Helper()
	c, err := kagzi.NewClient(pool, kagzi.Config{Namespace: ns, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newFixture fills a fresh database through the public API and serves it with opts
// (default: every namespace, bearer tokens token and tokenB).
func newFixture(t *testing.T, opts ...kagziadmin.Option) *fixture {
	t.Helper()
	t.Parallel()
	ctx := testCtx(t)
	pool, _ := testdb.NewPool(t)
	f := &fixture{pool: pool, a: newClient(t, pool, nsA), b: newClient(t, pool, nsB)}

	w, err := kagzi.NewWorker(f.a, kagzi.WorkerConfig{
		ID: "worker-a", LeaseDuration: time.Second, HeartbeatInterval: 250 * time.Millisecond,
		PollInterval: 500 * time.Millisecond, DrainTimeout: 2 * time.Second, DisableScheduler: true,
		Labels: map[string]string{"region": "test"},
	}, Greet, Boom)
	if err != nil {
		t.Fatal(err)
	}
	f.worker = w.ID()
	wctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()

	for _, name := range []string{"ada", "bob", "cy", "dee", "eve"} {
		run, err := kagzi.Start(ctx, f.a, Greet, greetIn{Name: name}, kagzi.WithID("greet-"+name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := run.Wait(ctx); err != nil {
			t.Fatalf("greet %s: %v", name, err)
		}
		f.greets = append(f.greets, run.RunID)
	}
	boom, err := kagzi.Start(ctx, f.a, Boom, struct{}{}, kagzi.WithID("boom-1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := boom.Wait(ctx); !errors.Is(err, kagzi.ErrWorkflowFailed) {
		t.Fatalf("boom: %v, want a failed run", err)
	}
	f.failed = boom.RunID
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	later, err := f.a.StartByName(ctx, "later", map[string]int{"n": 1}, kagzi.WithID("later-1"))
	if err != nil {
		t.Fatal(err)
	}
	f.pending = later.RunID
	cancelled, err := f.a.StartByName(ctx, "later", map[string]int{"n": 2}, kagzi.WithDelay(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.a.Cancel(ctx, cancelled.RunID); err != nil {
		t.Fatal(err)
	}
	f.cancel = cancelled.RunID
	bRun, err := f.b.StartByName(ctx, "greet", greetIn{Name: "b"}, kagzi.WithID("b-only"))
	if err != nil {
		t.Fatal(err)
	}
	f.bRun = bRun.RunID

	for _, sc := range []kagzi.Schedule{
		{ID: "daily-report", WorkflowType: "greet", Cron: "0 6 * * *", Input: greetIn{Name: "report"}, MaxCatchup: 3},
		{ID: "hourly-sync", WorkflowType: "later", Cron: "0 * * * *", Overlap: kagzi.OverlapSkip, Paused: true},
	} {
		if _, err := f.a.CreateSchedule(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.b.CreateSchedule(ctx, kagzi.Schedule{ID: "b-schedule", WorkflowType: "greet", Cron: "*/5 * * * *"}); err != nil {
		t.Fatal(err)
	}

	if len(opts) == 0 {
		opts = []kagziadmin.Option{
			kagziadmin.WithNamespaces(kagziadmin.PoolClients(pool, kagzi.Config{Logger: quietLogger()})),
			kagziadmin.WithBearerToken(token),
			kagziadmin.WithBearerToken(tokenB, nsB),
		}
	}
	f.addr = serve(t, f.a, opts...)
	return f
}

// serve runs an admin server over client on 127.0.0.1 until the test ends.
func serve(t *testing.T, client *kagzi.Client, opts ...kagziadmin.Option) string {
	t.Helper()
	srv, err := kagziadmin.NewAdminServer(client, append([]kagziadmin.Option{kagziadmin.WithLogger(quietLogger())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return lis.Addr().String()
}

// bearer sends a bearer token with every call; tests use plaintext connections.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

// dial connects a real gRPC client to addr, with a bearer token unless tok is "".
func dial(t *testing.T, addr, tok string) *grpc.ClientConn {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if tok != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(tok)))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func admin(t *testing.T, addr, tok string) adminpb.AdminServiceClient {
	return adminpb.NewAdminServiceClient(dial(t, addr, tok))
}

func wantCode(t *testing.T, err error, code codes.Code) {
	t.Helper()
	if got := status.Code(err); got != code {
		t.Fatalf("got %v (%v), want code %v", got, err, code)
	}
}
