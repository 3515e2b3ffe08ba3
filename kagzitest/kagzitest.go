// Package kagzitest runs Kagzi workflows in your own tests: against a real, freshly
// migrated PostgreSQL database, with a fake clock so that sleeps, retry backoffs,
// timeouts and schedules take no time, with steps you can stub, fail or crash by
// name, and with the recorded step history to assert on.
//
//	func TestOnboardingSendsTheReminderAfterThirtyDays(t *testing.T) {
//		env := kagzitest.New(t, Onboarding)
//		env.StubStep("send-email", func(ctx context.Context, attempt int) (any, error) {
//			return "sent", nil // no mail leaves the test
//		})
//		run := kagzitest.Start(env, Onboarding, User{ID: "u1"})
//		out, err := kagzitest.Wait(env, run) // a 30-day Sleep inside: milliseconds
//		...
//		env.AssertSteps(run.RunID, "send-email#1", "wait#1", "send-email#2")
//	}
//
// # The database
//
// New creates a database of its own for the test on the server that
// KAGZI_DATABASE_URL or DATABASE_URL names (else postgres@127.0.0.1:5432), cloned
// from a template that holds Kagzi's migrated schema, and drops it when the test
// ends; tests using it can run in parallel. Options.Pool uses a pool of yours instead
// (migrated by New), in a namespace of the Env's own. When the test ends, before the
// database is dropped, the Env stops its worker and closes its client (see
// kagzi.Client.Close): no goroutine or connection of the Env outlives its test.
//
// # Time
//
// Kagzi keeps its timers in the database (a run's start, wake and retry times, a
// deadline, a debounce's maximum wait, a signal wait's timeout). While Run or Wait
// waits for a run, whenever no run of the namespace is running or claimable (by the
// Env's worker, or another worker of the namespace: one the test runs, another Env's;
// a run no worker can claim, a child another service runs or a run pinned to a
// version no worker runs, waits for no timer of the test's but its own deadline; a
// worker the test killed counts until it is seen dead: about two seconds, or three
// of its heartbeats when its client has no direct connection), the
// Env moves every such time earlier by the wait until the earliest one, as if that
// much time had passed, and moves its clock (Env.Now) on by as much: a run that
// sleeps 30 days completes in milliseconds, and timers fire in their order. A run
// that a flow-control limit (see kagzi.Client.SetLimits) holds back is not
// claimable, though its time came: held by its key's concurrency limit, it waits
// for a holder to stop, whose own times move; held by a rate limit, the time the
// window admits it again is one of the times, and the rate windows move with the
// rest. Wait follows a run that continued as new to the run that took over (see
// kagzi.ContinueAsNew). Advance moves time by hand. The Env's workers wait in
// process for nothing longer than a nanosecond (WorkerConfig.MaxInProcessSleep), so
// every sleep and backoff goes through the database, except inside branches (Go,
// Map), which wait in process in real time. Schedules fire on the Env's clock
// (WorkerConfig.Clock), and the Env's client computes their ticks on it
// (Config.ScheduleClock): Advance moves them, whenever they were created, paused,
// resumed or changed.
//
// Call the Env's methods from the test's goroutine: on a database error or a run
// that does not finish in Options.Timeout (real time), they fail the test.
package kagzitest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/store"
	"github.com/kagzi/kagzi/internal/testdb"
)

// Options configure an Env. Zero fields take the defaults given.
type Options struct {
	// Pool is the database to use; default a new database of the test's own. A pool
	// of yours is migrated, and the Env uses a namespace of its own in it.
	Pool *pgxpool.Pool
	// Namespace of the Env's client; default "default" in a database of the test's
	// own, "kagzitest-<random>" in Pool.
	Namespace string
	// Hooks are called besides the Env's own (a kagziotel.Hooks, say).
	Hooks kagzi.Hooks
	// Codec, MaxPayloadSize: as in kagzi.Config.
	Codec          kagzi.Codec
	MaxPayloadSize int
	// Logger receives Kagzi's logs; default none (set KAGZI_TEST_LOG=1 to see them on
	// standard error).
	Logger *slog.Logger
	// Worker is the configuration of the Env's worker. The Env sets ID, Clock and
	// DrainTimeout, and defaults MaxInProcessSleep to 1ns and PollInterval to 100ms.
	// The Env's worker never drains: a crash (CrashAt, Restart) and the end of the
	// test stop it at once, interrupting its runs and handing them back, whatever
	// DrainTimeout says (a DrainTimeout copied from production would make each crash
	// wait it out while the runs go on).
	Worker kagzi.WorkerConfig
	// Timeout bounds, in real time, how long Run and Wait wait for a run. Default 30s.
	Timeout time.Duration
}

