package kagzi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/kagzi/kagzi/internal/committer"
	"github.com/kagzi/kagzi/internal/gopool"
	"github.com/kagzi/kagzi/internal/notifier"
	"github.com/kagzi/kagzi/internal/store"
)

// WorkerConfig configures a Worker. Zero fields take the defaults given.
type WorkerConfig struct {
	// ID names the worker in run leases (RunInfo.LockedBy). Default
	// "hostname/pid/random", unique per Worker.
	ID string
	// MaxConcurrent is how many runs the worker executes at once. Default 10.
	MaxConcurrent int
	// LeaseDuration is how long a claim holds a run without a heartbeat. A run whose
	// worker died is claimed again once its lease passes. Default 10s.
	LeaseDuration time.Duration
	// HeartbeatInterval is how often the worker extends the leases of all its runs
	// in one statement. Default LeaseDuration/3; it must be shorter than LeaseDuration.
	HeartbeatInterval time.Duration
	// PollInterval is how often an idle worker looks for work when no notification
	// arrives (a fallback: new runs, wake times and leases normally wake it through
	// LISTEN/NOTIFY and timers). Default 5s.
	PollInterval time.Duration
	// DrainTimeout is how long Run waits, after its context is done, for running
	// workflows to finish before handing their runs back. Default 10s.
	DrainTimeout time.Duration
	// MaxInProcessSleep is the longest sleep that waits in process, holding its slot;
	// longer sleeps release the run until its wake time. Default 200ms.
	MaxInProcessSleep time.Duration
	// DisableScheduler keeps this worker out of firing cron schedules (see
	// CreateSchedule). By default every worker takes part; the database makes sure
	// each tick fires once however many do.
	DisableScheduler bool
	// Clock tells the scheduler the time. Default time.Now; tests inject their own
	// (with an injected clock the scheduler looks for due ticks every 100ms).
	Clock func() time.Time
	// DefaultRetry is the retry policy of the worker's steps and runs whose workflow
	// and step name none. Default: the library's DefaultRetry.
	DefaultRetry Retry
	// PruneInterval is how often the worker prunes finished runs past the client's
	// Retention (a few batches of 500 each time). Default 1 minute.
	PruneInterval time.Duration
	// Labels are free-form facts about the worker (region, deployment, ...) recorded
	// in the worker registry.
	Labels map[string]string
	// Logger receives the worker's logs. Default: the client's logger.
	Logger *slog.Logger
	// MaxTakeovers is how many times a run may be taken over after its worker lost
	// the lease (the process died, froze or lost its database; RunInfo.Takeovers
	// counts them). The claim that would take it over once more fails it instead,
	// without running it, with CodeRecoveryExhausted (errors.Is ErrRecoveryExhausted):
	// a run whose step kills its process (os.Exit, an out-of-memory kill, a crash in
	// cgo) would otherwise be taken over for ever. Hand-backs of a graceful shutdown
	// are not takeovers. Default DefaultMaxTakeovers; negative: no limit.
	MaxTakeovers int
}

// DefaultMaxTakeovers is WorkerConfig.MaxTakeovers when none is given.
const DefaultMaxTakeovers = 5

// Worker claims and executes runs of the workflow types it registered, in its
// client's namespace. Start it with Run.
type Worker struct {
	client   *Client
	cfg      WorkerConfig
	defs     map[string]*definition
	types    []string
	versions []string // the version of each of types
	logger   *slog.Logger

	// db batches the hot fenced writes of all the worker's runs (step records, sleeps)
	// into shared commits, and ends batches the runs' ends; see internal/committer.
	// Each sends one batch at a time. A run's end is off its run's path (the slot is
	// free once the end is queued), so ends gather while an end is in flight: sent
	// apart from step records, which runs wait for, they go out in half as many
	// statements (1-step burn-down: 3,002 → 1,631 per 60,000 runs) and steps do not
	// wait behind them. While ends keep coming (endsGatherMin or more to a batch) and
	// the worker has a backlog, the ends committer also holds each batch back until
	// endsGather after the last one.
	db   *committer.Committer
	ends *committer.Committer
	// backlog: the last claim got as many runs as it asked for (more may wait). Only
	// then does the ends committer hold batches back: runs are queueing for this
	// worker anyway, and fewer end statements leave it more room for them.
	backlog   atomic.Bool
	running   atomic.Bool
	abandoned atomic.Int64
	completed atomic.Int64
	failed    atomic.Int64
	pruned    atomic.Int64
	// lastBeat is when the last heartbeat succeeded (Unix nanoseconds; 0: none yet).
	lastBeat  atomic.Int64
	status    atomic.Value // WorkerStatus
	startedAt time.Time    // when Run began
	mu        sync.Mutex
	active    map[uuid.UUID]*execution
	// finishing counts the runs of active whose workflow function has returned and
	// whose end is being written: they no longer take a slot (see releaseSlot).
	finishing int
	// handBack holds runs whose executions stopped for the shutdown.
	handBack []store.HeldRun
	slotFree chan struct{}
	// goroutines runs the executions (set by Run; see internal/gopool).
	goroutines *gopool.Pool
}

