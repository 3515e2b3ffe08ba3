package ui

import (
	"errors"
	"html/template"
	"time"

	"github.com/google/uuid"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/store"
)

// The most of a run's children, signals, events and actions its page lists.
const (
	runChildren = 200
	runSignals  = 100
	runEvents   = 100
	runAudit    = 20
)

type stepView struct {
	kagzi.StepInfo
	Out payload
}

type signalView struct {
	kagzi.SignalInfo
	Body payload
}

type eventView struct {
	kagzi.EventInfo
	Body payload
}

type runData struct {
	Run          *kagzi.RunInfo
	Lease        store.RunLease
	LeaseLeft    string
	Active       bool
	Timeline     template.HTML
	Steps        []stepView
	ForkKeys     []string
	Children     []kagzi.RunInfo
	ChildrenMore bool
	Signals      []signalView
	SignalsMore  bool
	Events       []eventView
	EventsMore   bool
	Input        payload
	Output       payload
	Stack        string
	Audit        []store.AuditEntry
	CanCancel    bool
	CanRerun     bool
	CanFork      bool
	CanSignal    bool
}

func (c *console) run(q *req) (string, any, error) {
	ctx, id := q.r.Context(), q.r.PathValue("id")
	run, err := q.client.GetRun(ctx, id)
	if err != nil {
		return "", nil, err
	}
	runID, _ := uuid.Parse(run.RunID)
	d := &runData{Run: run, Active: !run.Status.Terminal(), Input: c.payload(run.Input), Output: c.payload(run.Output)}
	// From the primary, as GetRun: a read pool that lags has no row yet for a run
	// started a moment ago (a fork's redirect here, a child just started), and the
	// page was a 404 for a run that exists.
	if d.Lease, err = store.GetRunLease(ctx, q.pool, q.ns, runID); err != nil {
		return "", nil, storeErr(err)
	}
	if run.Status == kagzi.StatusRunning {
		d.LeaseLeft = ago(run.AvailableAt)
	}
	if run.Error != nil {
		d.Stack = run.Error.Metadata["stack"]
	}
	steps, err := q.client.ListSteps(ctx, id)
	if err != nil {
		return "", nil, err
	}
	for _, st := range steps {
		d.Steps = append(d.Steps, stepView{StepInfo: st, Out: c.payload(st.Output)})
		d.ForkKeys = append(d.ForkKeys, st.Key)
	}
	children, err := q.client.ListRuns(ctx, kagzi.RunFilter{ParentRunID: id, PageSize: runChildren})
	if err != nil {
		return "", nil, err
	}
	d.Children, d.ChildrenMore = children.Runs, children.NextPageToken != ""
	if err := c.runMessages(q, d); err != nil {
		return "", nil, err
	}
	if d.Audit, err = store.ListAudit(ctx, q.read, q.ns, &runID, 0, runAudit); err != nil {
		return "", nil, err
	}
	d.Timeline = timeline(run, steps, d.Children, q.base(), time.Now())
	d.CanCancel = d.Active && c.can(q, ActionCancel)
	d.CanRerun = (run.Status == kagzi.StatusFailed || run.Status == kagzi.StatusCancelled) && c.can(q, ActionRerun)
	d.CanFork = len(steps) > 0 && c.can(q, ActionFork)
	d.CanSignal = d.Active && c.can(q, ActionSignal)
	return "Run " + short(run.RunID), d, nil
}

// runMessages reads the run's signals and events. They come from the read pool: one
// that lags may not have the run yet, which the primary showed exists, and then has
// none of its messages either.
func (c *console) runMessages(q *req, d *runData) error {
	ctx, id := q.r.Context(), d.Run.RunID
	signals, err := q.client.ListSignals(ctx, id, kagzi.ListOptions{PageSize: runSignals})
	if errors.Is(err, kagzi.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, s := range signals.Signals {
		d.Signals = append(d.Signals, signalView{SignalInfo: s, Body: c.payload(s.Payload)})
	}
	d.SignalsMore = signals.NextPageToken != ""
	events, err := q.client.ListEvents(ctx, id, kagzi.ListOptions{PageSize: runEvents})
	if errors.Is(err, kagzi.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range events.Events {
		d.Events = append(d.Events, eventView{EventInfo: e, Body: c.payload(e.Value)})
	}
	d.EventsMore = events.NextPageToken != ""
	return nil
}

// storeErr maps the store's not-found to the console's.
func storeErr(err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return kagzi.ErrNotFound
	}
	return err
}

// isBadInput reports an error the user's input caused.
func isBadInput(err error) bool {
	return errors.Is(err, kagzi.ErrInvalidArgument)
}
