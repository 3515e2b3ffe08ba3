package kagzi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/kagzi/kagzi/internal/committer"
	"github.com/kagzi/kagzi/internal/gopool"
	"github.com/kagzi/kagzi/internal/schema"
	"github.com/kagzi/kagzi/internal/store"
)

// Worker claims and executes runs of the workflow types it registered, in its
// client's namespace. Make it with NewWorker and start it with Run, which refuses a
// nil or zero Worker with ErrInvalidArgument (its other methods then return their
// zero value).
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
	backlog atomic.Bool
	// registered: the worker's row is in the registry (a worker started while the
	// database was unreachable registers at a later heartbeat).
	registered atomic.Bool
	// livenessKey is the key of the worker's liveness lock in this Run (0: none).
	livenessKey int64
	// sawWork is when (UnixNano) the worker last saw work in its namespace: a run it
	// started, a notification of runs to claim, its own start. Its reaper looks for
	// dead workers less often after a HeartbeatInterval without (see IdleReapFactor).
	sawWork   atomic.Int64
	running   atomic.Bool
	abandoned atomic.Int64
	// stepGoroutines: see runtime.stepGoroutines.
	stepGoroutines atomic.Int64
	// wakeAsks counts the claim loop's answers from NextWake (tests wait for the
	// loop to have settled after a claim).
	wakeAsks  atomic.Int64
	completed atomic.Int64
	failed    atomic.Int64
	pruned    atomic.Int64
	// archived counts the runs this worker moved into the history, historyDropped
	// the history partitions it dropped.
	archived       atomic.Int64
	historyDropped atomic.Int64
	// lastBeat is when the last heartbeat succeeded (Unix nanoseconds; 0: none yet).
	lastBeat  atomic.Int64
	status    atomic.Value // WorkerStatus
	startedAt time.Time    // when Run began
	mu        sync.Mutex
	active    map[uuid.UUID]*execution
	// finishing counts the runs of active whose workflow function has returned and
	// whose end is being written: they no longer take a slot (see releaseSlot).
	finishing int
	// reserved counts the slots reserved for eager starts in flight (see eager.go),
	// and accepting tells whether the worker takes them (it claims: not draining).
	reserved  int
	accepting bool
	// finishingHolders are those of them that hold a flow-control place (a type slot,
	// a concurrency key's place): the claim does not count them against the limits.
	finishingHolders map[uuid.UUID]struct{}
	// handBack holds runs whose executions stopped for the shutdown.
	handBack []store.Fence
	// lostClaims and lostRuns are claims and eager starts that may have leased
	// runs to this worker without its knowing (see lostclaims.go).
	lostClaims []store.LostClaim
	lostRuns   []store.Fence
	// Runs alone (solo.go): held is the suspect the worker holds (in active, not
	// started yet; nil: none), soloX the execution alone (nil: none); the worker
	// drains for the held suspect until drainUntil; claimOne: its last claim, idle,
	// met a suspect, and it claims one run at a time.
	held, soloX *execution
	drainUntil  time.Time
	claimOne    bool
	// Runs claimed ahead (ahead.go): ahead are those waiting for a slot (in active),
	// in claim order; freed counts the slots freed, freedMark its value when the
	// last claim was sent, freedDuring the slots freed while the last claim ran (0
	// when it got fewer runs than it asked for); aheadShort tells that the last claim
	// took the short way (only such a claim takes runs ahead); aheadTimer that
	// aheadExpired is set to look; aheadBacks counts its hand-backs under way (the
	// drain waits for them); aheadHold is aheadHold (tests change it); limitsAt is
	// when the worker last learnt that each type's limits were set (limitsSet).
	aheadHold        time.Duration
	limitsAt         map[string]time.Time
	ahead            []*execution
	freed, freedMark int
	freedDuring      int
	aheadShort       bool
	aheadBacks       sync.WaitGroup
	aheadTimer       bool
	slotFree         chan struct{}
	// rt is what the executions need of the worker (set by Run).
	rt *runtime
	// claimer is who claims, with the worker's cursors in the concurrency-key queues
	// (used by the claim loop alone) and its floors (see floors.go).
	claimer store.Claimer
	// floors are where the claims start reading each type's runs, keyFloors each
	// type's queues of concurrency keys (floors.go).
	floors, keyFloors *store.Floors
	// wakeTypes maps the wake topic of each of the worker's types to the type.
	wakeTypes map[string]string
	// floorHit tells the claim loop that the floors' probe lowered a floor, lostDue
	// that an eager start lost its answer (its run may be to hand back).
	floorHit, lostDue chan struct{}
}

