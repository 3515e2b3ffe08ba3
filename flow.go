package kagzi

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/kagzi/kagzi/internal/store"
)

// Flow control: limits per workflow type, stored in the database and read by every
// claim (so they change at runtime, on every worker at once), concurrency keys,
// priorities and debounce. docs/flow-control.md tells the rules and their costs.

// Limits are the flow-control limits of a workflow type in the client's namespace.
// A zero field is no such limit. Every worker of the namespace applies them at its
// next claim, across processes exactly: two workers never admit past a limit together.
type Limits struct {
	// WorkflowType is the type they limit.
	WorkflowType string `json:"workflow_type"`
	// Concurrency is the most runs of the type executing at once (RUNNING). A run that
	// sleeps, waits or waits for a retry gives its slot back and claims one again when
	// it resumes.
	Concurrency int `json:"concurrency,omitempty"`
	// KeyConcurrency is the most runs of one concurrency key (see WithConcurrencyKey)
	// started and not finished: 1 runs one at a time per key, in start order within the
	// key. A run that sleeps, waits or waits for a retry keeps its key's place, so "one
	// order per customer at a time" means the whole order, not one step of it.
	KeyConcurrency int `json:"key_concurrency,omitempty"`
	// Rate and RatePeriod: at most Rate runs of the type begin executing (a first start,
	// or a resumption after a sleep, a wait or a retry) in any window of RatePeriod. A
	// window remembers its last 1.1 periods: in the first period after RatePeriod is
	// raised, the starts from before the last 1.1 old periods are not counted
	// (docs/flow-control.md).
	Rate       int           `json:"rate,omitempty"`
	RatePeriod time.Duration `json:"-"` // in JSON: rate_period, a duration string ("1m30s")
	// KeyRate and KeyRatePeriod: at most KeyRate runs of one concurrency key begin
	// their first execution in any window of KeyRatePeriod.
	KeyRate       int           `json:"key_rate,omitempty"`
	KeyRatePeriod time.Duration `json:"-"` // in JSON: key_rate_period
	// UpdatedAt is when the limits were last set (read only).
	UpdatedAt time.Time `json:"updated_at"`
}

// limitsJSON is Limits' JSON: the periods as duration strings.
type limitsJSON struct {
	limitsFields
	RatePeriod    string `json:"rate_period,omitempty"`
	KeyRatePeriod string `json:"key_rate_period,omitempty"`
}

type limitsFields Limits // Limits without its methods

// MarshalJSON encodes the limits with their periods as duration strings ("1m0s").
func (l Limits) MarshalJSON() ([]byte, error) {
	j := limitsJSON{limitsFields: limitsFields(l)}
	if l.RatePeriod != 0 {
		j.RatePeriod = l.RatePeriod.String()
	}
	if l.KeyRatePeriod != 0 {
		j.KeyRatePeriod = l.KeyRatePeriod.String()
	}
	return json.Marshal(j)
}

// UnmarshalJSON decodes what MarshalJSON encodes.
func (l *Limits) UnmarshalJSON(b []byte) error {
	var j limitsJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*l = Limits(j.limitsFields)
	for _, p := range []struct {
		s   string
		dst *time.Duration
	}{{j.RatePeriod, &l.RatePeriod}, {j.KeyRatePeriod, &l.KeyRatePeriod}} {
		if p.s == "" {
			continue
		}
		d, err := time.ParseDuration(p.s)
		if err != nil {
			return fmt.Errorf("kagzi: limits: %w", err)
		}
		*p.dst = d
	}
	return nil
}

// Bounds of Limits: MaxLimit for any count, rate periods within MinRatePeriod and
// MaxRatePeriod.
const (
	MaxLimit      = 1_000_000
	MinRatePeriod = 10 * time.Millisecond
	MaxRatePeriod = 24 * time.Hour
)