// idleGoroutineTime is how long a worker keeps a goroutine that has no run to execute.
const idleGoroutineTime = 10 * time.Second

// NewWorker returns a worker for the given workflows. Each workflow type may be
// registered once.
func NewWorker(client *Client, cfg WorkerConfig, workflows ...Definition) (*Worker, error) {
	if client == nil {
		return nil, invalidArgument("nil client")
	}
	if len(workflows) == 0 {
		return nil, invalidArgument("a worker needs at least one workflow")
	}
	if cfg.ID == "" {
		host, _ := os.Hostname()
		cfg.ID = host + "/" + strconv.Itoa(os.Getpid()) + "/" + uuid.NewString()[:8]
	}
	if err := validName("worker id", cfg.ID); err != nil {
		return nil, err
	}
	if cfg.MaxConcurrent == 0 {
		cfg.MaxConcurrent = 10
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = 10 * time.Second
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = cfg.LeaseDuration / 3
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 5 * time.Second
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 10 * time.Second
	}
	if cfg.MaxInProcessSleep == 0 {
		cfg.MaxInProcessSleep = 200 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = client.logger
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.PruneInterval == 0 {
		cfg.PruneInterval = time.Minute
	}
	if cfg.MaxTakeovers == 0 {
		cfg.MaxTakeovers = DefaultMaxTakeovers
	}
	switch {
	case cfg.MaxConcurrent < 0:
		return nil, invalidArgument("negative MaxConcurrent %d", cfg.MaxConcurrent)
	case cfg.LeaseDuration < 100*time.Millisecond:
		return nil, invalidArgument("LeaseDuration %v is below 100ms", cfg.LeaseDuration)
	case cfg.HeartbeatInterval <= 0 || cfg.HeartbeatInterval >= cfg.LeaseDuration:
		return nil, invalidArgument("HeartbeatInterval %v must be positive and shorter than LeaseDuration %v",
			cfg.HeartbeatInterval, cfg.LeaseDuration)
	case cfg.PollInterval < 0 || cfg.DrainTimeout < 0 || cfg.MaxInProcessSleep < 0:
		return nil, invalidArgument("negative PollInterval, DrainTimeout or MaxInProcessSleep")
	case cfg.DefaultRetry.Err() != nil:
		return nil, fmt.Errorf("DefaultRetry: %w", cfg.DefaultRetry.Err())
	}
	w := &Worker{client: client, cfg: cfg, defs: map[string]*definition{},
		db: committer.New(client.pool, 256, store.Merges), ends: committer.New(client.pool, maxEndsBatch, store.Merges),
		logger: cfg.Logger.With("worker", cfg.ID, "namespace", client.ns),
		active: map[uuid.UUID]*execution{}, slotFree: make(chan struct{}, 1)}
	w.ends.GatherWhenBusy(endsGather, endsGatherMin, w.backlog.Load)
	for _, c := range []*committer.Committer{w.db, w.ends} {
		c.SetupMergedBatches(store.KeyedPlansSQL)
	}
	for _, wf := range workflows {
		if wf == nil {
			return nil, invalidArgument("nil workflow")
		}
		d := wf.definition()
		if d.err != nil {
			return nil, d.err
		}
		if w.defs[d.name] != nil {
			return nil, invalidArgument("workflow type %q registered twice", d.name)
		}
		w.defs[d.name] = d
		w.types = append(w.types, d.name)
		w.versions = append(w.versions, d.version)
	}
	return w, nil
}

// ID returns the worker's id.
func (w *Worker) ID() string { return w.cfg.ID }

// PrunedRuns returns how many finished runs this worker deleted under the client's
// Retention.
func (w *Worker) PrunedRuns() int64 { return w.pruned.Load() }

// prune deletes finished runs past the retention, a few small batches per interval,
// so that no statement holds many locks for long.
func (w *Worker) prune(ctx context.Context) {
	if w.client.retention < 0 {
		return
	}
	t := time.NewTicker(w.cfg.PruneInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var total int64
		for range 10 {
			n, err := store.PruneFinished(ctx, w.client.pool, w.client.ns, w.client.retention, 500)
			if err != nil {
				if ctx.Err() == nil {
					w.logger.Warn("kagzi: pruning finished runs failed", "error", err)
				}
				break
			}
			total += n
			if n < 500 {
				break
			}
		}
		if total > 0 {
			w.pruned.Add(total)
			w.logger.Info("kagzi: pruned finished runs", "runs", total, "retention", w.client.retention)
		}
	}
}

// AbandonedSteps returns how many step goroutines this worker abandoned because they
// ignored their timeout (see WithTimeout). They may still be running.
func (w *Worker) AbandonedSteps() int64 { return w.abandoned.Load() }

// Run claims and executes runs until ctx is done, then drains: it stops claiming,
// waits up to DrainTimeout for running workflows to finish, and hands the runs still
// going back (PENDING, claimable at once by another process; the interrupted step
// attempts do not count). It returns nil after a drain, or an error when it cannot
// start (the schema is not migrated, the worker is already running).
//
// Claims are batched to the free slots; new runs, wake times and cancels arrive by
// LISTEN/NOTIFY on one connection per process, timers wake the worker for known
// wake times, and it polls every PollInterval only as a fallback.
func (w *Worker) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return fmt.Errorf("kagzi: worker %s is already running", w.cfg.ID)
	}
	defer w.running.Store(false)
	w.startedAt = time.Now()
	// The committers outlive everything below: the drain's writes go through them.
	commitCtx, stopCommitters := context.WithCancel(context.Background())
	commitDone := make(chan struct{}, 2)
	for _, c := range []*committer.Committer{w.db, w.ends} {
		go func() {
			defer func() { commitDone <- struct{}{} }()
			c.Run(commitCtx, 1)
		}()
	}
	defer func() {
		stopCommitters()
		<-commitDone
		<-commitDone
	}()

	topics := []string{store.CancelTopic(w.client.ns)}
	for _, t := range w.types {
		topics = append(topics, store.WakeTopic(w.client.ns, t))
	}
	sub := w.client.notifier.Subscribe(topics...)
	defer sub.Close()

	// Registering tells a missing schema or a closed pool (returned) from a slow or
	// unreachable database (logged; the heartbeat registers the worker later).
	if err := w.register(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrSchemaNotMigrated) || errors.Is(err, ErrClosed) {
			return err
		}
		w.logger.Warn("kagzi: cannot register the worker yet", "error", err)
	}
	w.client.addWorker(w)
	defer w.client.removeWorker(w)

	hbCtx, stopHeartbeat := context.WithCancel(context.Background())
	hbDone := make(chan struct{}, 3)
	go func() {
		defer func() { hbDone <- struct{}{} }()
		w.heartbeat(hbCtx)
	}()
	go func() {
		defer func() { hbDone <- struct{}{} }()
		w.prune(hbCtx)
	}()
	go func() {
		defer func() { hbDone <- struct{}{} }()
		w.failOverdue(hbCtx)
	}()
	defer func() {
		stopHeartbeat()
		<-hbDone
		<-hbDone
		<-hbDone
	}()

	if !w.cfg.DisableScheduler {
		schedDone := make(chan struct{})
		schedCtx, stopScheduler := context.WithCancel(ctx)
		go func() {
			defer close(schedDone)
			w.runScheduler(schedCtx)
		}()
		defer func() {
			stopScheduler()
			<-schedDone
		}()
	}

	w.goroutines = gopool.New(idleGoroutineTime)
	defer w.goroutines.Close()
	w.logger.Info("kagzi: worker started", "types", w.types, "max_concurrent", w.cfg.MaxConcurrent)
	err := w.loop(ctx, sub)
	w.setStatus(WorkerDraining)
	w.drain()
	w.setStatus(WorkerOffline)
	w.logger.Info("kagzi: worker stopped")
	return err
}

