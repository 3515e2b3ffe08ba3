package kagzi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kagzi/kagzi/internal/vocab"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi/internal/store"
)

// RunStatus is where a run is in its life:
// PENDING → RUNNING → (SLEEPING ↔ PENDING) → COMPLETED | FAILED | CANCELLED
// (docs/state-machine.md draws every move). Terminal reports a final status.
type RunStatus = vocab.RunStatus

// Run statuses.
const (
	StatusPending   = vocab.StatusPending   // waiting to be claimed (or for its delayed start, or a retry's backoff)
	StatusRunning   = vocab.StatusRunning   // held by a worker under a lease
	StatusSleeping  = vocab.StatusSleeping  // in a durable sleep or wait; no worker holds it
	StatusCompleted = vocab.StatusCompleted // finished with an output
	StatusFailed    = vocab.StatusFailed    // finished with a recorded error
	StatusCancelled = vocab.StatusCancelled // cancelled
)

// RunInfo is what GetRun and ListRuns report of a run.
type RunInfo struct {
	RunID        string          `json:"run_id"`
	Namespace    string          `json:"namespace"`
	WorkflowID   string          `json:"workflow_id"`
	WorkflowType string          `json:"workflow_type"`
	Status       RunStatus       `json:"status"`
	Input        json.RawMessage `json:"input,omitempty"`
	// Output is set once the run COMPLETED.
	Output json.RawMessage `json:"output,omitempty"`
	// Error is set once the run FAILED.
	Error *ErrorDetail `json:"error,omitempty"`
	// Attempt is the number of the workflow-level attempt being (or last) executed:
	// 1 for the first, bumped by each retry of the whole workflow (see
	// WithWorkflowRetry); 0 for a run no worker has claimed yet. Resuming after a
	// sleep, a hand-back or a takeover is not a new attempt.
	Attempt int `json:"attempt"`
	// Takeovers counts the times the run was taken over after its worker lost the
	// lease (the process died, froze or lost its database). Past the worker's
	// MaxTakeovers the run fails with CodeRecoveryExhausted, and the claim that failed
	// it is counted too (MaxTakeovers + 1).
	Takeovers int `json:"takeovers"`
	// AvailableAt is when the run may next be claimed: its start time while PENDING
	// (moved earlier by its priority, one second per level: WithPriority), its wake
	// time while SLEEPING, its lease expiry while RUNNING. Claims take runs in its order.
	AvailableAt time.Time `json:"available_at"`
	// LockedBy is the id of the worker holding the run while RUNNING.
	LockedBy string `json:"worker_id,omitempty"`
	// CancelRequested: a cancel was asked for and the worker holding the run has
	// not ended it yet (false once the run finished).
	CancelRequested bool      `json:"cancel_requested,omitempty"`
	CreatedAt       time.Time `json:"created_at"`
	// StartedAt is when the run was first claimed (for a run of a concurrency key that
	// continued another as new: when it took over that run's place); nil before.
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	UpdatedAt  time.Time  `json:"updated_at"`
	// ScheduleID and ScheduleTick name the schedule and the tick that fired the run
	// (see CreateSchedule, TriggerSchedule); empty and nil for a run started by Start.
	ScheduleID   string     `json:"schedule_id,omitempty"`
	ScheduleTick *time.Time `json:"schedule_tick,omitempty"`
	// ParentRunID and ParentStepKey name the run and step that started this run as a
	// child (see StartChild); empty for other runs.
	ParentRunID   string `json:"parent_run_id,omitempty"`
	ParentStepKey string `json:"parent_step_key,omitempty"`
	// Version is the workflow version the run started with (see WithVersion); empty
	// until a worker pins it for a run started without one.
	Version string `json:"version,omitempty"`
	// ForkedFromRunID and ForkedFromStep name the run and step this run was forked
	// from (see Client.Fork).
	ForkedFromRunID string `json:"forked_from_run_id,omitempty"`
	ForkedFromStep  string `json:"forked_from_step,omitempty"`
	// Priority, ConcurrencyKey and DebounceKey are the run's flow-control options (see
	// WithPriority, WithConcurrencyKey, WithDebounce).
	Priority       int    `json:"priority,omitempty"`
	ConcurrencyKey string `json:"concurrency_key,omitempty"`
	DebounceKey    string `json:"debounce_key,omitempty"`
	// ContinuedFromRunID names the run this one continued (see ContinueAsNew);
	// ContinuedAsRunID, on a run that ended COMPLETED by continuing as new, names the
	// run that took over its workflow id.
	ContinuedFromRunID string `json:"continued_from_run_id,omitempty"`
	ContinuedAsRunID   string `json:"continued_as_run_id,omitempty"`
	// Hold, filled by GetRun and GetRunByWorkflowID for a PENDING run that could be
	// claimed now (or a SLEEPING one whose wake time came), tells the flow-control
	// limit that holds it back (see SetLimits); nil when none does.
	Hold *Hold `json:"hold,omitempty"`
	// Deadline is when the run fails with CodeDeadlineExceeded if it has not finished
	// (see WithDeadline, WithRunTimeout); nil: none.
	Deadline *time.Time `json:"deadline,omitempty"`
	// Attributes are the run's searchable attributes (see WithAttributes and
	// Context.SetAttributes); nil when it has none. Numbers are float64, as
	// encoding/json decodes them into an any, except integers beyond ±2^53, which a
	// float64 cannot hold exactly: those are json.Number (their digits as stored).
	Attributes map[string]any `json:"attributes,omitempty"`
}

