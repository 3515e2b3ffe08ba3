package kagzi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi/internal/store"
)

// IDReuse says what Start does with a workflow id whose run already finished.
type IDReuse int

const (
	// IDReuseAfterFinish (the default) allows one active run per workflow id: a start
	// of an id whose run is still PENDING, RUNNING or SLEEPING returns that run, and a
	// start of an id whose runs all finished starts a new run.
	IDReuseAfterFinish IDReuse = iota
	// IDReuseNever makes the workflow id an idempotency key for good: a start of an id
	// whose run finished returns that finished run (AlreadyExists) instead of starting
	// again. It is the finished run's: a run started with it keeps its id from every
	// later start, with this option or without, while a run started without it frees
	// its id when it finishes (a later start with IDReuseNever then starts a new run,
	// which keeps the id from then on). Starts outside a transaction lock the id: under
	// concurrent starts the id runs once. A StartTx does not (see StartTx).
	IDReuseNever
)

// StartOption configures Start, StartTx and StartByName.
type StartOption func(*startOptions)

type startOptions struct {
	version    *string
	id         string
	idSet      bool // WithID was given (an empty id is then invalid)
	delay      time.Duration
	startAt    time.Time
	reuse      IDReuse
	deadline   time.Time
	timeout    time.Duration
	attributes map[string]any
	// requireWorker: RequireWorker; byName: StartByName, which warns once per type
	// when no live worker registered it.
	requireWorker, byName bool

	// Flow control (flow.go).
	priority    int
	prioritySet bool
	flowKey     string
	flowKeySet  bool
	debounce    *store.Debounce
}

// WithID sets the workflow id, the run's idempotency key in its namespace (for
// example "order-123"): starting an id that is active returns the existing run with
// AlreadyExists set. Without it, Kagzi generates a unique id. An empty id is
// ErrInvalidArgument.
func WithID(id string) StartOption { return func(o *startOptions) { o.id, o.idSet = id, true } }

// RequireWorker makes the start fail with ErrNoWorker, starting nothing, unless a live
// (ONLINE or DRAINING) worker of the namespace registered the workflow type and the
// run's version (WithRunVersion, or a typed workflow's definition version; any version
// for StartByName without WithRunVersion). It costs one more query, and looks at the
// registry as the start begins: a worker that stops right after does not undo the
// start. Without it a start of a type no worker registered waits PENDING until one
// does, and StartByName logs a warning, once per type per client.
func RequireWorker() StartOption { return func(o *startOptions) { o.requireWorker = true } }

// WithDelay makes the run claimable only after d has passed (the database's clock).
func WithDelay(d time.Duration) StartOption { return func(o *startOptions) { o.delay = d } }

// WithStartAt makes the run claimable only from t on (a time already past: at once).
// A time before year 1 or after 9999 is ErrInvalidArgument.
func WithStartAt(t time.Time) StartOption { return func(o *startOptions) { o.startAt = t } }

// WithDeadline ends the run FAILED with a deadline-exceeded error (CodeDeadlineExceeded)
// if it has not finished by t, whatever it is doing: running (its context is
// cancelled), sleeping, waiting for a retry or not yet started. A time already past,
// or after year 9999, is ErrInvalidArgument.
func WithDeadline(t time.Time) StartOption { return func(o *startOptions) { o.deadline = t } }

// WithRunTimeout is WithDeadline(the start time + d): the clock starts at Start.
func WithRunTimeout(d time.Duration) StartOption { return func(o *startOptions) { o.timeout = d } }

// WithRunVersion starts the run at a version of its workflow (see WithVersion, the
// definition's version): only workers that registered that version claim it. Start
// of a typed workflow uses the definition's version unless this is given.
func WithRunVersion(v string) StartOption { return func(o *startOptions) { o.version = &v } }

// AtVersion is WithRunVersion.
//
// Deprecated: use WithRunVersion, named like the other start options.
func AtVersion(v string) StartOption { return WithRunVersion(v) }

// WithIDReuse sets what happens when the workflow id's run already finished; see IDReuse.
func WithIDReuse(r IDReuse) StartOption { return func(o *startOptions) { o.reuse = r } }

// Run is a handle on a run: its ids, and Wait for its typed result.
type Run[Out any] struct {
	// RunID identifies this run (a UUID).
	RunID string
	// WorkflowID is the run's idempotency key in its namespace.
	WorkflowID string
	// WorkflowType is the name the workflow was defined with.
	WorkflowType string
	// AlreadyExists reports that Start found an existing run for the workflow id and
	// returned it instead of starting a new one.
	AlreadyExists bool

	client *Client
}