// register records the worker in the registry, ONLINE.
func (w *Worker) register(ctx context.Context) error {
	host, _ := os.Hostname()
	w.status.Store(WorkerOnline)
	return dbError("kagzi: register worker "+w.cfg.ID, store.RegisterWorker(ctx, w.client.pool, store.WorkerRow{
		Namespace: w.client.ns, WorkerID: w.cfg.ID, Hostname: host, PID: os.Getpid(), Version: Version,
		Labels: w.cfg.Labels, WorkflowTypes: w.types, WorkflowVersions: w.versions, MaxConcurrent: w.cfg.MaxConcurrent,
		HeartbeatInterval: w.cfg.HeartbeatInterval,
	}))
}

// setStatus records the worker DRAINING or OFFLINE in the registry.
func (w *Worker) setStatus(status WorkerStatus) {
	w.status.Store(status)
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.HeartbeatInterval)
	defer cancel()
	if err := store.SetWorkerStatus(ctx, w.client.pool, w.client.ns, w.cfg.ID, status, w.beat()); err != nil {
		w.logger.Warn("kagzi: cannot record the worker's status", "status", status, "error", err)
	}
}

// beat is what the worker reports of itself in the registry.
func (w *Worker) beat() store.WorkerBeat {
	w.mu.Lock()
	active := len(w.active)
	w.mu.Unlock()
	return store.WorkerBeat{Namespace: w.client.ns, WorkerID: w.cfg.ID, ActiveRuns: active,
		Completed: w.completed.Load(), Failed: w.failed.Load()}
}