func runInfo(r store.Run) RunInfo {
	info := RunInfo{
		RunID: r.RunID.String(), Namespace: r.Namespace, WorkflowID: r.WorkflowID,
		WorkflowType: r.WorkflowType, Status: r.Status, Input: r.Input, Output: r.Output,
		Error: decodeDetail(r.Error), Attempt: r.Attempt, Takeovers: r.Takeovers, AvailableAt: r.AvailableAt,
		CancelRequested: r.CancelRequested && !r.Status.Terminal(), CreatedAt: r.CreatedAt, StartedAt: r.StartedAt,
		FinishedAt: r.FinishedAt, UpdatedAt: r.UpdatedAt, ScheduleTick: r.ScheduleTick, Deadline: r.Deadline,
		Attributes: decodeAttributes(r.Attributes),
	}
	if r.LeaseEpoch == 0 {
		info.Attempt = 0 // never executed (never claimed)
	}
	if r.ScheduleID != nil {
		info.ScheduleID = *r.ScheduleID
	}
	if r.LockedBy != nil {
		info.LockedBy = *r.LockedBy
	}
	if r.ParentRunID != nil {
		info.ParentRunID = r.ParentRunID.String()
	}
	if r.ParentStepKey != nil {
		info.ParentStepKey = *r.ParentStepKey
	}
	if r.Version != nil {
		info.Version = *r.Version
	}
	if r.ForkedFromRunID != nil {
		info.ForkedFromRunID = r.ForkedFromRunID.String()
	}
	if r.ForkedFromStep != nil {
		info.ForkedFromStep = *r.ForkedFromStep
	}
	if r.ContinuedFromRunID != nil {
		info.ContinuedFromRunID = r.ContinuedFromRunID.String()
	}
	if r.ContinuedAsRunID != nil {
		info.ContinuedAsRunID = r.ContinuedAsRunID.String()
	}
	info.Priority = r.Priority
	if r.FlowKey != nil {
		info.ConcurrencyKey = *r.FlowKey
	}
	if r.DebounceKey != nil {
		info.DebounceKey = *r.DebounceKey
	}
	return info
}

func parseRunID(runID string) (uuid.UUID, error) {
	id, err := uuid.Parse(runID)
	if err != nil {
		return uuid.Nil, invalidArgument("run id %q is not a UUID", runID)
	}
	return id, nil
}

// GetRun reads a run of the client's namespace. A run of another namespace is
// ErrNotFound.
func (c *Client) GetRun(ctx context.Context, runID string) (*RunInfo, error) {
	if err := c.usable("GetRun"); err != nil {
		return nil, err
	}
	id, err := parseRunID(runID)
	if err != nil {
		return nil, err
	}
	r, err := store.GetRun(ctx, c.pool, c.ns, id)
	if err != nil {
		return nil, readError("kagzi: get run "+runID, err)
	}
	info := c.decodeRunInfo(runInfo(r))
	if info.Hold, err = c.hold(ctx, r); err != nil {
		return nil, readError("kagzi: get run "+runID, err)
	}
	return &info, nil
}

