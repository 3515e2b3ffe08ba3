package kagzi_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/testdb"
)

// answerCutter forwards connections to a PostgreSQL server. Once armed, the first
// request that carries its marker is delivered to the server, which runs and commits
// it, and the connection is cut before the answer reaches the client: the client
// sees a lost connection for a write that committed. With atCommit, the cut waits for
// the connection's next request that commits (the marker's statement ran in a
// transaction): the commit's answer is lost.
type answerCutter struct {
	ln       net.Listener
	target   string
	markers  [][]byte // a request carrying all of them
	atCommit bool
	armed    atomic.Bool
	skip     atomic.Int32 // armed, the cutter lets this many marked requests pass first
	cuts     atomic.Int32
	wg       sync.WaitGroup
}

func newAnswerCutter(t *testing.T, target string, markers ...string) *answerCutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &answerCutter{ln: ln, target: target}
	for _, m := range markers {
		p.markers = append(p.markers, []byte(m))
	}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.wg.Wait()
	})
	return p
}

// readyIdle is PostgreSQL's ReadyForQuery message outside a transaction block.
var readyIdle = []byte{'Z', 0, 0, 0, 5, 'I'}

// marked reports whether b carries all of the cutter's markers.
func (p *answerCutter) marked(b []byte) bool {
	for _, m := range p.markers {
		if !bytes.Contains(b, m) {
			return false
		}
	}
	return true
}

func (p *answerCutter) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.wg.Add(2)
		var cut atomic.Bool // this connection's next answer is to be lost
		marked := false     // the marker went by; the cut waits for the commit
		go func() {         // client to server
			defer p.wg.Done()
			defer s.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if p.armed.Load() && p.marked(buf[:n]) && p.skip.Add(-1) < 0 && p.armed.CompareAndSwap(true, false) {
						if p.atCommit {
							marked = true
						} else {
							cut.Store(true)
						}
					} else if marked && bytes.Contains(bytes.ToLower(buf[:n]), []byte("commit")) {
						cut.Store(true)
					}
					if _, werr := s.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() { // server to client
			defer p.wg.Done()
			defer c.Close()
			var seen []byte // the swallowed answer's last bytes
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					if cut.Load() {
						// The answer is swallowed up to the server's ReadyForQuery
						// outside a transaction (the request ran to its end and
						// committed), and the connection cut: the client never hears it.
						seen = append(seen, buf[:n]...)
						if !bytes.Contains(seen, readyIdle) {
							if len(seen) > len(readyIdle) {
								seen = seen[len(seen)-len(readyIdle):]
							}
							continue
						}
						p.cuts.Add(1)
						_ = s.Close()
						return
					}
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// proxiedClient returns a client of a new database whose connections go through an
// answerCutter that cuts the answer of the first request carrying marker once armed.
func proxiedClient(t *testing.T, ctx context.Context, markers []string, hooks ...kagzi.Hooks) (*kagzi.Client,
	*pgxpool.Pool, *answerCutter) {
	t.Helper()
	_, url := testdb.NewPool(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newAnswerCutter(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))), markers...)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(proxy.ln.Addr().(*net.TCPAddr).Port)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ccfg := kagzi.Config{Logger: quietLogger()}
	if len(hooks) > 0 {
		ccfg.Hooks = hooks[0]
	}
	client, err := kagzi.NewClient(pool, ccfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	return client, pool, proxy
}

// longLeaseWorker is fastWorker with a lease far longer than the tests need: a run
// whose execution gives up is taken over only after it, and a takeover shows.
func longLeaseWorker() kagzi.WorkerConfig {
	cfg := fastWorker()
	cfg.LeaseDuration = 10 * time.Second
	return cfg
}

// assertNotTakenOver fails the test when the run was claimed more than once: its
// execution gave up instead of going on.
func assertNotTakenOver(t *testing.T, ctx context.Context, pool *pgxpool.Pool, runID string) {
	t.Helper()
	if takeovers, epoch := leaseCounts(t, ctx, pool, runID); takeovers != 0 || epoch != 1 {
		t.Fatalf("the run was taken over %d times (epoch %d): its execution gave up instead of going on", takeovers,
			epoch)
	}
}

// assertCutOnce fails the test unless the cutter cut exactly one answer, what's.
func (p *answerCutter) assertCutOnce(t *testing.T, what string) {
	t.Helper()
	if n := p.cuts.Load(); n != 1 {
		t.Fatalf("%d answers cut, want 1 (%s)", n, what)
	}
}

// awaitResult waits up to 40 s for the run's result and fails the test unless it is
// want.
func awaitResult[Out comparable](t *testing.T, ctx context.Context, run *kagzi.Run[Out], want Out) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 40*time.Second)
	defer cancel()
	if out, err := run.Wait(wctx); err != nil || out != want {
		t.Fatalf("result %v, %v; want %v", out, err, want)
	}
}