// loop claims runs until ctx is done, or the pool is closed (ErrClosed).
func (w *Worker) loop(ctx context.Context, sub *notifier.Subscription) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	claimNow := true
	// more: runs may be claimable that the last claim left (it filled every free
	// slot), or that were announced since. A freed slot claims only then: after a
	// claim that took all there was, nothing can have become claimable unannounced
	// (the timer covers what becomes claimable later).
	more := true
	backoff := 100 * time.Millisecond
	var wakeAt time.Time  // when the timer fires
	var askedAt time.Time // when NextWake was last asked
	setTimer := func(t time.Time) {
		if poll := time.Now().Add(w.cfg.PollInterval); t.IsZero() || t.After(poll) {
			t = poll
		}
		if !wakeAt.IsZero() && !t.Before(wakeAt) && wakeAt.After(time.Now()) {
			return
		}
		wakeAt = t
		timer.Reset(time.Until(t))
	}
	// A closed pool ends Run with ErrClosed; this probe notices one within a quarter
	// second even while the worker has nothing to claim.
	probe := time.NewTicker(closedPoolProbe)
	defer probe.Stop()
	for {
		if claimNow && ctx.Err() == nil {
			claimNow = false
			full, err := w.claim(ctx)
			switch {
			case err != nil:
				if ctx.Err() != nil {
					break
				}
				if errors.Is(err, ErrClosed) {
					w.logger.Error("kagzi: the pool was closed; the worker stops", "error", err)
					return err
				}
				more = true
				w.logger.Warn("kagzi: claim failed; retrying", "error", err, "retry_in", backoff)
				wakeAt = time.Time{}
				setTimer(time.Now().Add(backoff))
				backoff = min(backoff*2, 5*time.Second)
			case full:
				backoff = 100 * time.Millisecond
				more = true
				claimNow = w.freeSlots() > 0 // more work may be waiting
			case wakeAt.After(time.Now()) && !wakeAt.After(askedAt.Add(w.cfg.LeaseDuration)):
				// Fewer runs than free slots, and the timer set from the last answer
				// still waits: nothing that answer saw has become claimable, a run
				// that becomes claimable later announces its time (a start, a sleep,
				// a retry notifies), and a lease taken since expires a lease from now,
				// after the timer. Asking again would repeat the answer.
				backoff = 100 * time.Millisecond
				more = false
			default:
				// Fewer runs than free slots: ask when the next one becomes claimable.
				// (Asking in the claim's own batch costs every claim that statement, and
				// most claims under load fill their slots.)
				backoff = 100 * time.Millisecond
				more = false
				askedAt = time.Now()
				next, err := store.NextWake(ctx, w.client.pool, w.client.ns, w.types, w.versions, w.cfg.ID)
				wakeAt = time.Time{}
				if err != nil || next == nil {
					setTimer(time.Time{})
				} else {
					setTimer(*next)
				}
			}
			if claimNow {
				continue
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-probe.C:
			if w.client.poolClosed() {
				w.logger.Error("kagzi: the pool was closed; the worker stops")
				return fmt.Errorf("kagzi: worker %s: %w", w.cfg.ID, ErrClosed)
			}
		case <-timer.C:
			wakeAt = time.Time{}
			claimNow = true
		case <-w.slotFree:
			claimNow = more
		case n := <-sub.C:
			switch {
			case n.Topic == store.CancelTopic(w.client.ns):
				w.cancelRun(n.Extra)
			case n.Topic == "":
				claimNow, more = true, true
			default:
				ms, err := strconv.ParseInt(n.Extra, 10, 64)
				if err != nil || time.Until(time.UnixMilli(ms)) <= 5*time.Millisecond {
					claimNow, more = true, true
				} else {
					setTimer(time.UnixMilli(ms))
				}
			}
		}
	}
}