// GetRunByWorkflowID reads the run of a workflow id: the active one if there is one,
// else the newest.
func (c *Client) GetRunByWorkflowID(ctx context.Context, workflowID string) (*RunInfo, error) {
	if err := c.usable("GetRunByWorkflowID"); err != nil {
		return nil, err
	}
	if err := validName("workflow id", workflowID); err != nil {
		return nil, err
	}
	r, err := store.GetRunByWorkflowID(ctx, c.pool, c.ns, workflowID)
	if err != nil {
		return nil, readError("kagzi: get run of workflow id "+workflowID, err)
	}
	info := c.decodeRunInfo(runInfo(r))
	if info.Hold, err = c.hold(ctx, r); err != nil {
		return nil, readError("kagzi: get run of workflow id "+workflowID, err)
	}
	return &info, nil
}

// RunFilter selects runs for ListRuns. Zero fields select everything; the fields
// given all apply (AND).
type RunFilter struct {
	Statuses []RunStatus
	// WorkflowType selects the runs of a workflow type.
	WorkflowType string
	// WorkflowTypes selects the runs of any of these workflow types (with
	// WorkflowType: of any of them all).
	WorkflowTypes []string
	// WorkflowID selects the runs of a workflow id.
	WorkflowID string
	// WorkflowIDPrefix selects the runs whose workflow id starts with it ("order-"),
	// compared byte by byte.
	WorkflowIDPrefix string
	CreatedAfter     time.Time // inclusive (to the nanosecond; runs' times are microseconds)
	CreatedBefore    time.Time // exclusive
	// ScheduleID selects the runs a schedule fired.
	ScheduleID string
	// ParentRunID selects the children of a run.
	ParentRunID string
	// RootOnly selects the runs that are no run's child (started by Start,
	// StartByName, StartMany, a schedule or a fork). It cannot go with ParentRunID.
	RootOnly bool
	// Version selects the runs of a workflow version (nil: any).
	Version *string
	// ErrorCode selects the FAILED runs whose recorded error has this code (see
	// ErrorDetail.Code: CodeDeadlineExceeded, or an application's own).
	ErrorCode string
	// Attributes selects the runs whose attributes (see WithAttributes) contain
	// these: every key with an equal value (JSON containment, so a nested object or
	// array matches when it contains the one given). A GIN index serves it, but gives
	// no order: a page is the matching runs sorted, so use keys that select few runs
	// (an order or customer id), or add a filter that does. An empty map selects every
	// run, as nil does.
	Attributes map[string]any
	// OldestFirst lists the oldest runs first; the default is newest first. A page
	// token continues the order it was made in.
	OldestFirst bool
	// IncludePayloads fills each run's Input and Output. Without it they are nil,
	// and a page reads no payload (GetRun always returns them).
	IncludePayloads bool
	// PageSize is the most runs a page holds: default 50, at most 1000.
	PageSize int
	// PageToken continues a listing: pass the NextPageToken of the previous page.
	PageToken string
}

// RunPage is one page of ListRuns.
type RunPage struct {
	Runs []RunInfo
	// NextPageToken fetches the next page; empty on the last page.
	NextPageToken string
}

// ListRuns lists the namespace's runs, newest first (or oldest first, see
// RunFilter.OldestFirst), a page at a time. Pagination is by keyset: a page token names
// the last run of the page before, so pages stay consistent while runs are added: no
// run is listed twice, and none is skipped, except a run whose start committed after
// the listing had passed its creation time (a StartTx in a transaction that lasts: a
// run's creation time is its start statement's, and oldest first the listing passes
// through the recent past). Every page is read in order from an index, except with
// Attributes (see RunFilter.Attributes). Runs come without their Input and Output
// unless IncludePayloads is set.
//
// With Config.ReadPool, ListRuns reads from it (a replica may lag the primary).
func (c *Client) ListRuns(ctx context.Context, f RunFilter) (*RunPage, error) {
	if err := c.usable("ListRuns"); err != nil {
		return nil, err
	}
	return c.listRuns(ctx, c.read, f)
}

// listRuns is ListRuns on db: the bulk operations list the runs they change on the
// primary.
func (c *Client) listRuns(ctx context.Context, db store.DBTX, f RunFilter) (*RunPage, error) {
	p, err := f.params(c.ns)
	if err != nil {
		return nil, err
	}
	want := p.Limit
	p.Limit++ // one more tells whether there is a next page
	runs, err := store.ListRuns(ctx, db, p)
	if err != nil {
		return nil, readError("kagzi: list runs", err)
	}
	page := &RunPage{}
	if len(runs) > want {
		runs = runs[:want]
		last := runs[want-1]
		page.NextPageToken = encodePageToken(last.CreatedAt, last.RunID, f.OldestFirst)
	}
	for _, r := range runs {
		page.Runs = append(page.Runs, c.decodeRunInfo(runInfo(r)))
	}
	return page, nil
}