// leaseCounts returns how many times the run was taken over, and its lease epoch.
func leaseCounts(t *testing.T, ctx context.Context, pool *pgxpool.Pool, runID string) (takeovers, epoch int) {
	t.Helper()
	if err := pool.QueryRow(ctx, `SELECT takeovers, lease_epoch FROM kagzi.runs WHERE run_id = $1`,
		runID).Scan(&takeovers, &epoch); err != nil {
		t.Fatal(err)
	}
	return takeovers, epoch
}

// A step's record that commits while the connection breaks before its answer comes is
// tried again, and the second try finds the step recorded, by the first: the run goes
// on from the recorded step, and completes. (The "step already recorded" answer was
// taken for a passing failure and tried again for as long as the heartbeats renewed
// the run's lease: for ever, the run RUNNING on a live worker.)
func TestAStepRecordWhoseAnswerTheConnectionLostIsNotTriedAgainForEver(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const marker = "lost-answer-3f9c1e"
	client, pool, proxy := proxiedClient(t, ctx, []string{marker})
	var first, second atomic.Int32
	wf := kagzi.Define("lost-answer", func(ctx *kagzi.Context, _ struct{}) (string, error) {
		a, err := kagzi.Step(ctx, marker, func(context.Context) (string, error) {
			first.Add(1)
			proxy.armed.Store(true) // the record of this step loses its answer
			return "a", nil
		})
		if err != nil {
			return "", err
		}
		b, err := kagzi.Step(ctx, "after", func(context.Context) (string, error) {
			second.Add(1)
			return "b", nil
		})
		return a + b, err
	})
	stop := runWorker(t, client, longLeaseWorker(), wf)
	defer stop()
	run, err := kagzi.Start(ctx, client, wf, struct{}{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 40*time.Second)
	defer wcancel()
	out, err := run.Wait(wctx)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the run did not complete in 40 s after its step's record lost its answer (%d cut)",
			proxy.cuts.Load())
	}
	if err != nil || out != "ab" {
		t.Fatalf("result %q, %v; want \"ab\"", out, err)
	}
	proxy.assertCutOnce(t, "the step's record")
	assertNotTakenOver(t, ctx, pool, run.RunID)
	if first.Load() != 1 || second.Load() != 1 {
		t.Fatalf("step bodies ran %d and %d times, want once each", first.Load(), second.Load())
	}
}

// A signal taken by a try whose answer the connection lost is the one the run
// receives, and the next pending signal of the name stays for the next wait: tried
// again, the take took the second signal and recorded nothing of it (a signal lost),
// and the run slept waiting for a signal it had already received.
func TestASignalTakeWhoseAnswerTheConnectionLostLosesNoSignal(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const marker = "lost-signal-7a2d40"
	client, pool, proxy := proxiedClient(t, ctx, []string{marker})
	wf := kagzi.Define("lost-signal", func(ctx *kagzi.Context, _ struct{}) (int, error) {
		a, err := kagzi.WaitSignal[int](ctx, marker, 0)
		if err != nil {
			return 0, err
		}
		b, err := kagzi.WaitSignal[int](ctx, marker, 0)
		return 10*a + b, err
	})
	run, err := kagzi.Start(ctx, client, wf, struct{}{})
	if err != nil {
		t.Fatal(err)
	}
	// Both signals wait before the run is claimed; the first take's answer is lost.
	for _, v := range []int{1, 2} {
		if err := client.Signal(ctx, run.RunID, marker, v); err != nil {
			t.Fatal(err)
		}
	}
	proxy.armed.Store(true)
	stop := runWorker(t, client, longLeaseWorker(), wf)
	defer stop()
	wctx, wcancel := context.WithTimeout(ctx, 40*time.Second)
	defer wcancel()
	out, err := run.Wait(wctx)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the run did not complete in 40 s after its signal take lost its answer (%d cut)", proxy.cuts.Load())
	}
	if err != nil || out != 12 {
		t.Fatalf("result %d, %v; want 12 (the signals 1 then 2)", out, err)
	}
	proxy.assertCutOnce(t, "the signal take")
	assertNotTakenOver(t, ctx, pool, run.RunID)
}

// outcomeHooks records the outcome of every execution that ended.
type outcomeHooks struct {
	kagzi.NopHooks
	mu        sync.Mutex
	outcomes  []kagzi.ExecutionOutcome
	continued []string // ContinuedAsRunID of each
}