// closedPoolProbe is how often a worker's loop looks whether its pool was closed.
const closedPoolProbe = 250 * time.Millisecond

func (w *Worker) freeSlots() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cfg.MaxConcurrent - (len(w.active) - w.finishing)
}

// How the ends of runs are batched (see Worker.ends and releaseSlot). Measured on a
// 2-core box, 1-step burn-down of 100,000 runs with 100 slots, alternating rounds:
// at most MaxConcurrent finishing and no holding back, ~15,500-16,500 runs/s; 4×
// and 8× MaxConcurrent, ~17,700; 8× with ends held back 10 ms while busy,
// ~17,700-19,800 with 8-14% less CPU (end statements of ~40 runs became ~200).
const (
	finishingPerSlot = 8
	endsGather       = 10 * time.Millisecond
	endsGatherMin    = 16
	maxEndsBatch     = 512
)

// releaseSlot frees the slot of a run whose workflow function has returned, before
// its end is written: the next run need not wait for that commit. The run stays
// active (heartbeats keep its lease) until the write is done. At most
// finishingPerSlot × MaxConcurrent runs are finishing at once: enough for the ends
// committer to gather large batches while busy, and a bound on what a slow database
// lets pile up.
func (w *Worker) releaseSlot(x *execution) {
	w.mu.Lock()
	if x.finishing || w.finishing >= finishingPerSlot*w.cfg.MaxConcurrent {
		w.mu.Unlock()
		return
	}
	x.finishing = true
	w.finishing++
	w.mu.Unlock()
	select {
	case w.slotFree <- struct{}{}:
	default:
	}
}

// claim claims up to the free slots and starts executing what it got. full reports
// that it got as many runs as it asked for, or had no free slot (a freed slot calls
// again).
func (w *Worker) claim(ctx context.Context) (full bool, err error) {
	free := w.freeSlots()
	if free <= 0 {
		return true, nil
	}
	began := time.Now()
	// A claim that reached the database commits whatever happens to ctx afterwards, so
	// it is never abandoned half way: its runs would stay leased to a worker that
	// dropped them until the lease passed. It is bounded by the lease instead, and the
	// runs of a claim that returns after ctx ended are handed back (see drain).
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.LeaseDuration)
	claimed, err := store.ClaimRuns(cctx, w.client.pool, w.client.ns, w.types, w.versions, w.cfg.ID, w.cfg.LeaseDuration, free)
	cancel()
	w.hookClaim(ctx, free, len(claimed), began, err)
	if err != nil {
		return false, dbError("kagzi: claim", err)
	}
	if ctx.Err() != nil {
		w.mu.Lock()
		for _, run := range claimed {
			w.handBack = append(w.handBack, store.HeldRun{RunID: run.RunID, Epoch: run.LeaseEpoch})
		}
		w.mu.Unlock()
		return false, nil
	}
	now := time.Now()
	for _, run := range claimed {
		w.start(run, began, now)
	}
	w.backlog.Store(len(claimed) == free)
	return len(claimed) == free, nil
}