// Err reports what ListRuns would refuse in the filter (an error wrapping
// ErrInvalidArgument) before reading anything, nil when nothing; CancelRuns and
// RerunRuns refuse the same (besides a PageToken, and with PageSize their own). It
// reads nothing itself: use it to refuse a request before acting on it.
func (f RunFilter) Err() error {
	_, err := f.params("")
	return err
}

// params checks the filter and turns it into the store's parameters for namespace ns.
func (f RunFilter) params(ns string) (store.ListRunsParams, error) {
	p := store.ListRunsParams{Namespace: ns, WorkflowID: f.WorkflowID, WorkflowIDPrefix: f.WorkflowIDPrefix,
		ScheduleID: f.ScheduleID, RootOnly: f.RootOnly, Version: f.Version, ErrorCode: f.ErrorCode,
		Ascending: f.OldestFirst, Payloads: f.IncludePayloads}
	var err error
	if p.Limit, err = pageSize(f.PageSize); err != nil {
		return p, err
	}
	if p.WorkflowTypes, err = workflowTypes(f.WorkflowType, f.WorkflowTypes); err != nil {
		return p, err
	}
	if f.ParentRunID != "" {
		if f.RootOnly {
			return p, invalidArgument("RootOnly and ParentRunID select no run together")
		}
		id, err := parseRunID(f.ParentRunID)
		if err != nil {
			return p, err
		}
		p.ParentRunID = &id
	}
	for what, v := range map[string]string{"workflow id": f.WorkflowID, "workflow id prefix": f.WorkflowIDPrefix,
		"schedule id": f.ScheduleID, "error code": f.ErrorCode} {
		if v != "" {
			if err := validName(what, v); err != nil {
				return p, err
			}
		}
	}
	if len(f.Attributes) > 0 { // an empty filter asks nothing of the attributes
		if p.Attributes, err = encodeAttributes("attribute filter", f.Attributes); err != nil {
			return p, err
		}
	}
	for _, s := range f.Statuses {
		switch s {
		case StatusPending, StatusRunning, StatusSleeping, StatusCompleted, StatusFailed, StatusCancelled:
			p.Statuses = append(p.Statuses, s)
		default:
			return p, invalidArgument("unknown run status %q", s)
		}
	}
	// The database keeps microseconds: a bound between two is rounded up, to the first
	// time it can hold that is not before it (a run created at T is not after T+1ns,
	// and is before it).
	if !f.CreatedAfter.IsZero() {
		after := ceilMicro(f.CreatedAfter)
		p.CreatedAfter = &after
	}
	if !f.CreatedBefore.IsZero() {
		before := ceilMicro(f.CreatedBefore)
		p.CreatedBefore = &before
	}
	if f.PageToken != "" {
		t, id, err := decodePageToken(f.PageToken, f.OldestFirst)
		if err != nil {
			return p, err
		}
		p.AfterCreated, p.AfterRunID = &t, id
	}
	return p, nil
}

// workflowTypes checks and merges RunFilter's WorkflowType and WorkflowTypes.
func workflowTypes(one string, many []string) ([]string, error) {
	types := make([]string, 0, len(many)+1)
	if one != "" {
		types = append(types, one)
	}
	types = append(types, many...)
	for _, t := range types {
		if err := validName("workflow type", t); err != nil {
			return nil, err
		}
	}
	if len(types) == 0 {
		return nil, nil
	}
	return types, nil
}

// The times a page token may hold: years 1 to 9999 (a run's creation time is within).
var (
	minTokenMicros = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	maxTokenMicros = time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC).UnixMicro()
)

// ascendingToken marks a page token of an oldest-first listing.
const ascendingToken = "/asc"

func encodePageToken(t time.Time, id uuid.UUID, ascending bool) string {
	s := strconv.FormatInt(t.UnixMicro(), 10) + "/" + id.String()
	if ascending {
		s += ascendingToken
	}
	return base64.RawURLEncoding.EncodeToString([]byte(s))
}