// Env is a test environment: a migrated database, a client and a worker for the
// workflows given to New, and a fake clock.
type Env struct {
	// T is the test the Env belongs to.
	T testing.TB
	// Pool is the Env's database; Client its client (use it to signal, cancel, read).
	Pool   *pgxpool.Pool
	Client *kagzi.Client

	opts      Options
	workflows []kagzi.Definition
	names     map[string]bool
	// types and versions are the workflows' types, each with its version at the same
	// index: the runs the Env's worker claims (see advanceIdle).
	types, versions []string
	// offset is how far the Env's clock is ahead of the real one (nanoseconds).
	offset atomic.Int64

	mu       sync.Mutex
	stubs    map[string]func(ctx context.Context, attempt int) (any, error)
	fails    map[string]failure
	crashes  map[string]int
	calls    map[string]int
	worker   *runningWorker
	restarts int
	stopped  bool
	// restarting is held by a restart in progress.
	restarting sync.Mutex
}

type failure struct {
	times int
	err   error
}

type runningWorker struct {
	w      *kagzi.Worker
	cancel context.CancelFunc
	done   chan error
}

// New returns an Env for the test with a worker for the workflows, with the
// default Options.
func New(t testing.TB, workflows ...kagzi.Definition) *Env {
	t.Helper()
	return NewWithOptions(t, Options{}, workflows...)
}

// NewWithOptions returns an Env for the test with a worker for the workflows.
func NewWithOptions(t testing.TB, o Options, workflows ...kagzi.Definition) *Env {
	t.Helper()
	e := &Env{T: t, opts: o, workflows: workflows, names: map[string]bool{},
		stubs: map[string]func(context.Context, int) (any, error){}, fails: map[string]failure{},
		crashes: map[string]int{}, calls: map[string]int{}}
	if o.Timeout <= 0 {
		e.opts.Timeout = 30 * time.Second
	}
	if o.Logger == nil {
		e.opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		if os.Getenv("KAGZI_TEST_LOG") != "" {
			e.opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
	}
	e.Pool = o.Pool
	if e.Pool == nil {
		e.Pool, _ = testdb.NewPool(t)
	} else {
		if err := kagzi.Migrate(context.Background(), e.Pool); err != nil {
			t.Fatalf("kagzitest: migrate: %v", err)
		}
		if o.Namespace == "" {
			e.opts.Namespace = "kagzitest-" + uuid.NewString()[:8]
		}
	}
	client, err := kagzi.NewClient(e.Pool, kagzi.Config{Namespace: e.opts.Namespace, Logger: e.opts.Logger,
		MaxPayloadSize: o.MaxPayloadSize, Codec: o.Codec, Hooks: kagzi.MultiHooks(o.Hooks, envHooks{e: e}),
		ScheduleClock: e.Now})
	if err != nil {
		t.Fatalf("kagzitest: %v", err)
	}
	e.Client = client
	// Registered after the database's own cleanup, so it runs before the database is
	// dropped: the worker stops and the client's connection closes while they can.
	t.Cleanup(e.stop)
	for _, wf := range workflows {
		e.names[wf.Name()] = true
		v := ""
		if vw, ok := wf.(interface{ Version() string }); ok {
			v = vw.Version()
		}
		e.types, e.versions = append(e.types, wf.Name()), append(e.versions, v)
	}
	if len(workflows) > 0 {
		if err := e.startWorker(); err != nil {
			t.Fatalf("kagzitest: %v", err)
		}
	}
	return e
}

// Now is the Env's clock: the real time plus every advance so far. It is the simulated
// time for a test's assertions, not a time to give Kagzi: the database and workflows
// keep the real clock (the Env moves the stored times instead), so an absolute time
// for WithStartAt, WithDeadline or SleepUntil is time.Now().Add(d), not Now().Add(d).
func (e *Env) Now() time.Time { return time.Now().Add(time.Duration(e.offset.Load())) }

// Advance moves time on by d: every waiting time of the Env's unfinished runs (start,
// wake and retry times, deadlines, debounces' maximum waits, signal timeouts) and of
// its rate limits' windows comes d closer, and the Env's clock, which the scheduler
// reads, moves d ahead. Runs whose time came are claimed at once.
func (e *Env) Advance(d time.Duration) {
	e.T.Helper()
	if d <= 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.Timeout)
	defer cancel()
	if err := e.shift(ctx, d); err != nil {
		e.T.Fatalf("kagzitest: advance %v: %v", d, err)
	}
}