// start executes a claimed run on a goroutine of its own (one of w.goroutines). sent
// is when the claim was sent, claimedAt when its answer came.
func (w *Worker) start(run store.ClaimedRun, sent, claimedAt time.Time) {
	ctx, cancel := context.WithCancelCause(w.beginExecution(run))
	if run.Deadline != nil {
		// The deadline is the database's clock; the timer runs on ours.
		dctx, stop := context.WithDeadlineCause(ctx, run.Deadline.Add(claimedAt.Sub(run.DBNow)), errRunDeadline)
		cancelRun := cancel
		ctx, cancel = dctx, func(cause error) { cancelRun(cause); stop() }
	}
	x := &execution{w: w, def: w.defs[run.WorkflowType], run: run, cancel: cancel, ctx: ctx,
		dbOffset: run.DBNow.Sub(claimedAt), goroutines: w.goroutines}
	x.extendLease(sent, w.cfg.LeaseDuration)
	x.indexPositions()
	switch {
	case run.CancelRequested:
		cancel(ErrCancelled)
	case run.Deadline != nil && !run.Deadline.After(run.DBNow):
		cancel(errRunDeadline)
	case w.cfg.MaxTakeovers >= 0 && run.Takeovers > w.cfg.MaxTakeovers:
		cancel(errRecoveryExhausted)
	}
	w.mu.Lock()
	if old := w.active[run.RunID]; old != nil && old.finishing {
		// The run was claimed again (its lease ran out) while its previous execution
		// was still writing its end: that one no longer counts.
		old.finishing = false
		w.finishing--
	}
	w.active[run.RunID] = x
	w.mu.Unlock()
	x.goroutines.Go(func() { w.execute(x) })
}