// idleGoroutineTime is how long a worker keeps a goroutine that has no run to execute.
const idleGoroutineTime = 10 * time.Second

// NewWorker returns a worker for the given workflows. Each workflow type may be
// registered once.
func NewWorker(client *Client, cfg WorkerConfig, workflows ...Definition) (*Worker, error) {
	if err := client.usable("NewWorker"); err != nil {
		return nil, err
	}
	if len(workflows) == 0 {
		return nil, invalidArgument("a worker needs at least one workflow")
	}
	if err := cfg.resolve(client); err != nil {
		return nil, err
	}
	w := &Worker{client: client, cfg: cfg, defs: map[string]*definition{},
		db: committer.New(client.pool, 256), ends: committer.New(client.pool, maxEndsBatch),
		logger: cfg.Logger.With("worker", cfg.ID, "namespace", client.ns),
		active: map[uuid.UUID]*execution{}, finishingHolders: map[uuid.UUID]struct{}{},
		slotFree: make(chan struct{}, 1), floorHit: make(chan struct{}, 1), lostDue: make(chan struct{}, 1), wakeTypes: map[string]string{},
		floors: store.NewFloors(), keyFloors: store.NewFloors(), aheadShort: true, aheadHold: aheadHold}
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

// usable refuses a nil Worker, or one not made by NewWorker (a zero value, which has
// no client), with ErrInvalidArgument naming the call op.
func (w *Worker) usable(op string) error {
	if w == nil || w.client == nil {
		return invalidArgument("%s: a nil or zero Worker (make one with NewWorker)", op)
	}
	return nil
}

// ID returns the worker's id ("" for a nil or zero Worker, which has none).
func (w *Worker) ID() string {
	if w.usable("ID") != nil {
		return ""
	}
	return w.cfg.ID
}

// PrunedRuns returns how many finished runs this worker deleted under the client's
// Retention (0 for a nil or zero Worker).
func (w *Worker) PrunedRuns() int64 {
	if w.usable("PrunedRuns") != nil {
		return 0
	}
	return w.pruned.Load()
}

// ArchivedRuns returns how many finished runs this worker moved into the history
// (see Config.ArchiveAfter; 0 for a nil or zero Worker).
func (w *Worker) ArchivedRuns() int64 {
	if w.usable("ArchivedRuns") != nil {
		return 0
	}
	return w.archived.Load()
}

// DroppedHistoryPartitions returns how many history partitions (one per table and
// day) this worker dropped under the retention (0 for a nil or zero Worker).
func (w *Worker) DroppedHistoryPartitions() int64 {
	if w.usable("DroppedHistoryPartitions") != nil {
		return 0
	}
	return w.historyDropped.Load()
}

// AbandonedSteps returns how many step goroutines this worker abandoned because they
// ignored their timeout (see WithTimeout). They may still be running. 0 for a nil or
// zero Worker.
func (w *Worker) AbandonedSteps() int64 {
	if w.usable("AbandonedSteps") != nil {
		return 0
	}
	return w.abandoned.Load()
}

// Run claims and executes runs until ctx is done, then drains: it stops claiming,
// waits up to DrainTimeout for running workflows to finish, and hands the runs still
// going back (PENDING, claimable at once by another process; the interrupted step
// attempts do not count). It returns nil after a drain; an error when it cannot start
// (ErrSchemaNotMigrated: the schema is not migrated, or older than this library's;
// ErrAlreadyExists: another running worker of the client has its ID;
// ErrInvalidArgument: the worker is already running, or is nil or a zero Worker not
// made by NewWorker); and ErrClosed when the pool is closed under it.
//
// Claims are batched to the free slots; new runs, wake times and cancels arrive by
// LISTEN/NOTIFY on one connection per Client (see NewClient), timers wake the worker
// for known wake times, and it polls every PollInterval only as a fallback.
func (w *Worker) Run(ctx context.Context) error {
	if err := w.usable("Run"); err != nil {
		return err
	}
	if !w.running.CompareAndSwap(false, true) {
		return invalidArgument("worker %s is already running (Run was called again before it returned)", w.cfg.ID)
	}
	w.sawWork.Store(time.Now().UnixNano())
	defer w.running.Store(false)
	w.startedAt = time.Now()
	topics := []string{store.CancelTopic(w.client.ns)}
	for _, t := range w.types {
		topics = append(topics, store.WakeTopic(w.client.ns, t))
		w.wakeTypes[store.WakeTopic(w.client.ns, t)] = t
	}
	sub := w.client.notifier.Subscribe(topics...)
	defer sub.Close()

	// The services stop in the reverse order of this list, after the drain: the
	// scheduler first (it also stops with ctx), the committers last, since every
	// write of the others and of the drain goes through them.
	var bg services
	defer bg.stop()
	bg.start(context.Background(), service{"step records committer", func(ctx context.Context) { w.db.Run(ctx, 1) }})
	bg.start(context.Background(), service{"run ends committer", func(ctx context.Context) { w.ends.Run(ctx, 1) }})
	if err := w.checkSchema(ctx); err != nil {
		return err
	}
	w.checkDurability(ctx)
	if err := w.client.addWorker(w); err != nil {
		return err
	}
	defer w.client.removeWorker(w)
	w.livenessKey = 0
	if w.cfg.ReapInterval > 0 && w.client.notifier.Connects() {
		w.livenessKey = rand.Int64N(1<<62) + 1 // positive: see store.ReapDeadWorkers
	}
	// Registering tells a missing schema or a closed pool (returned) from a slow or
	// unreachable database (logged; the heartbeat registers the worker later).
	if err := w.register(ctx); err != nil {
		if ctx.Err() != nil {
			// Stopped while registering: the stop cancelled the wait for the answer,
			// not always the insert, which may have committed (a worker left ONLINE
			// with no heartbeat). It is recorded OFFLINE, as after any stop.
			w.setStatus(WorkerOffline)
			return nil
		}
		if errors.Is(err, ErrSchemaNotMigrated) || errors.Is(err, ErrClosed) {
			return err
		}
		w.logger.Warn("kagzi: cannot register the worker yet", "error", err)
	}
	stopHeartbeat := bg.start(context.Background(), service{"heartbeat", w.heartbeat})
	bg.start(context.Background(), service{"prune", w.prune})
	bg.start(context.Background(), service{"history drops", w.dropHistory})
	bg.start(context.Background(), service{"deadlines", w.failOverdue})
	stopLiveness := func() {}
	if w.cfg.ReapInterval > 0 && w.client.notifier.Connects() {
		// Released after the drain, once the registry says OFFLINE.
		stop, release := w.keepLiveness()
		defer release()
		stopLiveness = stop
	}
	if !w.cfg.DisableScheduler {
		bg.start(ctx, service{"scheduler", w.runScheduler})
	}

	goroutines := gopool.New(idleGoroutineTime)
	defer goroutines.Close()
	w.rt = w.runtime(goroutines)
	w.claimer = store.Claimer{Namespace: w.client.ns, Types: w.types, Versions: w.versions, WorkerID: w.cfg.ID,
		Lease: w.cfg.LeaseDuration, Cursors: map[string]string{}, Floors: w.floors, KeyFloors: w.keyFloors,
		KeyScans: map[string]bool{}, KeysFreed: map[string]bool{}, Limited: map[string]bool{}, Durable: w.cfg.DurableClaims}
	bg.start(ctx, service{"floors probe", w.probeFloors})
	w.logger.Info("kagzi: worker started", "types", w.types, "max_concurrent", w.cfg.MaxConcurrent)
	w.mu.Lock()
	w.accepting = true
	w.mu.Unlock()
	err := w.loop(ctx, sub)
	w.mu.Lock()
	w.accepting = false
	w.mu.Unlock()
	closed := errors.Is(err, ErrClosed)
	if closed {
		// Nothing can be written any more: no drain (its runs could not end, nor be
		// handed back), and no registry row. Their executions stop writing nothing;
		// their leases, or the look for dead processes, give them to other workers.
		w.abandon()
	} else {
		w.setStatus(WorkerDraining)
		w.drain()
	}
	// The heartbeat brings a row marked OFFLINE by another worker's sweep back
	// ONLINE, and so does the recording of the liveness key; both stop (the last
	// beat answered, a recording in flight done) before the worker records its own
	// OFFLINE, or one racing that write would revive a stopped worker.
	stopHeartbeat()
	stopLiveness()
	if !closed {
		w.setStatus(WorkerOffline)
	}
	w.logger.Info("kagzi: worker stopped")
	return err
}

// abandon stops every execution of a worker whose pool was closed, as if its lease
// was lost: each writes nothing more, and Run does not wait for them.
func (w *Worker) abandon() {
	w.dropHeld(true)
	w.dropAhead(true)
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, x := range w.active {
		x.cancel(errLeaseLost)
	}
}

// runtime is what the worker's executions need of it (see runtime).
func (w *Worker) runtime(goroutines *gopool.Pool) *runtime {
	c := w.client
	return &runtime{workerID: w.cfg.ID, cfg: &w.cfg, payloads: &c.payloads, hooks: c.hooks, logger: w.logger,
		db: &writer{pool: c.pool, steps: w.db, ends: w.ends, client: c.id, lease: w.cfg.LeaseDuration}, startChild: c.startChild,
		abandoned: &w.abandoned, stepGoroutines: &w.stepGoroutines, goroutines: goroutines}
}

// checkSchema compares the database's schema version with this library's before the
// worker starts: a schema older than the library's (migrations not applied yet) is
// ErrSchemaNotMigrated, as a missing one is; a newer one (a later Kagzi migrated it,
// say during a rolling deploy) is logged, and the worker runs: should a migration have
// changed what this library uses, its claims fail with ErrSchemaNotMigrated and Run
// returns. A database that does not answer is left to the registration.
func (w *Worker) checkSchema(ctx context.Context) error {
	current, latest, err := schema.Version(ctx, w.client.pool)
	switch {
	case err != nil:
		return nil
	case current < latest:
		return fmt.Errorf("kagzi: worker %s: %w (the database's schema is at version %d, this library's at %d)",
			w.cfg.ID, ErrSchemaNotMigrated, current, latest)
	case current > latest:
		w.logger.Warn("kagzi: the database's schema is newer than this library's: a later version of Kagzi migrated it",
			"schema_version", current, "library_schema_version", latest)
	}
	return nil
}

// checkDurability warns when the worker's sessions commit without waiting for the
// WAL's flush (synchronous_commit off for the server, the database or the role): a
// crash of PostgreSQL then loses the last commits, step records and run ends that a
// Wait had already returned among them, and the claims' safety (a write recorded
// under a claim puts the claim on disk: see store.ClaimRuns) no longer holds. Kagzi
// does not override the setting.
func (w *Worker) checkDurability(ctx context.Context) {
	var setting string
	err := w.client.pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&setting)
	if err == nil && setting == "off" {
		w.logger.Warn("kagzi: synchronous_commit is off for this database or role: a crash of PostgreSQL may lose "+
			"the last steps and run ends recorded, results already returned among them; set it on for Kagzi's role",
			"worker", w.cfg.ID)
	}
}

