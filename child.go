package kagzi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/kagzi/kagzi/internal/store"
)

// ChildRun is a handle on a child run started by StartChild.
type ChildRun[Out any] struct {
	// RunID and WorkflowID identify the child run.
	RunID      string
	WorkflowID string

	parent *Context
	key    string
}

type childRef struct {
	RunID      string `json:"run_id"`
	WorkflowID string `json:"workflow_id"`
}

// StartChild starts a run of wf as a child of the running workflow and returns a
// handle on it. The start is memoized as a step: a replay of the parent, even one
// after the child finished, reattaches to the same child and never starts a second.
// The child's workflow id derives from the parent run and the step key
// ("<parent run id>/<key>") unless WithID gives one; either way it is never reused
// (IDReuseNever), so no replay can start the child twice.
//
// A child's workflow id belongs to the parent step that started it. A WithID that
// is held by another run — the child of another parent (or of another step of this
// one), or a run started by Start — makes StartChild return ErrAlreadyExists (also
// NonRetryable), starting nothing: two parents never share a child, since a child's
// end wakes only its own parent.
//
// Await the child's result with Get, or do not, and the child runs on its own
// (fire-and-forget). Cancelling the parent, or its failing on its deadline, cancels
// its active children. The other start options apply as for Start.
func StartChild[In, Out any](ctx *Context, name string, wf *Workflow[In, Out], input In, opts ...StartOption) (*ChildRun[Out], error) {
	if err := ctx.usable("StartChild", name); err != nil {
		return nil, err
	}
	if wf == nil {
		return nil, invalidArgument("child %q: nil workflow", name)
	}
	if err := wf.invalid(); err != nil {
		return nil, err
	}
	var o startOptions
	for _, opt := range opts {
		if opt == nil {
			return nil, invalidArgument("child %q: nil StartOption", name)
		}
		opt(&o)
	}
	if o.idSet && o.id == "" {
		return nil, invalidArgument("child %q: empty workflow id (WithID); leave WithID out to have one derived", name)
	}
	if o.debounce != nil {
		return nil, invalidArgument("child %q: WithDebounce is not allowed; a child is started once", name)
	}
	key, pos, err := ctx.nextKey(name, KindChild)
	if err != nil {
		return nil, err
	}
	ctx.checkAlive()
	x := ctx.x
	if rec, ok := x.hist.get(key); ok && rec.Status == StepCompleted {
		var ref childRef
		if err := json.Unmarshal(rec.Output, &ref); err != nil {
			return nil, NonRetryable(fmt.Errorf("kagzi: recorded child of step %s does not decode: %w", key, err))
		}
		return &ChildRun[Out]{RunID: ref.RunID, WorkflowID: ref.WorkflowID, parent: ctx, key: key}, nil
	}
	b, err := json.Marshal(input)
	if err != nil {
		return nil, NonRetryable(invalidArgument("input of child %s (%s) does not encode as JSON: %v", key, wf.name, err))
	}
	parentID := x.run.RunID
	opts = append([]StartOption{WithRunVersion(wf.version)}, opts...)
	// A derived id names the parent run, so no run of it can have been created
	// before the parent was: the look for an archived run of the id reads only the
	// history's partitions from then on (an hour earlier, for clock adjustments).
	var idNotBefore *time.Time
	if !o.idSet {
		opts = append(opts, WithID(parentID.String()+"/"+key))
		t := x.run.CreatedAt.Add(-time.Hour)
		idNotBefore = &t
	}
	opts = append(opts, WithIDReuse(IDReuseNever))
	var run *Run[json.RawMessage]
	ctx.ensureLease()
	var refused error // a start refused for good: returned, not retried as the write's failure
	err = ctx.write(func(c context.Context, _ *writer) (err error) {
		run, err = x.rt.startChild(withValuesOf(c, ctx), wf.name, b, opts, x.run.Fence, key, idNotBefore)
		if errors.Is(err, ErrNonRetryable) {
			refused, err = err, nil
		}
		return err
	})
	if err == nil {
		err = refused
	}
	if err != nil {
		return nil, err
	}
	ref, _ := json.Marshal(childRef{RunID: run.RunID, WorkflowID: run.WorkflowID})
	ctx.write(func(c context.Context, db *writer) error {
		return db.recordResult(c, store.ResultStep{Fence: x.run.Fence, Key: key, Name: name, Kind: KindChild,
			Status: StepCompleted, Position: &pos, Output: ref})
	})
	x.hist.set(key, store.StepRecord{Kind: KindChild, Status: StepCompleted, Output: ref})
	return &ChildRun[Out]{RunID: run.RunID, WorkflowID: run.WorkflowID, parent: ctx, key: key}, nil
}