// validate checks the limits; its errors wrap ErrInvalidArgument.
func (l Limits) validate() error {
	if err := validName("workflow type", l.WorkflowType); err != nil {
		return err
	}
	for _, n := range []struct {
		name  string
		value int
	}{{"Concurrency", l.Concurrency}, {"KeyConcurrency", l.KeyConcurrency}, {"Rate", l.Rate}, {"KeyRate", l.KeyRate}} {
		if n.value < 0 || n.value > MaxLimit {
			return invalidArgument("limits of %s: %s %d is not within 0..%d", l.WorkflowType, n.name, n.value, MaxLimit)
		}
	}
	for _, r := range []struct {
		name   string
		rate   int
		period time.Duration
	}{{"Rate", l.Rate, l.RatePeriod}, {"KeyRate", l.KeyRate, l.KeyRatePeriod}} {
		switch {
		case r.rate == 0 && r.period != 0:
			return invalidArgument("limits of %s: a %sPeriod without a %s", l.WorkflowType, r.name, r.name)
		case r.rate > 0 && r.period == 0:
			return invalidArgument("limits of %s: a %s without a %sPeriod (%v..%v)", l.WorkflowType, r.name, r.name,
				MinRatePeriod, MaxRatePeriod)
		case r.rate > 0 && (r.period < MinRatePeriod || r.period > MaxRatePeriod):
			return invalidArgument("limits of %s: %sPeriod %v is not within %v..%v", l.WorkflowType, r.name, r.period,
				MinRatePeriod, MaxRatePeriod)
		case r.period%time.Millisecond != 0:
			// Stored in milliseconds: refused rather than cut.
			return invalidArgument("limits of %s: %sPeriod %v is not a whole number of milliseconds", l.WorkflowType,
				r.name, r.period)
		}
	}
	if l.Concurrency == 0 && l.KeyConcurrency == 0 && l.Rate == 0 && l.KeyRate == 0 {
		return invalidArgument("limits of %s: no limit given (DeleteLimits removes them)", l.WorkflowType)
	}
	return nil
}

func optional(n int) *int {
	if n == 0 {
		return nil
	}
	return &n
}

func orZero(n *int) int {
	if n == nil {
		return 0
	}
	return *n
}

func limitsOf(l store.FlowLimits) Limits {
	return Limits{WorkflowType: l.WorkflowType, Concurrency: orZero(l.Concurrency), KeyConcurrency: orZero(l.KeyConcurrency),
		Rate: orZero(l.Rate), RatePeriod: l.RatePeriod,
		KeyRate: orZero(l.KeyRate), KeyRatePeriod: l.KeyRatePeriod, UpdatedAt: l.UpdatedAt}
}

// lateHoldersWait bounds SetLimits's wait for the claims under way when it stored a
// concurrency limit.
const lateHoldersWait = 2 * time.Second

// SetLimits stores the limits of a workflow type in the client's namespace, replacing
// those it had. They apply from every worker's next claim; a run already running when
// a lower limit is set finishes, and no run is admitted until the type is back under
// it. A concurrency limit counts the type's runs executing when it is set, including
// those of claims under way meanwhile (SetLimits waits up to 2 s for them). Runs that
// workers claimed ahead of their free slots (WorkerConfig.ClaimAhead) and have not
// started go back to be claimed under the new limits: this client's workers' before
// SetLimits returns (also those of a claim on its way), other processes' when they
// hear of it (milliseconds, through LISTEN; before their next claim when the
// notification was lost). Invalid limits (negative, over MaxLimit, a rate without a
// period in MinRatePeriod..MaxRatePeriod or not a whole number of milliseconds, none at
// all) are ErrInvalidArgument and change nothing.
func (c *Client) SetLimits(ctx context.Context, l Limits) (*Limits, error) {
	if err := c.usable("SetLimits"); err != nil {
		return nil, err
	}
	if err := l.validate(); err != nil {
		return nil, err
	}
	// This process's workers hand back the type's runs they claimed ahead, before and
	// after (the others when they hear of it): claimed before the limits, they would
	// start under them.
	c.limitsSet(l.WorkflowType)
	defer c.limitsSet(l.WorkflowType)
	out, err := store.SetFlowLimits(ctx, c.pool, store.FlowLimits{Namespace: c.ns, WorkflowType: l.WorkflowType,
		Concurrency: optional(l.Concurrency), KeyConcurrency: optional(l.KeyConcurrency),
		Rate: optional(l.Rate), RatePeriod: l.RatePeriod,
		KeyRate: optional(l.KeyRate), KeyRatePeriod: l.KeyRatePeriod})
	if err != nil {
		return nil, dbError("kagzi: set limits of "+l.WorkflowType, err)
	}
	if l.Concurrency > 0 {
		if err := store.MarkLateTypeHolders(ctx, c.pool, c.ns, l.WorkflowType, lateHoldersWait); err != nil {
			return nil, dbError("kagzi: set limits of "+l.WorkflowType+" (stored; marking the runs claimed meanwhile)", err)
		}
	}
	set := limitsOf(out)
	return &set, nil
}