// register records the worker in the registry, ONLINE. The runs the worker holds
// (a worker that registers late, at a heartbeat, may hold some) are its own, and
// stay so: only other runs locked by its id, a previous process's, are freed.
func (w *Worker) register(ctx context.Context) error {
	host, _ := os.Hostname()
	w.status.Store(WorkerOnline)
	w.mu.Lock()
	held := make([][16]byte, 0, len(w.active))
	for _, x := range w.active {
		held = append(held, x.run.RunID)
	}
	w.mu.Unlock()
	live, err := store.RegisterWorker(ctx, w.client.pool, store.WorkerRow{
		Namespace: w.client.ns, WorkerID: w.cfg.ID, Hostname: host, PID: os.Getpid(), Version: Version,
		Labels: w.cfg.Labels, WorkflowTypes: w.types, WorkflowVersions: w.versions, MaxConcurrent: w.cfg.MaxConcurrent,
		HeartbeatInterval: w.cfg.HeartbeatInterval,
	}, held, w.livenessKey)
	err = dbError("kagzi: register worker "+w.cfg.ID, err)
	if live {
		// Not refused: a process restarted with its fixed id on another machine would
		// be refused for as long as the dead one's session lingers (until TCP gives
		// up on it), and the fencing keeps what the two record single.
		w.logger.Warn("kagzi: another live process was running a worker of this id; its runs were taken from it " +
			"(worker ids must be unique among running workers: set WorkerConfig.ID per process, or leave it empty)")
	}
	w.registered.Store(err == nil)
	return err
}