func (h *outcomeHooks) ExecutionEnd(_ context.Context, e *kagzi.ExecutionEvent) {
	h.mu.Lock()
	h.outcomes = append(h.outcomes, e.Outcome)
	h.continued = append(h.continued, e.ContinuedAsRunID)
	h.mu.Unlock()
}

// A run's end that committed while the connection lost its answer is the execution's
// own: the next try, refused (the run is not RUNNING any more), finds the run ended
// under the execution's claim, and the end is reported COMPLETED, not as a lease lost
// to another worker (which kagziotel's counts of ended runs and the worker's own
// missed).
func TestARunEndWhoseAnswerTheConnectionLostIsReportedAsItsEnd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const marker = "lost-end-58b2e1"
	hooks := &outcomeHooks{}
	client, pool, proxy := proxiedClient(t, ctx, []string{marker}, hooks)
	wf := kagzi.Define("lost-end", func(ctx *kagzi.Context, _ struct{}) (string, error) {
		if _, err := kagzi.Step(ctx, "last", func(context.Context) (int, error) {
			proxy.armed.Store(true) // the run's end, which carries the output, loses its answer
			return 1, nil
		}); err != nil {
			return "", err
		}
		return marker, nil
	})
	stop := runWorker(t, client, longLeaseWorker(), wf)
	run, err := kagzi.Start(ctx, client, wf, struct{}{})
	if err != nil {
		t.Fatal(err)
	}
	awaitResult(t, ctx, run, marker)
	stop()
	proxy.assertCutOnce(t, "the run's end")
	assertNotTakenOver(t, ctx, pool, run.RunID)
	hooks.mu.Lock()
	defer hooks.mu.Unlock()
	if len(hooks.outcomes) != 1 || hooks.outcomes[0] != kagzi.OutcomeCompleted {
		t.Fatalf("executions ended %v, want one COMPLETED", hooks.outcomes)
	}
}

// A continue-as-new that committed while the connection lost its answer is the
// execution's own: its next run is reported (ExecutionEvent.ContinuedAsRunID, which
// kagziotel counts as a run started) and the execution COMPLETED, not a lease lost.
func TestAContinueAsNewWhoseAnswerTheConnectionLostIsReportedAsItsEnd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const marker = "lost-continue-c41d07"
	hooks := &outcomeHooks{}
	client, pool, proxy := proxiedClient(t, ctx, []string{marker}, hooks)
	proxy.atCommit = true // the continue is a transaction: its commit's answer is lost
	wf := kagzi.Define("lost-continue", func(ctx *kagzi.Context, in string) (string, error) {
		if in != "" {
			return in, nil
		}
		if _, err := kagzi.Step(ctx, "first", func(context.Context) (int, error) {
			proxy.armed.Store(true) // the continue, which carries the next input, loses its answer
			return 1, nil
		}); err != nil {
			return "", err
		}
		return "", kagzi.ContinueAsNew(ctx, marker)
	})
	stop := runWorker(t, client, longLeaseWorker(), wf)
	run, err := kagzi.Start(ctx, client, wf, "")
	if err != nil {
		t.Fatal(err)
	}
	awaitResult(t, ctx, run, marker)
	stop()
	proxy.assertCutOnce(t, "the continue")
	assertNotTakenOver(t, ctx, pool, run.RunID)
	var next string
	if err := pool.QueryRow(ctx, `SELECT continued_as_run_id::text FROM kagzi.runs WHERE run_id = $1`,
		run.RunID).Scan(&next); err != nil {
		t.Fatal(err)
	}
	hooks.mu.Lock()
	defer hooks.mu.Unlock()
	// The two executions' ends are reported in either order.
	continuing := 0
	for i, o := range hooks.outcomes {
		if o != kagzi.OutcomeCompleted || (hooks.continued[i] != "" && hooks.continued[i] != next) {
			continuing = -1
			break
		}
		if hooks.continued[i] == next {
			continuing++
		}
	}
	if len(hooks.outcomes) != 2 || continuing != 1 {
		t.Fatalf("executions ended %v continuing as %q, want two COMPLETED, one continuing as %s", hooks.outcomes,
			hooks.continued, next)
	}
}