// execute runs the workflow function on a goroutine of its own (so that Step and
// Sleep can unwind it) and records how it ended.
func (w *Worker) execute(x *execution) {
	defer func() {
		x.cancel(nil)
		x.takePending() // still pending here only when the lease was lost: nothing to write
		w.mu.Lock()
		if w.active[x.run.RunID] == x { // a quick wake may have claimed the run again
			delete(w.active, x.run.RunID)
			if x.finishing {
				w.finishing--
			}
		}
		w.mu.Unlock()
		select {
		case w.slotFree <- struct{}{}:
		default:
		}
	}()

	type result struct {
		out []byte
		err error
	}
	var res *result
	done := make(chan struct{})
	x.goroutines.Go(func() {
		defer close(done)
		defer func() {
			if r := recover(); r != nil {
				res = &result{err: &panicError{value: r, stack: string(debug.Stack())}}
			}
		}()
		wctx := &Context{Context: x.ctx, x: x, sc: &scope{counts: map[string]int{}}}
		// Cancelled or past its deadline before it started: do not run it at all.
		wctx.checkAlive()
		input, err := w.client.decodePayload(x.run.Input)
		if err != nil {
			res = &result{err: inputCodecError(x, err)}
			return
		}
		out, err := x.def.run(wctx, input)
		res = &result{out: out, err: err}
	})
	<-done

	reason := x.exitReason()
	if res != nil && res.err != nil && x.ctx.Err() != nil {
		// The workflow returned because its context was cancelled.
		reason = reasonFor(context.Cause(x.ctx))
	}
	switch reason {
	case exitSuspended, exitLeaseLost:
		w.endExecution(x, exitOutcome(reason), nil)
		return
	case exitShutdown:
		// A completed step whose record was held back is written before the run is
		// handed back, so the next worker does not run it again.
		if err := x.flush(); err != nil {
			x.log().Warn("kagzi: cannot record the last step before handing the run back", "error", err)
		}
		w.mu.Lock()
		w.handBack = append(w.handBack, store.HeldRun{RunID: x.run.RunID, Epoch: x.run.LeaseEpoch})
		w.mu.Unlock()
		w.endExecution(x, OutcomeHandedBack, nil)
		return
	}

	if reason == exitNone && res.err == nil && x.ctx.Err() != nil && reasonFor(context.Cause(x.ctx)) == exitDeadline {
		reason = exitDeadline // finished, but too late
	}
	if reason == exitNone && res.err == nil {
		res.out, res.err = w.client.encodeRunOutput(x, res.out)
	}
	var failure ErrorDetail // the workflow function's error, when it returned one
	if reason == exitNone && res.err != nil {
		failure = failureDetail(res.err, CodeWorkflowError, x.run.WorkflowType)
		if w.retryRun(x, res.err, &failure) {
			w.endExecution(x, OutcomeRetrying, encodeDetail(failure))
			return
		}
	}
	status, output, detail := StatusCancelled, []byte(nil), []byte(nil)
	switch reason {
	case exitDeadline:
		status, detail = StatusFailed, encodeDetail(ErrorDetail{Code: CodeDeadlineExceeded,
			NonRetryable: true, Subject: x.run.WorkflowType, Message: "the run passed its deadline"})
	case exitRecoveryExhausted:
		status, detail = StatusFailed, encodeDetail(ErrorDetail{Code: CodeRecoveryExhausted,
			NonRetryable: true, Subject: x.run.WorkflowType, Message: fmt.Sprintf(
				"the run was taken over %d times after its worker lost its lease (died, froze or lost its "+
					"database), more than MaxTakeovers (%d) allows: a step may be crashing its process",
				x.run.Takeovers, w.cfg.MaxTakeovers)})
		x.log().Error("kagzi: run failed: taken over too many times", "takeovers", x.run.Takeovers)
	case exitNonDeterministic:
		x.mu.Lock()
		status, detail = StatusFailed, encodeDetail(*x.nondeterminism)
		x.mu.Unlock()
		x.log().Error("kagzi: " + x.nondeterminism.Message)
	}
	if reason == exitNone {
		switch {
		case res.err == nil && len(res.out) > w.client.maxBytes:
			status, detail = StatusFailed, encodeDetail(ErrorDetail{Code: CodeInvalidOutput, NonRetryable: true,
				Subject: x.run.WorkflowType, Message: fmt.Sprintf("output is %d bytes, over the limit of %d",
					len(res.out), w.client.maxBytes)})
		case res.err == nil:
			status, output = StatusCompleted, res.out
		default:
			status, detail = StatusFailed, encodeDetail(failure)
		}
	}
	// The run's last step, if its record was held back, is written with the end.
	last := x.takePending()
	var final RunStatus // the status the run ended with (CANCELLED if a cancel came first)
	finish := func(status RunStatus, output, detail []byte) error {
		return x.writeNow(func(ctx context.Context) (err error) {
			final, err = store.FinishRun(ctx, w.ends, w.client.id, x.run.RunID, x.run.LeaseEpoch, status, output, detail, last)
			return err
		})
	}
	w.releaseSlot(x)
	err := finish(status, output, detail)
	if err != nil && last != nil && !errors.Is(err, errLeaseLost) {
		// The statement was rejected: tell whether the step or the run's end was at
		// fault by writing the step alone first.
		x.flushMu.Lock()
		x.pending, last = last, nil
		x.flushMu.Unlock()
		if ferr := x.flush(); ferr != nil {
			if errors.Is(ferr, errLeaseLost) {
				err = ferr
			} else {
				status, output, detail = StatusFailed, nil, encodeDetail(errorOf(ferr, CodeStepError, x.run.WorkflowType))
				err = finish(status, output, detail)
			}
		} else {
			err = finish(status, output, detail)
		}
	}
	if err != nil && !errors.Is(err, errLeaseLost) && status == StatusCompleted {
		// The database rejects the output itself (jsonb cannot hold a NUL character,
		// say): record that, or the run would be retried forever.
		x.log().Error("kagzi: the run's output cannot be recorded", "error", err)
		status = StatusFailed
		err = finish(status, nil, encodeDetail(ErrorDetail{Code: CodeInvalidOutput,
			NonRetryable: true, Subject: x.run.WorkflowType,
			Message: "the output cannot be recorded: " + err.Error()}))
	}
	if err == nil {
		// This client's waiters hear of the end from us; others' from the end's own
		// NOTIFY, when there are any (see waiters.go).
		w.client.notifier.Publish(store.DoneTopic(x.run.RunID) + "|" + string(final))
	}
	switch {
	case errors.Is(err, errLeaseLost):
		x.log().Info("kagzi: the run's lease was lost before its end was recorded; another worker takes it over")
	case err != nil:
		x.log().Error("kagzi: cannot record the end of the run", "error", err)
	case status == StatusCompleted:
		w.completed.Add(1)
	case status == StatusFailed:
		w.failed.Add(1)
	}
	w.endExecution(x, outcomeOf(status, err), detail)
}