// setStatus records the worker DRAINING or OFFLINE in the registry.
func (w *Worker) setStatus(status WorkerStatus) {
	w.status.Store(status)
	ctx, cancel := context.WithTimeout(context.Background(), w.beatTimeout())
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

// closedPoolProbe is how often a worker's loop looks whether its pool was closed.
const closedPoolProbe = 250 * time.Millisecond

// freeSlots is how many runs the worker may claim now in its free slots.
func (w *Worker) freeSlots() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.soloBlocks(time.Now()) {
		return 0 // see solo.go
	}
	free := w.cfg.MaxConcurrent - w.slotsTakenLocked()
	if w.claimOne {
		free = min(free, 1)
	}
	return free
}

// finishingPlaces lists the runs of finishingHolders, for the claim.
func (w *Worker) finishingPlaces() [][16]byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.finishingHolders) == 0 {
		return nil
	}
	ids := make([][16]byte, 0, len(w.finishingHolders))
	for id := range w.finishingHolders {
		ids = append(ids, id)
	}
	return ids
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
//
// The claims do not count a finishing run against the limits (Claimer.Finishing):
// its end frees its type slot and its key's place. A keyed run that continues as new
// hands its place to its next run instead (keepsPlace), and stays counted.
//
// An execution that is no longer its run's (the run was claimed again by this worker,
// its claim lost in a crash of the database, while this one went on) holds no slot:
// start gave it to the new one. Counted finishing, it was never uncounted (its
// executionDone leaves the run's entry, the new one's, alone), and the worker claimed
// one run more than MaxConcurrent from then on.
func (w *Worker) releaseSlot(x *execution, keepsPlace bool) {
	w.mu.Lock()
	if x.finishing || w.active[x.run.RunID] != x || w.finishing >= finishingPerSlot*w.cfg.MaxConcurrent {
		w.mu.Unlock()
		return
	}
	x.finishing = true
	w.finishing++
	w.freed++
	if (x.run.HoldsSlot || x.run.ConcurrencyKey != "") && !keepsPlace {
		w.finishingHolders[x.run.RunID] = struct{}{}
	}
	start := w.takeAheadLocked()
	w.mu.Unlock()
	for _, x := range start {
		w.launch(x)
	}
	select {
	case w.slotFree <- struct{}{}:
	default:
	}
}