// limitsSet tells the client's workers of the type that its limits are being set.
func (c *Client) limitsSet(workflowType string) {
	c.mu.Lock()
	ws := make([]*Worker, 0, len(c.workers))
	for w := range c.workers {
		if w.defs[workflowType] != nil {
			ws = append(ws, w)
		}
	}
	c.mu.Unlock()
	for _, w := range ws {
		w.limitsSet(workflowType)
	}
}

// GetLimits reads the limits of a workflow type; ErrNotFound when it has none.
func (c *Client) GetLimits(ctx context.Context, workflowType string) (*Limits, error) {
	if err := c.usable("GetLimits"); err != nil {
		return nil, err
	}
	if err := validName("workflow type", workflowType); err != nil {
		return nil, err
	}
	l, err := store.GetFlowLimits(ctx, c.pool, c.ns, workflowType)
	if err != nil {
		return nil, readError("kagzi: get limits of "+workflowType, err)
	}
	out := limitsOf(l)
	return &out, nil
}

// ListLimits lists the limits of every workflow type of the client's namespace that
// has some, by type.
func (c *Client) ListLimits(ctx context.Context) ([]Limits, error) {
	if err := c.usable("ListLimits"); err != nil {
		return nil, err
	}
	rows, err := store.ListFlowLimits(ctx, c.pool, c.ns)
	if err != nil {
		return nil, readError("kagzi: list limits", err)
	}
	out := make([]Limits, len(rows))
	for i, r := range rows {
		out[i] = limitsOf(r)
	}
	return out, nil
}

// DeleteLimits removes the limits of a workflow type: its runs are claimed as fast as
// workers have slots. ErrNotFound when it had none.
func (c *Client) DeleteLimits(ctx context.Context, workflowType string) error {
	if err := c.usable("DeleteLimits"); err != nil {
		return err
	}
	if err := validName("workflow type", workflowType); err != nil {
		return err
	}
	return wrapStoreErr("kagzi: delete limits of "+workflowType, store.DeleteFlowLimits(ctx, c.pool, c.ns, workflowType))
}

// MaxPriority is the highest priority (see WithPriority).
const MaxPriority = 3600

// WithPriority gives the run a priority from 0 (the default) to MaxPriority: among the
// runs of its type (and of its concurrency key) waiting to be claimed, it is ordered as
// if it had been started p seconds earlier. So a higher priority is claimed first, and
// a run waits at most (the difference of priorities) seconds behind runs started after
// it: a priority-0 run waits at most MaxPriority seconds (an hour) behind any flood of
// higher-priority ones (aging, the starvation bound). Priority orders first executions:
// a run resumed after a sleep, a wait or a retry is claimed in the order of its wake
// time, and a delayed start (WithDelay, WithStartAt) keeps its start time.
func WithPriority(p int) StartOption {
	return func(o *startOptions) { o.priority = p; o.prioritySet = true }
}

// WithConcurrencyKey gives the run a concurrency key (a customer id, a tenant, an
// account): the limits of its type's KeyConcurrency and KeyRate apply per key, and the
// keys of a type take turns at the workers' free slots, so one key with a large
// backlog cannot starve another (the runs of no key count as one more key). Runs of a
// key are claimed in start order (and priority) within the key.
func WithConcurrencyKey(key string) StartOption {
	return func(o *startOptions) { o.flowKey = key; o.flowKeySet = true }
}