// shift moves the namespace's waiting times d earlier, as if d had passed, with the
// windows of its rate limits (the starts they counted leave them d sooner), in one
// statement (store.ShiftTime), and moves the Env's clock d on.
func (e *Env) shift(ctx context.Context, d time.Duration) error {
	for {
		_, err := store.ShiftTime(ctx, e.Pool, e.Client.Namespace(), d)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
			// Its updates met a worker's writes the other way round (a worker the
			// test runs itself): nothing moved; again.
			continue
		}
		if err != nil {
			return err
		}
		break
	}
	e.offset.Add(int64(d))
	return nil
}

// advanceIdle advances time to the earliest timer when no run is running or
// claimable, and reports by how much.
func (e *Env) advanceIdle(ctx context.Context) (time.Duration, error) {
	busy, next, now, err := store.IdleTimer(ctx, e.Pool, e.Client.Namespace(), e.types, e.versions)
	if err != nil || busy || next == nil || !next.After(now) {
		return 0, err
	}
	d := next.Sub(now).Truncate(time.Microsecond) + time.Microsecond
	if err := e.shift(ctx, d); err != nil {
		return 0, err
	}
	return d, nil
}

// Start starts a run of wf in the Env (see kagzi.Start). wf must be one of the
// Env's workflows.
func Start[In, Out any](e *Env, wf *kagzi.Workflow[In, Out], input In, opts ...kagzi.StartOption) *kagzi.Run[Out] {
	e.T.Helper()
	if !e.names[wf.Name()] {
		e.T.Fatalf("kagzitest: workflow %q was not given to kagzitest.New: no worker runs it", wf.Name())
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.Timeout)
	defer cancel()
	run, err := kagzi.Start(ctx, e.Client, wf, input, opts...)
	if err != nil {
		e.T.Fatalf("kagzitest: start %s: %v", wf.Name(), err)
	}
	return run
}