// startEagerRun executes a run its start claimed on a goroutine of its own (one of
// w.goroutines), in the slot reserved for it: the same hold of w.mu that counts the
// run active gives the reservation up, so that the worker never looks idle in between
// (see solo.go). sent is when the start was sent, claimedAt when its answer came;
// plain that it claimed its run without limits. A plain start sent before the worker
// learnt that its type's limits were set hands its run back (see limitsSet), and its
// slot to the runs waiting for one.
func (w *Worker) startEagerRun(run store.ClaimedRun, sent, claimedAt time.Time, plain bool) {
	w.sawWork.Store(claimedAt.UnixNano())
	x := newExecution(w.rt, w.defs[run.WorkflowType], run, sent, claimedAt)
	w.mu.Lock()
	if x.ctx.Err() == nil && w.claimedBeforeLimitsLocked(run.WorkflowType, sent, plain) {
		w.mu.Unlock()
		w.giveBackUnstarted([]*execution{x}, false)
		w.releaseReservation()
		return
	}
	w.reserved--
	w.addActiveLocked(x)
	w.mu.Unlock()
	w.launch(x)
}

// addActiveLocked counts an execution active (w.mu held).
func (w *Worker) addActiveLocked(x *execution) {
	id := x.run.RunID
	if old := w.active[id]; old != nil && old.finishing {
		// The run was claimed again (its lease ran out) while its previous execution
		// was still writing its end: that one no longer counts.
		old.finishing = false
		w.finishing--
		delete(w.finishingHolders, id)
	} else if old != nil && old.ahead {
		// Waiting ahead (a suspect started beside one too), and its lease ran out.
		w.forgetAheadLocked(old) // see ahead.go
	} else if old != nil && old.suspect {
		w.forgetHeldLocked(old) // held, and its lease ran out (see solo.go)
	}
	w.active[id] = x
}

