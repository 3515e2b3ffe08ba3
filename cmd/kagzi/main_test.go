package main_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/admin/adminpb"
	"github.com/kagzi/kagzi/internal/testdb"
)

// binary is the kagzi command, built once for the package's tests.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kagzi-cli-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "kagzi")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// result is what a run of the command produced.
type result struct {
	stdout, stderr string
	code           int
}

// kagziCmd runs the built command with KAGZI_DATABASE_URL set to dbURL ("" for none).
func kagziCmd(t *testing.T, dbURL string, args ...string) result {
	t.Helper()
	return kagziCmdEnv(t, dbURL, nil, args...)
}

// kagziCmdEnv is kagziCmd with more environment variables ("NAME=value").
func kagziCmdEnv(t *testing.T, dbURL string, extraEnv []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(env(dbURL), extraEnv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("kagzi %v: %v", args, err)
	}
	return r
}

// env is the test's environment without database or namespace settings, plus dbURL.
func env(dbURL string) []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "DATABASE_URL", "KAGZI_DATABASE_URL", "KAGZI_NAMESPACE", "KAGZI_ADMIN_TOKEN", "KAGZI_UI_TOKEN":
			continue
		}
		out = append(out, kv)
	}
	if dbURL != "" {
		out = append(out, "KAGZI_DATABASE_URL="+dbURL)
	}
	return out
}