// Get waits for the child to end and returns its output; a child that FAILED returns
// a *WorkflowError (with the child's run id and detail), a CANCELLED one ErrCancelled.
// The result is memoized as a step of the parent. While the child runs, the parent is
// released (SLEEPING, no slot held) and woken when the child ends; from a branch (see
// Go), Get waits in process instead. Call Get from the goroutine that started the
// child. A child that continued as new returns the result of its chain's last run,
// also once its first run passed the retention; a child whose whole record is gone
// (the parent asked after Config.Retention) returns a non-retryable error wrapping
// ErrNotFound.
func (c *ChildRun[Out]) Get() (Out, error) {
	var zero Out
	if c == nil || c.parent == nil {
		return zero, invalidArgument("Get on a nil or zero ChildRun; use the one StartChild returned")
	}
	if err := c.parent.usable("ChildRun.Get", c.key); err != nil {
		return zero, err
	}
	ctx, x := c.parent, c.parent.x
	key := c.key + "/result"
	ctx.checkAlive()
	if rec, ok := x.hist.get(key); ok && rec.Status != StepWaiting {
		return childResult[Out](c, rec.Status, rec.Output, rec.Error)
	}
	childID, err := uuid.Parse(c.RunID)
	if err != nil {
		return zero, NonRetryable(fmt.Errorf("kagzi: child run id %q: %w", c.RunID, err))
	}
	poll := 50 * time.Millisecond
	for {
		var o store.RunOutcome
		err := ctx.write(func(cc context.Context, db *writer) (err error) {
			o, err = db.runOutcome(cc, childID, x.run.Namespace, c.WorkflowID, x.run.RunID)
			return err
		})
		switch {
		case errors.Is(err, store.ErrNotFound):
			return zero, NonRetryable(fmt.Errorf("kagzi: child run %s (workflow id %q): %w: its record is gone "+
				"(removed by the retention before Get read its result)", c.RunID, c.WorkflowID, ErrNotFound))
		case err != nil:
			return zero, fmt.Errorf("kagzi: result of child run %s: %w", c.RunID, err)
		}
		if o.Status.Terminal() {
			status, errDetail := StepCompleted, []byte(nil)
			if o.Status != StatusCompleted {
				status = StepFailed
				errDetail = o.Error
				if o.Status == StatusCancelled {
					errDetail = encodeDetail(ErrorDetail{Code: CodeCancelled, Message: "the child run was cancelled", Subject: c.RunID})
				}
			}
			ctx.write(func(cc context.Context, db *writer) error {
				return db.recordResult(cc, store.ResultStep{Fence: x.run.Fence, Key: key, Name: key, Kind: KindChild,
					Status: status, Output: o.Output, Error: errDetail})
			})
			x.hist.set(key, store.StepRecord{Kind: KindChild, Status: status, Output: o.Output, Error: errDetail})
			return childResult[Out](c, status, o.Output, errDetail)
		}
		if ctx.canSuspend() {
			// Sleep until the child ends (its end wakes this run), re-checking hourly.
			ctx.write(func(cc context.Context, db *writer) error {
				_, err := db.suspendForWait(cc, store.WaitWrite{Fence: x.run.Fence, WakeAt: x.dbNow().Add(time.Hour)})
				return err
			})
			ctx.stop(exitSuspended)
		}
		ctx.waitInProcess(poll)
		poll = min(poll*2, time.Second)
	}
}

func childResult[Out any](c *ChildRun[Out], status StepStatus, output, errDetail []byte) (Out, error) {
	var out Out
	if status == StepCompleted {
		if err := c.parent.x.rt.payloads.unmarshalPayload(output, &out); err != nil {
			return out, NonRetryable(fmt.Errorf("kagzi: output of child run %s does not decode into %s: %w",
				c.RunID, typeName[Out](), err))
		}
		return out, nil
	}
	d := decodeDetail(errDetail)
	if d != nil && d.Code == CodeCancelled {
		return out, fmt.Errorf("%w: child run %s (workflow id %q)", ErrCancelled, c.RunID, c.WorkflowID)
	}
	we := &WorkflowError{RunID: c.RunID, WorkflowID: c.WorkflowID}
	if d != nil {
		we.Detail = *d
	}
	return out, we
}

// startChild inserts a child run (as Start does) linked to its parent's step, while
// the parent's lease (parent) holds: a worker that lost it starts nothing
// (store.ErrLeaseLost).
func (c *Client) startChild(ctx context.Context, workflowType string, input []byte, opts []StartOption,
	parent store.Fence, parentKey string, idNotBefore *time.Time) (*Run[json.RawMessage], error) {
	run, err := c.startRun(ctx, nil, workflowType, input, opts, func(n *store.NewRun) {
		n.ParentRunID, n.ParentStepKey = &parent.RunID, parentKey
		n.ParentFence = &parent
		n.IDNotBefore = idNotBefore
	})
	if err != nil && (errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrAlreadyExists) || errors.Is(err, ErrNoWorker)) {
		return nil, NonRetryable(err)
	}
	return run, err
}