// executionDone forgets an execution that ended and frees its slot.
func (w *Worker) executionDone(x *execution) {
	x.cancel(nil)
	x.takePending() // still pending here only when the lease was lost: nothing to write
	w.mu.Lock()
	if w.active[x.run.RunID] == x { // a quick wake may have claimed the run again
		delete(w.active, x.run.RunID)
		if x.finishing {
			w.finishing--
			delete(w.finishingHolders, x.run.RunID)
		} else {
			w.freed++
		}
	}
	soloChanged := w.soloDoneLocked(x)
	start := w.takeAheadLocked()
	w.mu.Unlock()
	for _, x := range start {
		w.launch(x)
	}
	if soloChanged {
		w.soloChanged()
	}
	select {
	case w.slotFree <- struct{}{}:
	default:
	}
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

// drain waits for running workflows up to DrainTimeout, then interrupts them and
// hands their runs back.
func (w *Worker) drain() {
	w.dropHeld(false)  // a suspect held back goes back at once (see solo.go)
	w.dropAhead(false) // and so do runs claimed ahead (see ahead.go)
	deadline := time.NewTimer(w.cfg.DrainTimeout)
	defer deadline.Stop()
	interrupted := false
	var grace <-chan time.Time
	for {
		w.mu.Lock()
		n := len(w.active) + w.reserved // an eager start in flight starts, or is handed back
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
	// The runs of claims and eager starts whose answers were lost go back too.
	w.handLostBack(context.Background())
	w.mu.Lock()
	held := w.handBack
	w.handBack = nil
	if interrupted {
		for _, x := range w.active {
			held = append(held, x.run.Fence)
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

// beatTimeout bounds each of the worker's registry and liveness statements: a
// heartbeat interval, and at least a second, so that a very short interval on a
// loaded database does not time out the beat or the stop's OFFLINE.
func (w *Worker) beatTimeout() time.Duration {
	return max(w.cfg.HeartbeatInterval, time.Second)
}