// retryRun schedules the next attempt of a run whose workflow function failed, if its
// policy allows one, and reports whether it did. A *StepError (a step that already
// had its own attempts) and non-retryable errors fail the run at once. d is err's
// detail; a code the policy lists as non-retryable is marked so in it.
func (w *Worker) retryRun(x *execution, err error, d *ErrorDetail) bool {
	var se *StepError
	if errors.As(err, &se) {
		return false
	}
	policy := x.def.retry.or(w.cfg.DefaultRetry).or(DefaultRetry)
	delay, retry := policy.next(x.run.Attempt, d)
	if !retry {
		return false
	}
	if err := x.write(func(ctx context.Context) error {
		return store.RetryRun(ctx, w.client.pool, x.run.RunID, x.run.LeaseEpoch, encodeDetail(*d), delay)
	}); err != nil && !errors.Is(err, errLeaseLost) {
		x.log().Error("kagzi: cannot schedule the run's next attempt", "error", err)
	}
	x.log().Info("kagzi: run attempt failed; retrying", "attempt", x.run.Attempt, "retry_in", delay, "error", d.Message)
	return true
}

// cancelRun cancels the context of a run this worker executes.
func (w *Worker) cancelRun(runID string) {
	id, err := uuid.Parse(runID)
	if err != nil {
		return
	}
	w.mu.Lock()
	x := w.active[id]
	w.mu.Unlock()
	if x != nil {
		x.cancel(ErrCancelled)
	}
}

// heartbeat extends the leases of all the worker's runs and refreshes its registry
// row, one statement per beat. Runs the beat no longer holds are cancelled with
// errLeaseLost; runs whose cancel was requested are cancelled with ErrCancelled.
// When beats fail for longer than a lease, every run is given up: another worker
// may hold them by now.
func (w *Worker) heartbeat(ctx context.Context) {
	t := time.NewTicker(w.cfg.HeartbeatInterval)
	defer t.Stop()
	registered := true
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !registered { // the database was unreachable at start
			registered = w.register(ctx) == nil
		}
		w.mu.Lock()
		held := make([]store.HeldRun, 0, len(w.active))
		execs := make(map[uuid.UUID]*execution, len(w.active))
		for id, x := range w.active {
			held = append(held, store.HeldRun{RunID: id, Epoch: x.run.LeaseEpoch})
			execs[id] = x
		}
		w.mu.Unlock()
		beat := time.Now()
		bctx, cancel := context.WithTimeout(ctx, w.cfg.HeartbeatInterval)
		res, err := store.Heartbeat(bctx, w.client.pool, w.beat(), held, w.cfg.LeaseDuration)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.logger.Warn("kagzi: heartbeat failed", "error", err, "runs", len(held))
			for _, x := range execs {
				if monoNow() > x.leaseUntil.Load() {
					x.cancel(errLeaseLost)
				}
			}
			continue
		}
		w.lastBeat.Store(beat.UnixNano())
		kept := make(map[uuid.UUID]bool, len(res))
		for _, r := range res {
			kept[r.RunID] = true
			x := execs[r.RunID]
			if r.Extended {
				x.extendLease(beat, w.cfg.LeaseDuration)
			}
			if r.CancelRequested {
				x.cancel(ErrCancelled)
			}
		}
		for id, x := range execs {
			if !kept[id] {
				x.cancel(errLeaseLost)
			}
		}
	}
}

// drain waits for running workflows up to DrainTimeout, then interrupts them and
// hands their runs back.
func (w *Worker) drain() {
	deadline := time.NewTimer(w.cfg.DrainTimeout)
	defer deadline.Stop()
	interrupted := false
	var grace <-chan time.Time
	for {
		w.mu.Lock()
		n := len(w.active)
		w.mu.Unlock()
		if n == 0 {
			break
		}
		select {
		case <-w.slotFree:
			continue
		case <-time.After(50 * time.Millisecond):
			continue
		case <-deadline.C:
			w.logger.Info("kagzi: drain timeout; handing runs back", "runs", n)
			w.mu.Lock()
			for _, x := range w.active {
				x.cancel(errShutdown)
			}
			w.mu.Unlock()
			interrupted = true
			grace = time.After(time.Second)
			continue
		case <-grace:
		}
		break // steps that ignore their context: hand their runs back anyway
	}
	w.mu.Lock()
	held := w.handBack
	w.handBack = nil
	if interrupted {
		for id, x := range w.active {
			held = append(held, store.HeldRun{RunID: id, Epoch: x.run.LeaseEpoch})
		}
	}
	w.mu.Unlock()
	if len(held) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.LeaseDuration)
	defer cancel()
	if err := store.ReleaseRuns(ctx, w.client.pool, held); err != nil {
		w.logger.Warn("kagzi: could not hand runs back; they are claimed again when their lease passes",
			"error", err, "runs", len(held))
	}
}