// A claim that committed while the connection lost its answer leased its run to a
// worker that does not know it holds it: the worker hands the run back before its next
// claim, and the run runs at once, without a takeover. It waited for its lease to
// pass, and was counted taken over (a run whose claims kept losing their answers
// failed with RECOVERY_EXHAUSTED without ever running).
func TestARunWhoseClaimLostItsAnswerIsHandedBackWithoutATakeover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const typ, workerID = "lost-claim-0e6a93", "lost-claim-worker-0e6a93"
	// The claim carries the worker's id and its types; nothing else does both.
	client, pool, proxy := proxiedClient(t, ctx, []string{typ, workerID})
	var ran atomic.Int32
	wf := kagzi.Define(typ, func(ctx *kagzi.Context, _ struct{}) (string, error) {
		ran.Add(1)
		return "ran", nil
	})
	cfg := longLeaseWorker()
	cfg.ID, cfg.DisableEagerStart = workerID, true
	run, err := kagzi.Start(ctx, client, wf, struct{}{})
	if err != nil {
		t.Fatal(err)
	}
	// The worker's registration passes, and its first claim, which takes the run,
	// loses its answer.
	proxy.skip.Store(1)
	proxy.armed.Store(true)
	stop := runWorker(t, client, cfg, wf)
	defer stop()
	wctx, wcancel := context.WithTimeout(ctx, 40*time.Second)
	defer wcancel()
	if out, err := run.Wait(wctx); err != nil || out != "ran" {
		t.Fatalf("result %q, %v; want \"ran\"", out, err)
	}
	proxy.assertCutOnce(t, "the claim")
	if takeovers, _ := leaseCounts(t, ctx, pool, run.RunID); takeovers != 0 || ran.Load() != 1 {
		t.Fatalf("the run was taken over %d times and ran %d times; want handed back (no takeover), run once",
			takeovers, ran.Load())
	}
}

// An eager start (its run inserted claimed by a worker of the process) that committed
// while the connection lost its answer: the worker hands the run back, and a start of
// the id again (the documented answer to ErrUnavailable) gets the run, which runs at
// once, without a takeover.
func TestAnEagerStartThatLostItsAnswerIsHandedBackWithoutATakeover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const input = "lost-eager-start-9d14b2" // carried by the start alone
	client, pool, proxy := proxiedClient(t, ctx, []string{input})
	wf := kagzi.Define("lost-eager", func(ctx *kagzi.Context, in string) (string, error) { return in, nil })
	stop := runWorker(t, client, longLeaseWorker(), wf)
	defer stop()
	// A first run makes sure the worker runs and takes eager starts.
	warm, err := kagzi.Start(ctx, client, wf, "warm")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := warm.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	proxy.armed.Store(true)
	// IDReuseNever: the run, handed back at once, may have completed before the
	// start again, which then returns it rather than start the id anew.
	_, err = kagzi.Start(ctx, client, wf, input, kagzi.WithID("lost-eager-1"), kagzi.WithIDReuse(kagzi.IDReuseNever))
	var unavailable *kagzi.UnavailableError
	if !errors.As(err, &unavailable) || !unavailable.MayHaveCommitted {
		t.Fatalf("a start whose answer was lost: %v, want an *UnavailableError that may have committed", err)
	}
	run, err := kagzi.Start(ctx, client, wf, input, kagzi.WithID("lost-eager-1"), kagzi.WithIDReuse(kagzi.IDReuseNever))
	if err != nil || !run.AlreadyExists {
		t.Fatalf("the start again: %+v, %v; want the run the first one committed", run, err)
	}
	awaitResult(t, ctx, run, input)
	if takeovers, _ := leaseCounts(t, ctx, pool, run.RunID); takeovers != 0 {
		t.Fatalf("the run was taken over %d times; want handed back, no takeover", takeovers)
	}
}

// WaitEvent rides out a read that lost its connection, as Run.Wait does: it looks
// again, and returns the event once the run sets it. It returned ErrUnavailable at
// the first broken connection.
func TestWaitEventRidesOutAReadThatLostItsConnection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const key = "lost-read-5c0e77" // carried by the event's reads and its write
	client, _, proxy := proxiedClient(t, ctx, []string{key})
	wf := kagzi.Define("lost-read", func(ctx *kagzi.Context, _ struct{}) (int, error) {
		if err := ctx.Sleep("wait", 500*time.Millisecond); err != nil {
			return 0, err
		}
		return 0, ctx.SetEvent(key, 42)
	})
	stop := runWorker(t, client, longLeaseWorker(), wf)
	defer stop()
	run, err := kagzi.Start(ctx, client, wf, struct{}{})
	if err != nil {
		t.Fatal(err)
	}
	proxy.armed.Store(true) // WaitEvent's first read loses its connection
	v, err := kagzi.WaitEvent[int](ctx, client, run.RunID, key, 30*time.Second)
	if err != nil || v != 42 {
		t.Fatalf("WaitEvent: %d, %v; want 42 once the run set it", v, err)
	}
	proxy.assertCutOnce(t, "the first read")
}