// Start starts a run of wf with input in the client's namespace, or returns the
// active run of the same workflow id (AlreadyExists). Workers of the workflow's type
// are notified in the same transaction, so one claims the run at once.
//
// When the database is unavailable (down, restarting, unreachable) Start returns an
// *UnavailableError (errors.Is ErrUnavailable). Its MayHaveCommitted is false when
// the start provably did not commit, and true when the connection broke after the
// start was sent, or the server ended the session (it may do so after the start's
// COMMIT), so that it may have. Either way, retrying with the same WithID is
// safe: a start that did commit is returned (AlreadyExists) rather than started
// twice (unless its run already finished and the id may be reused; see
// IDReuseNever). Without WithID each call generates a new workflow id, so a retry
// after an unknown outcome may start a second run. In StartTx nothing commits before
// the caller's own COMMIT, so MayHaveCommitted is false there.
func Start[In, Out any](ctx context.Context, c *Client, wf *Workflow[In, Out], input In, opts ...StartOption) (*Run[Out], error) {
	return startTyped(ctx, c, nil, wf, input, opts)
}

// StartTx is Start inside the caller's transaction: the run exists, and workers hear
// of it, only if tx commits. Use it to start a workflow atomically with the
// application's own writes. Invalid options and inputs (inputs PostgreSQL cannot
// store too: a NUL character, bytes that are not UTF-8) are refused before anything
// is sent, so the transaction stays usable. In a REPEATABLE READ or SERIALIZABLE
// transaction, a start whose WithID another transaction took after tx's snapshot was
// taken fails with PostgreSQL's serialization failure (a *pgconn.PgError, SQLSTATE
// 40001), as any write there that meets a row it cannot see: roll back and retry the
// transaction. Under READ COMMITTED (PostgreSQL's default) the start returns that run
// with AlreadyExists instead. StartTx takes no lock on the workflow id (it would hold
// it to tx's commit, and every start of the id would wait for it): a StartTx racing
// another start of an id started with IDReuseNever, whose run ends meanwhile (a run
// of milliseconds), may start the id again.
func StartTx[In, Out any](ctx context.Context, tx pgx.Tx, c *Client, wf *Workflow[In, Out], input In, opts ...StartOption) (*Run[Out], error) {
	if err := c.usable("StartTx"); err != nil {
		return nil, err
	}
	if tx == nil {
		return nil, invalidArgument("nil transaction")
	}
	return startTyped(ctx, c, tx, wf, input, opts)
}