// decodePageToken reads a page token of a listing in the order ascending; a token of
// the other order is invalid.
func decodePageToken(tok string, ascending bool) (time.Time, uuid.UUID, error) {
	bad := invalidArgument("malformed page token %q", tok)
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return time.Time{}, uuid.Nil, bad
	}
	s, asc := strings.CutSuffix(string(raw), ascendingToken)
	if asc != ascending {
		return time.Time{}, uuid.Nil, invalidArgument("page token %q continues a listing in the other order (OldestFirst = %v)", tok, asc)
	}
	ts, idStr, ok := strings.Cut(s, "/")
	if !ok {
		return time.Time{}, uuid.Nil, bad
	}
	micros, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || micros < minTokenMicros || micros > maxTokenMicros {
		// Out of the years a run's creation can have: no token of a page holds it.
		return time.Time{}, uuid.Nil, bad
	}
	id, err := uuid.Parse(idStr)
	if err != nil {
		return time.Time{}, uuid.Nil, bad
	}
	return time.UnixMicro(micros), id, nil
}

func encodeStringToken(s string) string {
	return base64.RawURLEncoding.EncodeToString([]byte("k/" + s))
}

func decodeStringToken(tok string) (string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || !strings.HasPrefix(string(raw), "k/") {
		return "", invalidArgument("malformed page token %q", tok)
	}
	return string(raw[2:]), nil
}

// StepKind says what a recorded step is.
type StepKind = vocab.StepKind

// Step kinds.
const (
	KindStep   = vocab.KindStep   // a memoized function, see Step
	KindSleep  = vocab.KindSleep  // a durable sleep, see Context.Sleep
	KindChild  = vocab.KindChild  // a child run's start or result, see StartChild
	KindSignal = vocab.KindSignal // a signal wait, see WaitSignal
	KindEvent  = vocab.KindEvent  // an event published, see Context.SetEvent
	KindPatch  = vocab.KindPatch  // a Patched answer, see Context.Patched
	// KindAttributes is a change of the run's attributes, see Context.SetAttributes.
	KindAttributes = vocab.KindAttributes
)

// StepStatus is the state of a recorded step or attempt.
type StepStatus = vocab.StepStatus

// Step and attempt statuses.
const (
	StepCompleted = vocab.StepCompleted // the output is recorded and will be replayed
	StepRetrying  = vocab.StepRetrying  // the last attempt failed; another will run (steps only)
	StepFailed    = vocab.StepFailed    // failed for good (steps); the attempt failed (attempts)
	StepTimedOut  = vocab.StepTimedOut  // the attempt passed its timeout (attempts only)
	StepWaiting   = vocab.StepWaiting   // a signal wait with no signal yet (steps only)
	// StepInterrupted is the StepEvent.Status of an attempt cut short by a cancel, a
	// lost lease, the run's deadline or a shutdown (see Hooks): it is not recorded and
	// does not count, so no listed step or attempt has it.
	StepInterrupted = vocab.StepInterrupted
)