// Wait waits for the run to end, skipping time whenever nothing runs (see the package
// doc), and returns its output or error as Run.Wait does: a run that continued as new
// (see kagzi.ContinueAsNew) is followed to the run that took over its workflow id,
// whose time is skipped too. It fails the test when the run has not ended after
// Options.Timeout of real time, saying what it waits for.
func Wait[Out any](e *Env, run *kagzi.Run[Out]) (Out, error) {
	e.T.Helper()
	var zero Out
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.Timeout)
	defer cancel()
	runID := run.RunID // the run of the chain waited for now
	for {
		info, err := e.Client.GetRun(ctx, runID)
		switch {
		case err != nil && ctx.Err() == nil:
			e.T.Fatalf("kagzitest: run %s: %v", runID, err)
			return zero, err
		case err != nil:
			// Timed out during the read: the diagnostic below reads again.
		case info.Status == kagzi.StatusCompleted && info.ContinuedAsRunID != "":
			runID = info.ContinuedAsRunID // as Run.Wait does
			continue
		case info.Status.Terminal():
			out, err := run.Wait(ctx) // follows the chain to runID, which ended
			if ctx.Err() != nil {
				break // the read timed out
			}
			return out, err
		default:
			if _, err := e.advanceIdle(ctx); err != nil && ctx.Err() == nil {
				e.T.Fatalf("kagzitest: advance time: %v", err)
				return zero, err
			}
		}
		select {
		case <-ctx.Done():
			e.T.Fatalf("%s", e.stillWaiting(run.RunID, run.WorkflowType, runID))
			return zero, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// stillWaiting says, for the failure of a test, that the run waited for (firstID),
// or the run of its chain it waits for now (runID, when it continued as new), is
// still going after Options.Timeout, and what it waits for. It reads with a context
// of its own: the wait's has passed.
func (e *Env) stillWaiting(firstID, workflowType, runID string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s := fmt.Sprintf("kagzitest: run %s (%s)", firstID, workflowType)
	if runID != firstID {
		s += ", continued as run " + runID + ","
	}
	info, err := e.Client.GetRun(ctx, runID)
	if err != nil {
		return fmt.Sprintf("%s has not ended after %v, and cannot be read: %v", s, e.opts.Timeout, err)
	}
	s += fmt.Sprintf(" is still %s after %v; ", info.Status, e.opts.Timeout)
	return s + e.waitsFor(ctx, info, 0)
}

// waitsFor says what a run that has not ended waits for: a limit, a signal, or a
// child, and then what that child waits for (depth counts the children above).
func (e *Env) waitsFor(ctx context.Context, info *kagzi.RunInfo, depth int) string {
	if info.Hold != nil {
		return "it is " + info.Hold.String()
	}
	steps, err := e.Client.ListSteps(ctx, info.RunID)
	if err != nil {
		return err.Error()
	}
	for _, st := range steps {
		if st.Status == kagzi.StepWaiting && st.Kind != kagzi.KindChild {
			return fmt.Sprintf("it waits for a signal (step %s) that nobody sent", st.Key)
		}
	}
	if depth < 5 {
		page, err := e.Client.ListRuns(ctx, kagzi.RunFilter{ParentRunID: info.RunID,
			Statuses: []kagzi.RunStatus{kagzi.StatusPending, kagzi.StatusRunning, kagzi.StatusSleeping}})
		if err == nil && len(page.Runs) > 0 {
			child := page.Runs[0]
			if full, err := e.Client.GetRun(ctx, child.RunID); err == nil {
				child = *full
			}
			return fmt.Sprintf("it waits for its child run %s (%s), %s: %s", child.RunID, child.WorkflowType,
				child.Status, e.waitsFor(ctx, &child, depth+1))
		}
	}
	return "is a step stuck?"
}

// Run starts a run of wf and waits for its end (Start, then Wait).
func Run[In, Out any](e *Env, wf *kagzi.Workflow[In, Out], input In, opts ...kagzi.StartOption) (Out, error) {
	e.T.Helper()
	return Wait(e, Start(e, wf, input, opts...))
}

// StubStep replaces the function of every step called name, in every run of the Env:
// each attempt calls fn instead (attempt counts from 1), whose output is encoded
// with encoding/json and decoded into the step's output type, as a recorded output
// would be. An error from fn fails the attempt (the step's retry policy applies).
func (e *Env) StubStep(name string, fn func(ctx context.Context, attempt int) (any, error)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stubs[name] = fn
}

// FailStep makes the first times attempts of every step called name fail with err
// (times <= 0: every attempt), without calling the step's function; later attempts
// run it (or its stub). Use it to test retries and failure paths.
func (e *Env) FailStep(name string, times int, err error) {
	if err == nil {
		err = errors.New("kagzitest: injected failure")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.fails[name] = failure{times: times, err: err}
}

// CrashAt makes the worker crash the next time an attempt of a step called name
// begins, before the step's function runs and its timeout (WithStepTimeout) starts:
// the worker stops, its runs are handed back unfinished (the interrupted attempt is
// not recorded), and a new worker (another ID) starts and resumes them. The resumed
// run replays its completed steps and runs the step then. This is a process crash,
// except that the runs are handed back at once rather than when their lease
// expires: the crash does not wait for the worker's other runs
// (Options.Worker.DrainTimeout does not apply), it interrupts them too, and their
// interrupted attempts are not recorded either.
func (e *Env) CrashAt(name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.crashes[name]++
}

// Restart crashes the worker now (see CrashAt) and starts a new one.
func (e *Env) Restart() {
	e.T.Helper()
	e.restart()
}

// Restarts returns how many times the worker was restarted (CrashAt, Restart).
func (e *Env) Restarts() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.restarts
}

// Calls returns how many attempts of steps called name began in the Env (real,
// stubbed, failed or crashed). A replayed step does not count.
func (e *Env) Calls(name string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls[name]
}

// Steps returns the recorded steps of a run, with their attempts (Client.ListSteps).
func (e *Env) Steps(runID string) []kagzi.StepInfo {
	e.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.Timeout)
	defer cancel()
	steps, err := e.Client.ListSteps(ctx, runID)
	if err != nil {
		e.T.Fatalf("kagzitest: steps of run %s: %v", runID, err)
	}
	return steps
}

// StepKeys returns the keys of the recorded steps of a run, in the order they were
// first recorded ("fetch#1", "wait#1", ...).
func (e *Env) StepKeys(runID string) []string {
	e.T.Helper()
	var keys []string
	for _, s := range e.Steps(runID) {
		keys = append(keys, s.Key)
	}
	return keys
}

// AssertSteps fails the test unless the run's recorded steps are want, in order.
// An entry is a step key ("charge#1"), or a key and its status ("charge#1=FAILED"),
// or a key and its number of attempts ("charge#1*3"), or both ("charge#1=COMPLETED*2").
// A key ends with '#' and its occurrence, which hold no '=' or '*': so an entry's
// key ends at the first '=' or '*' after its last '#', and a step name may hold '='
// and '*' ("total=sum#1=COMPLETED").
func (e *Env) AssertSteps(runID string, want ...string) {
	e.T.Helper()
	steps := e.Steps(runID)
	got := make([]string, len(steps))
	for i, s := range steps {
		got[i] = s.Key
		if i >= len(want) {
			continue
		}
		// Report what the wanted entry asks about: the status, the attempts, or both.
		suffix := want[i][strings.LastIndexByte(want[i], '#')+1:]
		if strings.Contains(suffix, "=") {
			got[i] += "=" + string(s.Status)
		}
		if strings.Contains(suffix, "*") {
			got[i] += "*" + strconv.Itoa(len(s.Attempts))
		}
	}
	if !slices.Equal(got, want) {
		e.T.Fatalf("kagzitest: steps of run %s:\n got  %q\n want %q", runID, got, want)
	}
}

// envHooks stubs, fails and crashes steps and counts their attempts.
type envHooks struct {
	kagzi.NopHooks
	e *Env
}

func (h envHooks) StepBegin(ctx context.Context, ev *kagzi.StepEvent) context.Context {
	e := h.e
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls[ev.Name]++
	if e.crashes[ev.Name] > 0 {
		e.crashes[ev.Name]--
		// The crash happens here, before the attempt's function and its timeout
		// (WithStepTimeout) start: the worker's shutdown interrupts the run (ctx is the
		// run's), and the attempt then ends unrecorded at once. Waiting in the function
		// instead, a short timeout would pass first and record the attempt TIMED_OUT.
		e.mu.Unlock()
		go e.restart()
		<-ctx.Done()
		e.mu.Lock()
		ev.Replace = func(ctx context.Context) ([]byte, error) { return nil, ctx.Err() }
		return ctx
	}
	if f, ok := e.fails[ev.Name]; ok && (f.times <= 0 || ev.Attempt <= f.times) {
		err := f.err
		ev.Replace = func(context.Context) ([]byte, error) { return nil, err }
		return ctx
	}
	if stub := e.stubs[ev.Name]; stub != nil {
		attempt := ev.Attempt
		ev.Replace = func(ctx context.Context) ([]byte, error) {
			out, err := stub(ctx, attempt)
			if err != nil {
				return nil, err
			}
			return json.Marshal(out)
		}
	}
	return ctx
}

// startWorker starts a new worker for the Env's workflows.
func (e *Env) startWorker() error {
	cfg := e.opts.Worker
	e.mu.Lock()
	cfg.ID = "kagzitest/" + strconv.Itoa(e.restarts+1) + "/" + uuid.NewString()[:8]
	e.mu.Unlock()
	cfg.Clock = e.Now
	if cfg.MaxInProcessSleep == 0 {
		cfg.MaxInProcessSleep = time.Nanosecond
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 100 * time.Millisecond
	}
	// A crash, not a drain: the worker's stop interrupts its runs at once and hands
	// them back (see CrashAt). The shortest DrainTimeout there is; 0 is the default.
	cfg.DrainTimeout = time.Nanosecond
	w, err := kagzi.NewWorker(e.Client, cfg, e.workflows...)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rw := &runningWorker{w: w, cancel: cancel, done: make(chan error, 1)}
	go func() { rw.done <- w.Run(ctx) }()
	e.mu.Lock()
	e.worker = rw
	e.mu.Unlock()
	return nil
}

// restart stops the worker (its unfinished runs are handed back) and starts a new one.
func (e *Env) restart() {
	e.restarting.Lock()
	defer e.restarting.Unlock()
	e.mu.Lock()
	rw, stopped := e.worker, e.stopped
	e.mu.Unlock()
	if stopped || rw == nil {
		return
	}
	rw.cancel()
	<-rw.done
	e.mu.Lock()
	e.restarts++
	e.mu.Unlock()
	if err := e.startWorker(); err != nil {
		e.T.Errorf("kagzitest: restart: %v", err) // Errorf: restart may run on a worker's goroutine
	}
}

// stop stops the worker for good and closes the client, when the test ends: nothing
// of the Env's outlives its test (its client's LISTEN connection would otherwise
// linger, retrying against the dropped database).
func (e *Env) stop() {
	e.restarting.Lock()
	defer e.restarting.Unlock()
	e.mu.Lock()
	rw := e.worker
	e.stopped = true
	e.mu.Unlock()
	if rw != nil {
		rw.cancel()
		if err := <-rw.done; err != nil {
			e.T.Errorf("kagzitest: worker: %v", err)
		}
	}
	e.Client.Close()
}