// ok runs the command and fails the test unless it exits 0.
func ok(t *testing.T, dbURL string, args ...string) string {
	t.Helper()
	r := kagziCmd(t, dbURL, args...)
	if r.code != 0 {
		t.Fatalf("kagzi %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

func decode[T any](t *testing.T, out string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	return v
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

type greetIn struct {
	Name string `json:"name"`
}

var flakySeen sync.Map

// Greet records "compose", and "flaky", whose first attempt fails.
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

// Boom fails for good.
var Boom = kagzi.Define("boom", func(ctx *kagzi.Context, _ struct{}) (string, error) {
	return kagzi.Step(ctx, "explode", func(context.Context) (string, error) {
		return "", &kagzi.Error{Code: "KABOOM", Message: "it exploded", NonRetryable: true}
	})
})

type fixture struct {
	url     string
	pool    *pgxpool.Pool
	client  *kagzi.Client
	greets  []string // completed, oldest first
	failed  string
	pending string // PENDING run of a type no worker registered
	other   string // a run in namespace "other"
}

// newFixture fills a fresh database through the public API, in namespace "default"
// (and one run in "other").
func newFixture(t *testing.T) *fixture {
	t.Helper()
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, url := testdb.NewPool(t)
	client, err := kagzi.NewClient(pool, kagzi.Config{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{url: url, pool: pool, client: client}
	w, err := kagzi.NewWorker(client, kagzi.WorkerConfig{ID: "worker-1", DisableScheduler: true,
		Labels: map[string]string{"region": "eu"}, DrainTimeout: 2 * time.Second}, Greet, Boom)
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	t.Cleanup(func() { stop(); <-done })
	for _, name := range []string{"ada", "bob", "cy"} {
		run, err := kagzi.Start(ctx, client, Greet, greetIn{Name: name}, kagzi.WithID("greet-"+name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := run.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		f.greets = append(f.greets, run.RunID)
	}
	boom, err := kagzi.Start(ctx, client, Boom, struct{}{}, kagzi.WithID("boom-1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := boom.Wait(ctx); !errors.Is(err, kagzi.ErrWorkflowFailed) {
		t.Fatalf("boom: %v", err)
	}
	f.failed = boom.RunID
	later, err := client.StartByName(ctx, "later", map[string]int{"n": 1}, kagzi.WithID("later-1"))
	if err != nil {
		t.Fatal(err)
	}
	f.pending = later.RunID
	other, err := kagzi.NewClient(pool, kagzi.Config{Namespace: "other", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	o, err := other.StartByName(ctx, "greet", greetIn{Name: "o"})
	if err != nil {
		t.Fatal(err)
	}
	f.other = o.RunID
	return f
}

func TestMigrateUpMigratesAnEmptyDatabaseAndStatusReportsIt(t *testing.T) {
	t.Parallel()
	url := testdb.NewEmpty(t)
	if out := ok(t, url, "migrate", "status"); !strings.Contains(out, "schema not migrated") {
		t.Fatalf("status before: %q", out)
	}
	if out := ok(t, url, "migrate", "up"); !regexp.MustCompile(`migrated schema from version 0 to \d+`).MatchString(out) {
		t.Fatalf("migrate up: %q", out)
	}
	if out := ok(t, url, "migrate"); !strings.Contains(out, "already current") {
		t.Fatalf("second migrate: %q", out)
	}
	st := decode[map[string]any](t, ok(t, url, "migrate", "status", "--json"))
	if st["current"] != true || st["schema_version"] != st["latest_schema_version"] {
		t.Fatalf("status --json: %v", st)
	}
}

func TestRunsListPrintsATableAndJSONWithFiltersAndPages(t *testing.T) {
	f := newFixture(t)
	out := ok(t, f.url, "runs", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 6 || !regexp.MustCompile(`^RUN ID\s+WORKFLOW ID\s+TYPE\s+STATUS\s+ATTEMPT\s+CREATED\s+FINISHED\s+ERROR$`).MatchString(lines[0]) {
		t.Fatalf("table:\n%s", out)
	}
	if !regexp.MustCompile(f.pending + `\s+later-1\s+later\s+PENDING\s+0\s`).MatchString(lines[1]) {
		t.Fatalf("newest row is not the pending run:\n%s", out)
	}
	if !regexp.MustCompile(f.failed + `\s+boom-1\s+boom\s+FAILED\s.*KABOOM: `).MatchString(lines[2]) {
		t.Fatalf("failed run row:\n%s", out)
	}
	if strings.Contains(out, f.other) {
		t.Fatalf("namespace default lists a run of namespace other:\n%s", out)
	}

	type runsJSON struct {
		Runs []struct {
			RunID      string          `json:"run_id"`
			WorkflowID string          `json:"workflow_id"`
			Status     string          `json:"status"`
			Output     json.RawMessage `json:"output"`
			Error      *struct {
				Code string `json:"code"`
			} `json:"error"`
		} `json:"runs"`
		NextPageToken string `json:"next_page_token"`
	}
	failed := decode[runsJSON](t, ok(t, f.url, "runs", "list", "--status", "failed", "--json"))
	// Flags may come before the subcommand too.
	if before := decode[runsJSON](t, ok(t, f.url, "runs", "--status", "failed", "--json", "list")); !reflect.DeepEqual(before, failed) {
		t.Fatalf("runs --status failed --json list: %+v, want %+v", before, failed)
	}
	if len(failed.Runs) != 1 || failed.Runs[0].RunID != f.failed || failed.Runs[0].Error == nil ||
		failed.Runs[0].Error.Code != "KABOOM" {
		t.Fatalf("--status failed --json: %+v", failed)
	}
	greets := decode[runsJSON](t, ok(t, f.url, "runs", "list", "--workflow-type", "greet", "--json", "--payloads"))
	if len(greets.Runs) != 3 || string(greets.Runs[0].Output) != `"hello cy!"` {
		t.Fatalf("--type greet --payloads: %+v", greets)
	}
	greets = decode[runsJSON](t, ok(t, f.url, "runs", "list", "--workflow-type", "greet", "--json"))
	if len(greets.Runs) != 3 || greets.Runs[0].Output != nil {
		t.Fatalf("--type greet without --payloads: %+v", greets)
	}

	// Pages: two runs, then the rest with the token printed on stderr.
	r := kagziCmd(t, f.url, "runs", "list", "--limit", "2")
	m := regexp.MustCompile(`--page-token (\S+)`).FindStringSubmatch(r.stderr)
	if r.code != 0 || m == nil || strings.Count(strings.TrimSpace(r.stdout), "\n") != 2 {
		t.Fatalf("--limit 2: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	page2 := decode[runsJSON](t, ok(t, f.url, "runs", "list", "--limit", "2", "--page-token", m[1], "--json"))
	if len(page2.Runs) != 2 || page2.Runs[0].RunID != f.greets[2] || page2.NextPageToken == "" {
		t.Fatalf("page 2: %+v", page2)
	}
	all := decode[runsJSON](t, ok(t, f.url, "runs", "list", "--limit", "2", "--all", "--json"))
	if len(all.Runs) != 5 || all.NextPageToken != "" {
		t.Fatalf("--all: %d runs, token %q", len(all.Runs), all.NextPageToken)
	}
	other := decode[runsJSON](t, ok(t, f.url, "-n", "other", "runs", "list", "--json"))
	if len(other.Runs) != 1 || other.Runs[0].RunID != f.other {
		t.Fatalf("-n other: %+v", other)
	}
}

func TestRunsShowPrintsTheStepTimelineWithAttemptsAndErrors(t *testing.T) {
	f := newFixture(t)
	out := ok(t, f.url, "runs", "show", f.greets[0])
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`Run:\s+` + f.greets[0]),
		regexp.MustCompile(`Workflow ID:\s+greet-ada`),
		regexp.MustCompile(`Status:\s+COMPLETED`),
		regexp.MustCompile(`Output:\s+"hello ada!"`),
		regexp.MustCompile(`Steps \(2\):`),
		regexp.MustCompile(`compose#1\s+STEP\s+COMPLETED\s+\d{4}-\d\d-\d\d `),
		regexp.MustCompile(`flaky#1\s+STEP\s+COMPLETED`),
		regexp.MustCompile(`attempt 1\s+FAILED\s+\S+ \S+\s+\S+\s+FLAKY: try again`),
		regexp.MustCompile(`attempt 2\s+COMPLETED`),
	} {
		if !want.MatchString(out) {
			t.Fatalf("runs show lacks %s:\n%s", want, out)
		}
	}
	if strings.Index(out, "compose#1") > strings.Index(out, "flaky#1") {
		t.Fatalf("steps out of order:\n%s", out)
	}

	failed := ok(t, f.url, "runs", "show", "--workflow-id", "boom-1")
	if !regexp.MustCompile(`Status:\s+FAILED`).MatchString(failed) {
		t.Fatalf("runs show of the failed run:\n%s", failed)
	}
	for _, want := range []string{"Error:", "KABOOM in explode#1", "explode#1",
		"attempt 1", "KABOOM: ", "(non-retryable)"} {
		if !strings.Contains(failed, want) {
			t.Fatalf("runs show of the failed run lacks %q:\n%s", want, failed)
		}
	}

	type showJSON struct {
		Run struct {
			RunID  string `json:"run_id"`
			Status string `json:"status"`
		} `json:"run"`
		Steps []struct {
			Key      string `json:"key"`
			Status   string `json:"status"`
			Attempts []struct {
				Number int    `json:"number"`
				Status string `json:"status"`
				Error  *struct {
					Code    string `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			} `json:"attempts"`
		} `json:"steps"`
	}
	js := decode[showJSON](t, ok(t, f.url, "runs", "show", f.greets[1], "--json"))
	if js.Run.RunID != f.greets[1] || js.Run.Status != "COMPLETED" || len(js.Steps) != 2 ||
		js.Steps[1].Key != "flaky#1" || len(js.Steps[1].Attempts) != 2 ||
		js.Steps[1].Attempts[0].Status != "FAILED" || js.Steps[1].Attempts[0].Error.Message != "try again" {
		t.Fatalf("runs show --json: %+v", js)
	}

	pending := ok(t, f.url, "runs", "show", f.pending)
	if !regexp.MustCompile(`Status:\s+PENDING`).MatchString(pending) || !strings.Contains(pending, "none recorded") {
		t.Fatalf("pending run:\n%s", pending)
	}
}

func TestRunsShowOfAnUnknownOrForeignRunFailsWithNotFound(t *testing.T) {
	f := newFixture(t)
	for _, id := range []string{"01890000-0000-7000-8000-000000000000", f.other} {
		r := kagziCmd(t, f.url, "runs", "show", id)
		if r.code != 1 || !strings.Contains(r.stderr, "no such run in namespace default") {
			t.Fatalf("runs show %s: exit %d, stderr %q", id, r.code, r.stderr)
		}
	}
	r := kagziCmd(t, f.url, "runs", "show", "not-a-uuid")
	if r.code != 1 || !strings.Contains(r.stderr, "not a UUID") {
		t.Fatalf("runs show not-a-uuid: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestRunsCancelCancelsAPendingRunAndRefusesAFinishedOne(t *testing.T) {
	f := newFixture(t)
	out := ok(t, f.url, "runs", "cancel", f.pending)
	if !strings.Contains(out, "run "+f.pending+" CANCELLED") {
		t.Fatalf("cancel: %q", out)
	}
	info, err := f.client.GetRun(context.Background(), f.pending)
	if err != nil || info.Status != kagzi.StatusCancelled {
		t.Fatalf("after cancel: %v, %v", info, err)
	}
	again := decode[map[string]any](t, ok(t, f.url, "runs", "cancel", f.pending, "--json"))
	if again["status"] != "CANCELLED" {
		t.Fatalf("cancelling again: %v", again)
	}
	r := kagziCmd(t, f.url, "runs", "cancel", f.greets[0])
	if r.code != 1 || !strings.Contains(r.stderr, "already finished") {
		t.Fatalf("cancel of a completed run: exit %d, %q", r.code, r.stderr)
	}
	if info, _ := f.client.GetRun(context.Background(), f.greets[0]); info.Status != kagzi.StatusCompleted {
		t.Fatalf("the completed run changed: %v", info.Status)
	}
}

func TestWorkersListShowsTheRegistry(t *testing.T) {
	f := newFixture(t)
	out := ok(t, f.url, "workers", "list")
	if !regexp.MustCompile(`(?m)^WORKER ID\s+STATUS\s+HOST\s+PID\s+VERSION\s+TYPES\s+ACTIVE\s+COMPLETED\s+FAILED\s+LAST HEARTBEAT\s+LABELS$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^worker-1\s+ONLINE\s+\S+\s+\d+\s+`+regexp.QuoteMeta(kagzi.Version)+`\s+greet,boom\s+0/10\s+\d+\s+\d+\s+.*region=eu$`).MatchString(out) {
		t.Fatalf("workers list:\n%s", out)
	}
	type workersJSON struct {
		Workers []struct {
			WorkerID       string            `json:"worker_id"`
			Status         string            `json:"status"`
			WorkflowTypes  []string          `json:"workflow_types"`
			CompletedTotal int               `json:"completed_total"`
			Labels         map[string]string `json:"labels"`
		} `json:"workers"`
	}
	js := decode[workersJSON](t, ok(t, f.url, "workers", "list", "--status", "online", "--json"))
	if len(js.Workers) != 1 || js.Workers[0].WorkerID != "worker-1" || js.Workers[0].Labels["region"] != "eu" {
		t.Fatalf("workers list --json: %+v", js)
	}
	none := decode[workersJSON](t, ok(t, f.url, "workers", "list", "--status", "OFFLINE", "--json"))
	if len(none.Workers) != 0 {
		t.Fatalf("offline workers: %+v", none)
	}
}

func TestSchedulesListShowPauseResumeAndTrigger(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.client.CreateSchedule(ctx, kagzi.Schedule{ID: "nightly", WorkflowType: "greet", Cron: "0 3 * * *",
		TimeZone: "Europe/Paris", Input: greetIn{Name: "night"}, Overlap: kagzi.OverlapSkip}); err != nil {
		t.Fatal(err)
	}
	out := ok(t, f.url, "schedules", "list")
	if !regexp.MustCompile(`(?m)^nightly\s+greet\s+0 3 \* \* \*\s+Europe/Paris\s+ACTIVE\s+SKIP\s+\d{4}-`).MatchString(out) {
		t.Fatalf("schedules list:\n%s", out)
	}
	if out := ok(t, f.url, "schedules", "pause", "nightly"); strings.TrimSpace(out) != "schedule nightly PAUSED" {
		t.Fatalf("pause: %q", out)
	}
	show := ok(t, f.url, "schedules", "show", "nightly")
	if !strings.HasPrefix(show, "Schedule:") {
		t.Fatalf("schedules show does not begin with the schedule (an empty line first?):\n%q", show)
	}
	for _, want := range []string{"Schedule:", "nightly", "State:", "PAUSED", "Next fire:", "Europe/Paris", `"night"`} {
		if !strings.Contains(show, want) {
			t.Fatalf("schedules show lacks %q:\n%s", want, show)
		}
	}
	paused := decode[struct {
		Schedules []struct {
			ScheduleID string `json:"schedule_id"`
			Paused     bool   `json:"paused"`
		} `json:"schedules"`
	}](t, ok(t, f.url, "schedules", "list", "--paused", "--json"))
	if len(paused.Schedules) != 1 || !paused.Schedules[0].Paused {
		t.Fatalf("--paused: %+v", paused)
	}
	resumed := decode[map[string]any](t, ok(t, f.url, "schedules", "resume", "nightly", "--json"))
	if resumed["paused"] != false || resumed["next_fire_at"] == nil {
		t.Fatalf("resume --json: %v", resumed)
	}
	trig := decode[map[string]string](t, ok(t, f.url, "schedules", "trigger", "nightly", "--json"))
	if trig["run_id"] == "" || !strings.HasPrefix(trig["workflow_id"], "nightly@") {
		t.Fatalf("trigger: %v", trig)
	}
	fired := ok(t, f.url, "runs", "list", "--schedule", "nightly")
	if !strings.Contains(fired, trig["run_id"]) {
		t.Fatalf("the triggered run is not listed by its schedule:\n%s", fired)
	}
	r := kagziCmd(t, f.url, "schedules", "show", "nope")
	if r.code != 1 || !strings.Contains(r.stderr, "no such schedule") {
		t.Fatalf("unknown schedule: exit %d, %q", r.code, r.stderr)
	}
}

func TestServeAdminServesTheGRPCFacadeUntilInterrupted(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "serve-admin", "--addr", "127.0.0.1:0", "--all-namespaces")
	cmd.Env = append(env(f.url), "KAGZI_ADMIN_TOKEN=cli-token")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := false
	t.Cleanup(func() {
		if !waited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	lines := bufio.NewScanner(stderr)
	addr := ""
	for addr == "" && lines.Scan() {
		if m := regexp.MustCompile(`listening on (\S+)`).FindStringSubmatch(lines.Text()); m != nil {
			addr = m[1]
		}
	}
	if addr == "" {
		t.Fatal("serve-admin printed no address")
	}
	rest := make(chan string, 1)
	go func() {
		var b strings.Builder
		for lines.Scan() {
			b.WriteString(lines.Text() + "\n")
		}
		rest <- b.String()
	}()

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := adminpb.NewAdminServiceClient(conn)
	_, err = c.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: "default"})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("without the token: %v", err)
	}
	authed := metadataCtx(ctx, "cli-token")
	list, err := c.ListWorkflows(authed, &adminpb.ListWorkflowsRequest{Namespace: "default"})
	if err != nil || len(list.Workflows) != 5 {
		t.Fatalf("ListWorkflows: %v, %v", list, err)
	}
	other, err := c.ListWorkflows(authed, &adminpb.ListWorkflowsRequest{Namespace: "other"})
	if err != nil || len(other.Workflows) != 1 || other.Workflows[0].RunId != f.other {
		t.Fatalf("ListWorkflows in other: %v, %v", other, err)
	}
	info, err := c.GetServerInfo(authed, &adminpb.GetServerInfoRequest{})
	if err != nil || info.Version != kagzi.Version {
		t.Fatalf("GetServerInfo: %v, %v", info, err)
	}

	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	tail := <-rest // read to EOF before Wait, which closes the pipe
	err = cmd.Wait()
	waited = true
	if err != nil {
		t.Fatalf("serve-admin after SIGINT: %v\n%s", err, tail)
	}
	if !strings.Contains(tail, "admin API stopped") {
		t.Fatalf("serve-admin's last words: %q", tail)
	}
}

func TestMissingDatabaseAndBadUsageAreClearErrors(t *testing.T) {
	t.Parallel()
	r := kagziCmd(t, "", "runs", "list")
	if r.code != 1 || !strings.Contains(r.stderr, "KAGZI_DATABASE_URL") {
		t.Fatalf("no database: exit %d, %q", r.code, r.stderr)
	}
	for _, args := range [][]string{{}, {"nope"}, {"runs"}, {"runs", "show"}, {"runs", "list", "--bogus"},
		{"schedules", "pause"}, {"migrate", "sideways"},
		// Flags before the command, wrong as after it (these exited 1, without the hint).
		{"--bogus", "runs", "list"}, {"-n"}, {"--limit", "5", "runs", "list"},
		// A --limit outside 1..1000 (0 was read as the default 50).
		{"runs", "list", "--limit", "0"}, {"workers", "list", "--limit", "1001"}, {"schedules", "list", "--limit", "-1"},
		// version read no flags or arguments of its own.
		{"version", "--bogus"}, {"version", "extra"}} {
		if r := kagziCmd(t, "", args...); r.code != 2 || !strings.Contains(r.stderr, "kagzi help") {
			t.Fatalf("kagzi %q: exit %d, %q", args, r.code, r.stderr)
		}
	}
	if out := ok(t, "", "help"); !strings.Contains(out, "kagzi runs show RUN_ID") {
		t.Fatalf("help: %q", out)
	}
	if out := ok(t, "", "version", "--json"); !strings.Contains(out, `"kagzi":`) {
		t.Fatalf("version --json: %q, want JSON", out)
	}
}

// metadataCtx sends a bearer token with the calls made with the returned context.
func metadataCtx(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

func TestRunsRerunAndForkStartTheRunAgainFromAStep(t *testing.T) {
	f := newFixture(t)
	out := ok(t, f.url, "runs", "rerun", f.failed)
	if !strings.Contains(out, "run "+f.failed+" rerun (attempt 2, now ") {
		t.Fatalf("rerun: %q", out)
	}
	info, err := f.client.GetRun(context.Background(), f.failed)
	if err != nil || info.Attempt != 2 { // the fixture's worker may already run it (and fail it) again
		t.Fatalf("after retry: %+v, %v", info, err)
	}
	r := kagziCmd(t, f.url, "runs", "retry", f.greets[0]) // the old name stays an alias
	if r.code != 1 || !strings.Contains(r.stderr, "only FAILED or CANCELLED") {
		t.Fatalf("rerun of a completed run: exit %d, %q", r.code, r.stderr)
	}
	fork := decode[map[string]any](t, ok(t, f.url, "runs", "fork", f.greets[0], "flaky#1", "--input", `{"name":"fork"}`, "--json"))
	forkID, _ := fork["run_id"].(string)
	// compose#1 is a copy of the origin's (same record time); flaky#1 was not copied.
	origin, err := f.client.ListSteps(context.Background(), f.greets[0])
	if err != nil {
		t.Fatal(err)
	}
	steps, err := f.client.ListSteps(context.Background(), forkID)
	if err != nil || len(steps) == 0 || steps[0].Key != "compose#1" || !steps[0].CreatedAt.Equal(origin[0].CreatedAt) {
		t.Fatalf("fork's steps: %+v, %v; want compose#1 copied from the origin", steps, err)
	}
	if len(steps) > 1 && steps[1].CreatedAt.Equal(origin[1].CreatedAt) {
		t.Fatalf("flaky#1 was copied; the fork must start at it")
	}
	if info, err := f.client.GetRun(context.Background(), forkID); err != nil || info.ForkedFromRunID != f.greets[0] ||
		string(info.Input) != `{"name": "fork"}` {
		t.Fatalf("fork: %+v, %v", info, err)
	}
	if out := ok(t, f.url, "runs", "show", forkID); !strings.Contains(out, "Forked from:") ||
		!strings.Contains(out, f.greets[0]+" (at step flaky#1)") {
		t.Fatalf("runs show of the fork does not say what it was forked from:\n%s", out)
	}
	r = kagziCmd(t, f.url, "runs", "fork", f.greets[0], "no-such-step#1")
	if r.code != 1 || !strings.Contains(r.stderr, "no step") {
		t.Fatalf("fork from a missing step: exit %d, %q", r.code, r.stderr)
	}
}

// serveAdmin starts `kagzi serve-admin args...` on the database dbURL with the extra
// environment, waits until it listens and returns the address to dial (its port on
// 127.0.0.1 when it listens on every interface) and what it printed until then. It
// is killed when the test ends.
func serveAdmin(t *testing.T, dbURL string, extraEnv []string, args ...string) (addr, printed string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, binary, append([]string{"serve-admin"}, args...)...)
	cmd.Env = append(env(dbURL), extraEnv...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := bufio.NewScanner(stderr)
	var b strings.Builder
	for lines.Scan() {
		b.WriteString(lines.Text() + "\n")
		if m := regexp.MustCompile(`listening on (\S+) `).FindStringSubmatch(lines.Text()); m != nil {
			go func() { // keep the pipe drained
				for lines.Scan() {
				}
			}()
			host, port, err := net.SplitHostPort(m[1])
			if err != nil {
				t.Fatal(err)
			}
			if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
				host = "127.0.0.1" // every interface: dial loopback
			}
			return net.JoinHostPort(host, port), b.String()
		}
	}
	t.Fatalf("kagzi serve-admin %v did not listen; it printed:\n%s", args, b.String())
	return "", ""
}

// serverInfo calls GetServerInfo at addr in plaintext, with the token if not "".
func serverInfo(t *testing.T, addr, token string) (*adminpb.GetServerInfoResponse, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if token != "" {
		ctx = metadataCtx(ctx, token)
	}
	return adminpb.NewAdminServiceClient(conn).GetServerInfo(ctx, &adminpb.GetServerInfoRequest{})
}

func TestServeAdminRefusesANonLoopbackAddressWithoutATokenOrTLS(t *testing.T) {
	t.Parallel()
	// No database is needed: the address is checked first.
	for _, addr := range []string{":50051", "0.0.0.0:50051", "[::]:50051", "192.0.2.10:50051", "example.com:50051"} {
		r := kagziCmd(t, "", "serve-admin", "--addr", addr)
		if r.code != 2 || !strings.Contains(r.stderr, "refusing to serve "+addr) ||
			!strings.Contains(r.stderr, "KAGZI_ADMIN_TOKEN") || !strings.Contains(r.stderr, "--tls-cert") ||
			!strings.Contains(r.stderr, "--insecure") || !strings.Contains(r.stderr, "kagzi help") {
			t.Fatalf("serve-admin --addr %s without a token: exit %d, %q; want a usage error naming the fixes", addr, r.code, r.stderr)
		}
	}
}

func TestServeAdminServesANonLoopbackAddressWithInsecureOrAToken(t *testing.T) {
	t.Parallel()
	url := testdb.New(t)
	addr, printed := serveAdmin(t, url, nil, "--addr", ":0", "--insecure")
	if info, err := serverInfo(t, addr, ""); err != nil || info.Version != kagzi.Version {
		t.Fatalf("--addr :0 --insecure: GetServerInfo without credentials: %v, %v", info, err)
	}
	if !strings.Contains(printed, "warning: no authentication") {
		t.Fatalf("--insecure served without the warning:\n%s", printed)
	}
	addr, _ = serveAdmin(t, url, []string{"KAGZI_ADMIN_TOKEN=edge-token"}, "--addr", ":0")
	if _, err := serverInfo(t, addr, ""); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("--addr :0 with a token, a call without it: %v, want Unauthenticated", err)
	}
	if info, err := serverInfo(t, addr, "edge-token"); err != nil || info.Version != kagzi.Version {
		t.Fatalf("--addr :0 with a token: GetServerInfo with it: %v, %v", info, err)
	}
}

func TestServeAdminServesALoopbackAddressWithoutATokenAsBefore(t *testing.T) {
	t.Parallel()
	url := testdb.New(t)
	for _, listen := range []string{"127.0.0.1:0", "localhost:0", "127.0.0.2:0"} {
		addr, printed := serveAdmin(t, url, nil, "--addr", listen)
		if info, err := serverInfo(t, addr, ""); err != nil || info.Version != kagzi.Version {
			t.Fatalf("--addr %s: GetServerInfo without credentials: %v, %v", listen, info, err)
		}
		if !strings.Contains(printed, "warning: no authentication") {
			t.Fatalf("--addr %s served without the warning:\n%s", listen, printed)
		}
	}
}

func TestLimitsSetGetListDeleteAndRunsShowTellsWhatHoldsARun(t *testing.T) {
	f := newFixture(t)
	out := ok(t, f.url, "limits", "set", "later", "--concurrency", "1", "--rate", "1", "--rate-period", "1h")
	if !regexp.MustCompile(`(?m)^later\s+1\s+-\s+1/1h0m0s\s+-\s+`).MatchString(out) {
		t.Fatalf("limits set:\n%s", out)
	}
	got := decode[kagzi.Limits](t, ok(t, f.url, "limits", "get", "later", "--json"))
	if got.Concurrency != 1 || got.Rate != 1 || got.RatePeriod != time.Hour {
		t.Fatalf("limits get --json: %+v", got)
	}
	type listJSON struct {
		Limits []kagzi.Limits `json:"limits"`
	}
	if l := decode[listJSON](t, ok(t, f.url, "limits", "list", "--json")); len(l.Limits) != 1 || l.Limits[0].WorkflowType != "later" {
		t.Fatalf("limits list --json: %+v", l)
	}
	if r := kagziCmd(t, f.url, "limits", "set", "later", "--concurrency", "-2"); r.code != 2 || !strings.Contains(r.stderr, "invalid argument") {
		t.Fatalf("limits set with a negative limit: exit %d, %q", r.code, r.stderr)
	}
	if r := kagziCmd(t, f.url, "limits", "get", "nothing"); r.code != 1 || !strings.Contains(r.stderr, "has no limits") {
		t.Fatalf("limits get of a type without limits: exit %d, %q", r.code, r.stderr)
	}
	// A run of the type, begun by a worker, fills the hour's rate window: the next one
	// shows the rate hold in runs show.
	ctx := context.Background()
	if _, err := f.pool.Exec(ctx, `SELECT kagzi.flow_rate_room('default', 'later', '', 1, 3600000),
		kagzi.flow_rate_add('default', 'later', '', 3600000, 1)`); err != nil {
		t.Fatal(err)
	}
	held, err := f.client.StartByName(ctx, "later", 2, kagzi.WithPriority(5), kagzi.WithConcurrencyKey("acme"))
	if err != nil {
		t.Fatal(err)
	}
	out = ok(t, f.url, "runs", "show", held.RunID)
	for _, want := range []string{"Priority:", "Concurrency key:", "acme", "Held:", "held by the rate limit until"} {
		if !strings.Contains(out, want) {
			t.Fatalf("runs show of a held run lacks %q:\n%s", want, out)
		}
	}
	if out := ok(t, f.url, "limits", "delete", "later"); !strings.Contains(out, "deleted") {
		t.Fatalf("limits delete: %q", out)
	}
	if r := kagziCmd(t, f.url, "limits", "delete", "later"); r.code != 1 {
		t.Fatalf("second limits delete: exit %d", r.code)
	}
}

func TestTimesPrintInUTCWhateverTheLocalZone(t *testing.T) {
	if _, err := time.LoadLocation("Asia/Kolkata"); err != nil {
		t.Skipf("no time zone database: %v", err)
	}
	f := newFixture(t)
	india := []string{"TZ=Asia/Kolkata"} // UTC+05:30
	run := func(args ...string) string {
		t.Helper()
		r := kagziCmdEnv(t, f.url, india, args...)
		if r.code != 0 {
			t.Fatalf("kagzi %s: exit %d\n%s%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
		}
		return r.stdout
	}
	utcJSON := regexp.MustCompile(`"(updated_at|until)": "\d{4}-\d\d-\d\dT[\d:.]+Z"`)
	for _, args := range [][]string{
		{"limits", "set", "later", "--rate", "1", "--rate-period", "1h", "--json"},
		{"limits", "get", "later", "--json"},
		{"limits", "list", "--json"},
	} {
		if out := run(args...); !utcJSON.MatchString(out) || strings.Contains(out, "+05:30") {
			t.Errorf("kagzi %s with TZ=Asia/Kolkata: updated_at not in UTC:\n%s", strings.Join(args, " "), out)
		}
	}
	// The hour's rate window is full: a new run of the type is held until it ends.
	ctx := context.Background()
	if _, err := f.pool.Exec(ctx, `SELECT kagzi.flow_rate_room('default', 'later', '', 1, 3600000),
		kagzi.flow_rate_add('default', 'later', '', 3600000, 1)`); err != nil {
		t.Fatal(err)
	}
	held, err := f.client.StartByName(ctx, "later", 2)
	if err != nil {
		t.Fatal(err)
	}
	js := run("runs", "show", held.RunID, "--json")
	if !regexp.MustCompile(`"until": "\d{4}-\d\d-\d\dT[\d:.]+Z"`).MatchString(js) || strings.Contains(js, "+05:30") {
		t.Errorf("runs show --json with TZ=Asia/Kolkata: hold.until not in UTC:\n%s", js)
	}
	text := run("runs", "show", held.RunID)
	if !regexp.MustCompile(`Held:\s+held by the rate limit until \d{4}-\d\d-\d\dT[\d:.]+Z`).MatchString(text) ||
		strings.Contains(text, "+05:30") {
		t.Errorf("runs show with TZ=Asia/Kolkata: the hold's time not in UTC:\n%s", text)
	}
}

func TestTableCellsAreCutBetweenCharactersNeverInsideOne(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	fits := "注文-確認-メール-送信-お客様-処理中"   // 21 characters, 53 bytes: the cell holds 40 characters
	long := strings.Repeat("注文", 30) // 60 characters
	for _, id := range []string{fits, long} {
		if _, err := f.client.StartByName(ctx, "later", 1, kagzi.WithID(id)); err != nil {
			t.Fatal(err)
		}
	}
	out := ok(t, f.url, "runs", "list", "--workflow-type", "later")
	if !utf8.ValidString(out) {
		t.Fatalf("runs list printed invalid UTF-8:\n%q", out)
	}
	if !strings.Contains(out, " "+fits+" ") {
		t.Errorf("the 21-character id %q is not printed whole:\n%s", fits, out)
	}
	if cut := string([]rune(long)[:39]) + "…"; !strings.Contains(out, " "+cut+" ") {
		t.Errorf("the 60-character id is not cut to its first 39 characters and an ellipsis %q:\n%s", cut, out)
	}
}

func TestServeAdminAcceptsATokenReadFromAFileWithItsNewline(t *testing.T) {
	t.Parallel()
	url := testdb.New(t)
	addr, _ := serveAdmin(t, url, []string{"KAGZI_ADMIN_TOKEN=from-a-file\n"}, "--addr", "127.0.0.1:0")
	if info, err := serverInfo(t, addr, "from-a-file"); err != nil || info.Version != kagzi.Version {
		t.Fatalf("KAGZI_ADMIN_TOKEN ending in a newline: GetServerInfo with the token: %v, %v", info, err)
	}
	if _, err := serverInfo(t, addr, "another"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a wrong token: %v, want Unauthenticated", err)
	}
}