func startTyped[In, Out any](ctx context.Context, c *Client, tx pgx.Tx, wf *Workflow[In, Out], input In, opts []StartOption) (*Run[Out], error) {
	if err := c.usable("Start"); err != nil {
		return nil, err
	}
	if err := wf.invalid(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(input)
	if err != nil {
		return nil, invalidArgument("input of %s does not encode as JSON: %v", wf.name, err)
	}
	opts = append([]StartOption{WithRunVersion(wf.version)}, opts...)
	r, err := c.start(ctx, tx, wf.name, b, opts)
	if err != nil {
		return nil, err
	}
	return &Run[Out]{RunID: r.RunID, WorkflowID: r.WorkflowID, WorkflowType: r.WorkflowType,
		AlreadyExists: r.AlreadyExists, client: c}, nil
}

// StartByName starts a run of the workflow type name, for callers that do not have
// its Go definition at hand. It reports an unavailable database as Start does. input
// is encoded with encoding/json (a json.RawMessage is stored as it is, once checked to
// be valid JSON that PostgreSQL can store: UTF-8 without NUL characters; else
// ErrInvalidArgument, nothing sent). The type need not be registered by any worker
// yet: the run waits PENDING until a worker for it runs, and the client logs a
// warning the first time it starts such a type (RequireWorker makes it an error
// instead).
func (c *Client) StartByName(ctx context.Context, workflowType string, input any, opts ...StartOption) (*Run[json.RawMessage], error) {
	if err := c.usable("StartByName"); err != nil {
		return nil, err
	}
	return c.startByName(ctx, nil, workflowType, input, opts)
}

// StartByNameTx is StartByName inside the caller's transaction. As under StartTx,
// invalid options and inputs are refused before anything is sent, so the transaction
// stays usable.
func (c *Client) StartByNameTx(ctx context.Context, tx pgx.Tx, workflowType string, input any, opts ...StartOption) (*Run[json.RawMessage], error) {
	if err := c.usable("StartByNameTx"); err != nil {
		return nil, err
	}
	if tx == nil {
		return nil, invalidArgument("nil transaction")
	}
	return c.startByName(ctx, tx, workflowType, input, opts)
}

func (c *Client) startByName(ctx context.Context, tx pgx.Tx, workflowType string, input any, opts []StartOption) (*Run[json.RawMessage], error) {
	if err := validName("workflow type", workflowType); err != nil {
		return nil, err
	}
	var b []byte
	if raw, ok := input.(json.RawMessage); ok {
		if !json.Valid(raw) {
			return nil, invalidArgument("input of %s is not valid JSON", workflowType)
		}
		b = raw
	} else {
		var err error
		if b, err = json.Marshal(input); err != nil {
			return nil, invalidArgument("input of %s does not encode as JSON: %v", workflowType, err)
		}
	}
	opts = append(opts, func(o *startOptions) { o.byName = true })
	return c.start(ctx, tx, workflowType, b, opts)
}

func (c *Client) start(ctx context.Context, tx pgx.Tx, workflowType string, input []byte, opts []StartOption) (*Run[json.RawMessage], error) {
	return c.startRun(ctx, tx, workflowType, input, opts, nil)
}

// times checks the timing options and returns the start time (zero: now) and the
// deadline (nil: none).
func (o *startOptions) times(now time.Time) (startAt time.Time, deadline *time.Time, err error) {
	switch {
	case o.delay < 0:
		return startAt, nil, invalidArgument("negative delay %v", o.delay)
	case o.delay > 0 && !o.startAt.IsZero():
		return startAt, nil, invalidArgument("both WithDelay and WithStartAt given")
	case o.timeout < 0:
		return startAt, nil, invalidArgument("negative run timeout %v", o.timeout)
	case o.timeout > 0 && !o.deadline.IsZero():
		return startAt, nil, invalidArgument("both WithRunTimeout and WithDeadline given")
	case !o.startAt.IsZero() && !inTimeRange(o.startAt):
		return startAt, nil, invalidArgument("start time %v is not within years 1..9999", o.startAt)
	case !o.deadline.IsZero() && !inTimeRange(o.deadline):
		return startAt, nil, invalidArgument("deadline %v is not within years 1..9999", o.deadline)
	}
	startAt = o.startAt
	if o.delay > 0 {
		startAt = now.Add(o.delay)
	}
	switch {
	case o.timeout > 0:
		t := now.Add(o.timeout)
		deadline = &t
	case !o.deadline.IsZero():
		if !o.deadline.After(now) {
			return startAt, nil, invalidArgument("deadline %v has already passed", o.deadline)
		}
		deadline = &o.deadline
	}
	return startAt, deadline, nil
}

// inTimeRange tells whether t is a time a start may take: from year 1 to the end of
// year 9999 (maxWakeTime). PostgreSQL's timestamps end in year 294276 and begin in
// 4713 BC; a start time or deadline beyond those would fail in the database, and,
// under StartTx, abort the caller's transaction.
func inTimeRange(t time.Time) bool {
	return t.Year() >= 1 && !t.After(maxWakeTime)
}

// startRun validates the options and inserts the run; link, when set, adds what only
// the library sets (a parent, a schedule tick).
func (c *Client) startRun(ctx context.Context, tx pgx.Tx, workflowType string, input []byte, opts []StartOption,
	link func(*store.NewRun)) (*Run[json.RawMessage], error) {
	var o startOptions
	for _, opt := range opts {
		if opt == nil {
			return nil, invalidArgument("start of %q: nil StartOption", workflowType)
		}
		opt(&o)
	}
	n, err := c.newRun(&o, workflowType, input)
	if err != nil {
		return nil, err
	}
	if link != nil {
		link(&n)
	}
	var db store.DBTX = c.starts
	if tx != nil {
		db = tx
	}
	if o.requireWorker {
		if err := c.requireWorker(ctx, tx, workflowType, o.version); err != nil {
			return nil, err
		}
	}
	// A lone start notifies the workers in its own statement (the quickest way to
	// them). While other starts of this client are in flight, it commits without the
	// notification and leaves it to the sender, which coalesces them after the commits:
	// transactions that notify serialise their commits on a server-wide lock. Inside
	// the caller's transaction the notification must commit with it.
	if tx == nil {
		n.NotifyLater = c.startsInFlight.Add(1) > 1
		defer c.startsInFlight.Add(-1)
	}
	n.CheckWorker = o.byName && !o.requireWorker && !c.warnedNoWorker(workflowType)
	// A worker of this process may claim the run in the insert itself (eager.go).
	var eager *Worker
	if tx == nil && link == nil && n.Debounce == nil && n.StartAt.IsZero() && n.Version != nil {
		if eager = c.eagerWorker(workflowType, *n.Version); eager != nil {
			_, limited := c.limitedTypes.Load(workflowType)
			switch locked := n.FlowKey != "" || limited; {
			case locked && n.NotifyLater:
				// An eager start within limits takes their locks and commits on its
				// own; while other starts of this client are in flight, the shared
				// commits carry more starts a second (the run waits for a claim).
				eager.releaseReservation()
				eager = nil
			case locked:
				n.Eager = &store.Eager{WorkerID: eager.cfg.ID, Lease: eager.cfg.LeaseDuration, Version: *n.Version,
					Limited: limited, Floor: eager.floorOf(workflowType)}
				db = c.pool // its own transaction, for the locks (see eager.go)
			default:
				n.Eager = &store.Eager{WorkerID: eager.cfg.ID, Lease: eager.cfg.LeaseDuration, Version: *n.Version,
					Floor: eager.floorOf(workflowType)}
			}
		}
	}
	began := time.Now()
	ctx, hooked := c.hookStartBegin(ctx, &n)
	r, st, err := store.InsertRunChecked(ctx, db, n)
	inserted := st.Inserted
	c.hookStartEnd(ctx, hooked, r, inserted, err)
	claimed := err == nil && inserted && eager != nil && r.Status == StatusRunning
	switch {
	case claimed:
		eager.startEager(r, n.Carrier, began, st.HoldsSlot, n.FlowKey == "" && !n.Eager.Limited)
	case eager != nil:
		eager.releaseReservation()
		if err != nil {
			// A start that may have committed leased its run to the worker, which
			// does not execute it: the worker hands it back (lostclaims.go).
			eager.lostStart(n.RunID, err)
		}
		if err == nil && inserted && n.FlowKey == "" && !n.Eager.Limited && !st.BehindQueue {
			// Its type has limits (an eager start of a run of no key is refused
			// only then, or behind runs queued before it): the next eager starts of
			// the type count its holders.
			c.limitedTypes.Store(workflowType, true)
		}
	}
	if err != nil {
		err = dbError("kagzi: start "+workflowType, err)
		var u *UnavailableError
		if errors.As(err, &u) {
			u.start = true
			// In the caller's transaction nothing commits before the caller's
			// COMMIT, which a broken connection cannot send.
			u.MayHaveCommitted = u.MayHaveCommitted && tx == nil
		}
		return nil, err
	}
	if st.NoWorker {
		c.warnNoWorker(workflowType, o.version)
	}
	if inserted && n.NotifyLater && !claimed {
		c.sender.Send(store.WakeTopic(r.Namespace, r.WorkflowType) + "|" + strconv.FormatInt(r.AvailableAt.UnixMilli(), 10))
		if r.Deadline != nil {
			c.sender.Send(store.DeadlineTopic(r.Namespace) + "|" + strconv.FormatInt(r.Deadline.UnixMilli(), 10))
		}
	}
	if err := heldByOther(n, r, inserted); err != nil {
		return nil, err
	}
	return &Run[json.RawMessage]{RunID: r.RunID.String(), WorkflowID: r.WorkflowID,
		WorkflowType: r.WorkflowType, AlreadyExists: !inserted, client: c}, nil
}

// newRun checks the start's options and input and returns the run to insert.
func (c *Client) newRun(o *startOptions, workflowType string, input []byte) (store.NewRun, error) {
	var flow store.NewRun
	if err := o.flowOptions(&flow); err != nil {
		return store.NewRun{}, err
	}
	if o.version != nil {
		if err := validVersion(*o.version); err != nil {
			return store.NewRun{}, err
		}
	}
	runID, err := uuid.NewV7()
	if err != nil {
		return store.NewRun{}, fmt.Errorf("kagzi: start: %w", err)
	}
	switch {
	case !o.idSet:
		o.id = runID.String()
	case o.id == "":
		return store.NewRun{}, invalidArgument("empty workflow id (WithID); leave WithID out to have one generated")
	default:
		if err := validName("workflow id", o.id); err != nil {
			return store.NewRun{}, err
		}
	}
	if input, err = c.encodePayload("input of "+workflowType, input); err != nil {
		return store.NewRun{}, err
	}
	if o.reuse != IDReuseAfterFinish && o.reuse != IDReuseNever {
		return store.NewRun{}, invalidArgument("unknown IDReuse %d", o.reuse)
	}
	startAt, deadline, err := o.times(time.Now())
	if err != nil {
		return store.NewRun{}, err
	}
	attrs, err := o.startAttributes()
	if err != nil {
		return store.NewRun{}, err
	}
	// Without a version, the run takes the newest one a live worker registered (none:
	// the first claim pins it), looked up by the start's own statement.
	return store.NewRun{
		RunID: runID, Namespace: c.ns, WorkflowID: o.id, WorkflowType: workflowType,
		Version: o.version, NewestVersion: o.version == nil, Attributes: attrs,
		Input: input, StartAt: startAt, ReuseNever: o.reuse == IDReuseNever, KeptID: o.idSet, Deadline: deadline,
		Priority: flow.Priority, FlowKey: flow.FlowKey, Debounce: flow.Debounce,
	}, nil
}

// heldByOther returns ErrAlreadyExists when the start found its workflow id held by
// a run it may not return: one of another workflow type, or, for a child's start,
// one that is not the child of that parent step.
func heldByOther(n store.NewRun, r store.Run, inserted bool) error {
	if inserted {
		return nil
	}
	if r.WorkflowType != n.WorkflowType {
		return fmt.Errorf("%w: workflow id %q is held by run %s of workflow type %q, not %q",
			ErrAlreadyExists, n.WorkflowID, r.RunID, r.WorkflowType, n.WorkflowType)
	}
	if n.ParentRunID != nil && (r.ParentRunID == nil || *r.ParentRunID != *n.ParentRunID ||
		r.ParentStepKey == nil || *r.ParentStepKey != n.ParentStepKey) {
		return fmt.Errorf("%w: workflow id %q is held by run %s, which is not the child started by step %s of run %s",
			ErrAlreadyExists, n.WorkflowID, r.RunID, n.ParentStepKey, n.ParentRunID)
	}
	return nil
}

// requireWorker returns ErrNoWorker unless a live worker registered the workflow
// type (and version, unless nil); see RequireWorker.
func (c *Client) requireWorker(ctx context.Context, tx pgx.Tx, workflowType string, version *string) error {
	var db store.DBTX = c.pool
	if tx != nil {
		db = tx
	}
	ok, err := store.LiveWorkerRegistered(ctx, db, c.ns, workflowType, version)
	if err != nil {
		return readError("kagzi: start "+workflowType+": look for a live worker", err)
	}
	if ok {
		return nil
	}
	what := fmt.Sprintf("workflow type %q", workflowType)
	if version != nil {
		what += fmt.Sprintf(" at version %q", *version)
	}
	return fmt.Errorf("%w: no live worker of namespace %q registered %s", ErrNoWorker, c.ns, what)
}

// warnedNoWorker tells whether the client already warned that no live worker
// registered the workflow type (see StartByName).
func (c *Client) warnedNoWorker(workflowType string) bool {
	_, ok := c.noWorkerWarned.Load(workflowType)
	return ok
}

// warnNoWorker logs, once per workflow type for the client's life, that StartByName
// started a run of a type no live worker registered.
func (c *Client) warnNoWorker(workflowType string, version *string) {
	if _, done := c.noWorkerWarned.LoadOrStore(workflowType, true); done {
		return
	}
	args := []any{"namespace", c.ns, "workflow_type", workflowType}
	if version != nil {
		args = append(args, "version", *version)
	}
	c.logger.Warn("kagzi: started a run of a workflow type no live worker registered; it waits PENDING until one does "+
		"(a typo? RequireWorker makes this an error; this warning is logged once per type)", args...)
}

// Wait blocks until the run ends or ctx is done, and returns the run's output. A run
// that ended FAILED returns a *WorkflowError (errors.Is ErrWorkflowFailed); a
// CANCELLED one returns ErrCancelled. Wait does not poll in a tight loop: it listens
// for the run's completion notification (told in process, with the run's result, when
// a worker of the same client ends the run: nothing is read back; else sent by the
// run's end, because the client registers as a waiter), and looks at the run every few
// seconds in case a notification was missed (the client makes the looks of all its
// waits that are due together, in one statement: a thousand waits cost one
// statement a round). A database that is unavailable for a
// while (restarting, failing over, unreachable) does not end the wait: Wait looks
// again on the same schedule until the run ends or ctx is done (its error then
// wraps both ctx's and the last ErrUnavailable).
func (r *Run[Out]) Wait(ctx context.Context) (Out, error) {
	var zero Out
	if r == nil || r.client == nil {
		return zero, invalidArgument("Wait on a nil or zero Run, or on one of a nil Client; get one from Start, RunOf or RunOfWorkflow")
	}
	if err := r.client.usable("Wait"); err != nil {
		return zero, err
	}
	id, err := uuid.Parse(r.RunID)
	if err != nil {
		return zero, invalidArgument("run id %q is not a UUID", r.RunID)
	}
	c := r.client
	sub := c.notifier.Subscribe(store.DoneTopic(id))
	defer func() { sub.Close() }() // the subscription of the run waited for last
	poll := c.waitPoll
	var ended *runEnd     // told by a worker of this client with its notification
	var looked *runLooked // a batched look's outcome
	var down error        // the last look's ErrUnavailable, while the database is
	for {
		var run store.Run
		switch {
		case ended != nil:
			run = store.Run{RunID: id, WorkflowID: ended.workflowID, Status: ended.status, Output: ended.output,
				Error: ended.detail}
		case looked != nil && looked.err != nil:
			err = fmt.Errorf("kagzi: wait for run %s: %w", r.RunID, looked.err)
			if !errors.Is(err, ErrUnavailable) {
				return zero, err
			}
			down = err // look again later
		case looked != nil && looked.found:
			e := looked.end
			run = store.Run{RunID: id, WorkflowID: e.WorkflowID, Status: e.Status, Output: e.Output, Error: e.Error,
				ContinuedAsRunID: e.ContinuedAsRunID}
			down = nil
		default: // the first look, a notification without the result, a run no longer live
			c.awaitEnds(ctx) // before each look: an end after it notifies this client
			if run, err = store.GetRun(ctx, c.pool, c.ns, id); err != nil {
				err = readError("kagzi: wait for run "+r.RunID, err)
				if !errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
					return zero, err
				}
				down = err // look again later
			} else {
				down = nil
			}
		}
		ended, looked = nil, nil
		if run.Status == StatusCompleted && run.ContinuedAsRunID != nil {
			// It continued as new: wait for the run that took over its workflow id.
			sub.Close()
			id, r = *run.ContinuedAsRunID, &Run[Out]{RunID: run.ContinuedAsRunID.String(), client: c}
			sub = c.notifier.Subscribe(store.DoneTopic(id))
			poll = c.waitPoll
			continue
		}
		switch run.Status {
		case StatusCompleted:
			var out Out
			if err := c.unmarshalPayload(run.Output, &out); err != nil {
				return zero, fmt.Errorf("kagzi: output of run %s does not decode into %s: %w", r.RunID, typeName[Out](), err)
			}
			return out, nil
		case StatusFailed:
			return zero, runError(run)
		case StatusCancelled:
			return zero, fmt.Errorf("%w: run %s (workflow id %q)", ErrCancelled, r.RunID, run.WorkflowID)
		}
		look := c.lookAt(id, poll) // with the client's other waits' looks
		select {
		case <-ctx.Done():
			c.dropLook(look)
			if down != nil {
				return zero, fmt.Errorf("%w (the database was unavailable at the last look: %w)", ctx.Err(), down)
			}
			return zero, ctx.Err()
		case n := <-sub.C:
			c.dropLook(look)
			ended, _ = n.Value.(*runEnd)
		case res := <-look.result:
			looked = &res
			poll = min(poll*2, c.maxWaitPoll())
		}
	}
}

// maxWaitPoll is the longest a Wait goes between looks at its run: 5 s when the
// client listens for notifications of run ends, 1 s when it has no direct
// connection and looking is how it learns of ends in other processes.
func (c *Client) maxWaitPoll() time.Duration {
	if c.notifier.Connects() {
		return 5 * time.Second
	}
	return time.Second
}

func runError(run store.Run) error {
	e := &WorkflowError{RunID: run.RunID.String(), WorkflowID: run.WorkflowID}
	if d := decodeDetail(run.Error); d != nil {
		e.Detail = *d
	}
	return e
}