// StepInfo is a recorded step of a run with its attempts, for ListSteps.
type StepInfo struct {
	// Key is the step's name with its occurrence in the run: "send#2".
	Key    string     `json:"key"`
	Name   string     `json:"name"`
	Kind   StepKind   `json:"kind"`
	Status StepStatus `json:"status"`
	// Output is the recorded output of a completed step.
	Output json.RawMessage `json:"output,omitempty"`
	// Error is the error of the last failed attempt.
	Error *ErrorDetail `json:"error,omitempty"`
	// WakeAt is a sleep's wake time, fixed when the sleep first ran.
	WakeAt   *time.Time    `json:"wake_at,omitempty"`
	Attempts []AttemptInfo `json:"attempts"`
	// CreatedAt is when the step was first recorded.
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// AttemptInfo is one attempt of a step. Its times are the worker's clock.
type AttemptInfo struct {
	Number     int          `json:"number"`
	Status     StepStatus   `json:"status"`
	Error      *ErrorDetail `json:"error,omitempty"`
	StartedAt  time.Time    `json:"started_at"`
	FinishedAt time.Time    `json:"finished_at"`
}

// ListSteps lists the recorded steps of a run in the order they were first
// recorded, each with every attempt. A step that is running now, and has not
// finished an attempt yet, is not listed.
func (c *Client) ListSteps(ctx context.Context, runID string) ([]StepInfo, error) {
	if err := c.usable("ListSteps"); err != nil {
		return nil, err
	}
	id, err := parseRunID(runID)
	if err != nil {
		return nil, err
	}
	steps, err := store.ListSteps(ctx, c.pool, c.ns, id)
	if err != nil {
		return nil, readError("kagzi: list steps of run "+runID, err)
	}
	out := make([]StepInfo, 0, len(steps))
	for _, s := range steps {
		si := StepInfo{Key: s.Key, Name: s.Name, Kind: s.Kind, Status: s.Status,
			Output: c.readPayload(s.Output), Error: decodeDetail(s.Error), WakeAt: s.WakeAt, CreatedAt: s.CreatedAt,
			UpdatedAt: s.UpdatedAt}
		for _, a := range s.Attempts {
			si.Attempts = append(si.Attempts, AttemptInfo{Number: a.Number, Status: a.Status,
				Error: decodeDetail(a.Error), StartedAt: a.StartedAt, FinishedAt: a.FinishedAt})
		}
		out = append(out, si)
	}
	return out, nil
}

// Cancel cancels a run. A PENDING or SLEEPING run ends CANCELLED at once. A RUNNING
// run is asked to stop: its worker hears of it at once (a notification, or at the
// latest its next heartbeat), cancels the run's context, and ends it CANCELLED; a
// completion that races with the cancel loses. Cancelling a CANCELLED run is a no-op;
// cancelling a COMPLETED or FAILED one returns ErrRunFinished and changes nothing.
func (c *Client) Cancel(ctx context.Context, runID string) error {
	if err := c.usable("Cancel"); err != nil {
		return err
	}
	return c.cancel(ctx, c.pool, runID)
}

// CancelTx is Cancel inside the caller's transaction: the run is cancelled, and its
// worker and waiters hear of it, only if tx commits. Until then the transaction holds
// the run's row lock, so the run's own writes wait for it.
func (c *Client) CancelTx(ctx context.Context, tx pgx.Tx, runID string) error {
	if err := c.usable("CancelTx"); err != nil {
		return err
	}
	if tx == nil {
		return invalidArgument("nil transaction")
	}
	return c.cancel(ctx, tx, runID)
}

// CancelWorkflow is Cancel of the run of a workflow id: its active run, else its
// newest. It follows a chain of ContinueAsNew: when the run it found continued as new
// before the cancel was stored, it cancels the run that took over the workflow id, so
// a chain that keeps continuing stops. ErrNotFound: no run has the workflow id;
// ErrRunFinished: its newest run is COMPLETED or FAILED.
func (c *Client) CancelWorkflow(ctx context.Context, workflowID string) error {
	if err := c.usable("CancelWorkflow"); err != nil {
		return err
	}
	if err := validName("workflow id", workflowID); err != nil {
		return err
	}
	var last uuid.UUID
	for {
		id, err := store.ActiveRunID(ctx, c.pool, c.ns, workflowID)
		if err != nil {
			return readError("kagzi: cancel workflow id "+workflowID, err)
		}
		err = c.cancel(ctx, c.pool, id.String())
		if !errors.Is(err, ErrRunFinished) || id == last {
			// Done, or the newest run itself is finished: no run took over from it.
			return err
		}
		last = id
	}
}

func (c *Client) cancel(ctx context.Context, db store.DBTX, runID string) error {
	id, err := parseRunID(runID)
	if err != nil {
		return err
	}
	before, _, _, err := store.CancelRun(ctx, db, c.ns, id)
	if err != nil {
		return writeError("kagzi: cancel run "+runID, db, err)
	}
	switch before {
	case StatusCompleted, StatusFailed:
		return fmt.Errorf("%w: run %s is %s", ErrRunFinished, runID, before)
	}
	return nil
}

// pageSize checks a listing's page size: default 50, at most 1000.
func pageSize(n int) (int, error) {
	switch {
	case n == 0:
		return 50, nil
	case n < 0 || n > 1000:
		return 0, invalidArgument("page size %d is not within 1..1000", n)
	}
	return n, nil
}

// ceilMicro rounds t up to a whole microsecond, PostgreSQL's precision.
func ceilMicro(t time.Time) time.Time {
	if r := t.Truncate(time.Microsecond); !r.Equal(t) {
		return r.Add(time.Microsecond)
	}
	return t
}