// WithDebounce collapses the starts of a debounce key (of the workflow type, in the
// namespace) within a window into one run: the first start creates a run that begins
// window later; each later start of the key, while that run has not begun, replaces
// its input with its own (the last input wins) and pushes its beginning to window
// from now, but never past maxWait after the first start. Start returns that run,
// with AlreadyExists set for every start but the first. A start after the run began
// creates the next one. A later start changes only the input and the beginning: the
// run keeps the first start's other options (priority, concurrency key, deadline,
// attributes). maxWait must be at least window; both are whole
// milliseconds (1 ms to MaxRatePeriod for the window). WithID, WithDelay and
// WithStartAt do not combine with it.
func WithDebounce(key string, window, maxWait time.Duration) StartOption {
	return func(o *startOptions) {
		o.debounce = &store.Debounce{Key: key, Window: window, MaxWait: maxWait}
	}
}

// flowOptions checks the flow-control start options and sets them on n.
func (o *startOptions) flowOptions(n *store.NewRun) error {
	if o.prioritySet && (o.priority < 0 || o.priority > MaxPriority) {
		return invalidArgument("priority %d is not within 0..%d", o.priority, MaxPriority)
	}
	if o.flowKeySet {
		if err := validName("concurrency key", o.flowKey); err != nil {
			return err
		}
	}
	n.Priority, n.FlowKey = o.priority, o.flowKey
	if d := o.debounce; d != nil {
		switch {
		case validName("debounce key", d.Key) != nil:
			return validName("debounce key", d.Key)
		case d.Window < time.Millisecond || d.Window > MaxRatePeriod:
			return invalidArgument("debounce window %v is not within %v..%v", d.Window, time.Millisecond, MaxRatePeriod)
		case d.Window%time.Millisecond != 0 || d.MaxWait%time.Millisecond != 0:
			// Stored in milliseconds: refused rather than cut.
			return invalidArgument("debounce window %v or maximum wait %v is not a whole number of milliseconds",
				d.Window, d.MaxWait)
		case d.MaxWait < d.Window || d.MaxWait > 7*MaxRatePeriod:
			return invalidArgument("debounce maximum wait %v must be at least the window %v and at most %v",
				d.MaxWait, d.Window, 7*MaxRatePeriod)
		case o.idSet || o.delay != 0 || !o.startAt.IsZero():
			return invalidArgument("WithDebounce does not combine with WithID, WithDelay or WithStartAt")
		}
		n.Debounce = d
	}
	return nil
}

// Hold is what holds a waiting run back from being claimed (see RunInfo.Hold).
type Hold struct {
	// Limit names the limit: "concurrency" or "rate" (the type's), "key-concurrency"
	// or "key-rate" (its concurrency key's).
	Limit string `json:"limit"`
	// Until is when a rate window admits it again; nil when it waits for a run that
	// holds a place to stop.
	Until *time.Time `json:"until,omitempty"`
}

// hold reads what holds a PENDING run back, or a SLEEPING one whose wake time came,
// for GetRun.
func (c *Client) hold(ctx context.Context, r store.Run) (*Hold, error) {
	if (r.Status != StatusPending && r.Status != StatusSleeping) || r.AvailableAt.After(time.Now().Add(time.Second)) {
		return nil, nil
	}
	h, err := store.RunHold(ctx, c.pool, c.ns, r)
	if err != nil || h == nil {
		return nil, err
	}
	return &Hold{Limit: h.Limit, Until: h.Until}, nil
}

// String formats the hold for people.
func (h *Hold) String() string {
	if h.Until != nil {
		// Milliseconds: a hold due within the second would print as a time already past.
		return fmt.Sprintf("held by the %s limit until %s", h.Limit, h.Until.Format("2006-01-02T15:04:05.000Z07:00"))
	}
	return fmt.Sprintf("held by the %s limit until a run that holds a place stops", h.Limit)
}
