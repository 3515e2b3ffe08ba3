package kagzi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi/internal/store"
)

// Rerun runs a FAILED or CANCELLED run again from its first step that did not
// complete: it becomes PENDING (claimable now) with its attempt bumped, its error,
// cancel request and deadline cleared; completed steps are kept and replay, so only
// the failed step and what follows run. Use it after fixing the code (or the world)
// that made the run fail. A run in any other status returns ErrInvalidArgument; a run
// whose workflow id another active run holds meanwhile returns ErrAlreadyExists. A
// debounced run leaves its debounce when rerun (RunInfo.DebounceKey is empty after):
// later starts of its debounce key start or join another run.
func (c *Client) Rerun(ctx context.Context, runID string) error {
	if err := c.usable("Rerun"); err != nil {
		return err
	}
	id, err := parseRunID(runID)
	if err != nil {
		return err
	}
	before, err := store.RerunRun(ctx, c.pool, c.ns, id)
	switch {
	case errors.Is(err, store.ErrActiveRunExists):
		return fmt.Errorf("%w: run %s: %v", ErrAlreadyExists, runID, err)
	case err != nil:
		return wrapStoreErr("kagzi: rerun run "+runID, err)
	case before != StatusFailed && before != StatusCancelled:
		return invalidArgument("run %s is %s; only FAILED or CANCELLED runs can be rerun", runID, before)
	}
	return nil
}

// Retry is Rerun.
//
// Deprecated: use Rerun; Retry is the name of the retry policy type.
func (c *Client) Retry(ctx context.Context, runID string) error { return c.Rerun(ctx, runID) }

// ForkOptions configure Fork. Zero fields keep the origin's.
type ForkOptions struct {
	// Input replaces the origin's input (encoded with encoding/json; a
	// json.RawMessage is stored as it is).
	Input any
	// Version starts the fork at another workflow version (see WithVersion).
	Version *string
	// ID is the fork's workflow id; default a new unique one.
	ID string
}

// Fork starts a new run of the origin's workflow that begins with copies of the
// origin's completed steps recorded before its step fromStep (a step key such as
// "charge#1"), so it replays them and runs from fromStep on. The fork records its
// origin (RunInfo.ForkedFromRunID, ForkedFromStep), and from the start the events and
// attributes its copied steps set (docs/evolving-workflows.md says which attributes).
// Use it to try a fix on a copy, or
// to redo the end of a run with another input or version. A fork cannot wait on the
// origin's child: when a copied StartChild's child is still running and its result is
// not among the copied steps, Fork returns ErrInvalidArgument and starts nothing.
func (c *Client) Fork(ctx context.Context, runID, fromStep string, o ForkOptions) (*Run[json.RawMessage], error) {
	if err := c.usable("Fork"); err != nil {
		return nil, err
	}
	id, err := parseRunID(runID)
	if err != nil {
		return nil, err
	}
	origin, err := store.GetRun(ctx, c.pool, c.ns, id)
	if err != nil {
		return nil, wrapStoreErr("kagzi: fork run "+runID, err)
	}
	input, err := c.decodePayload(origin.Input) // startRun encodes it again
	if err != nil {
		return nil, fmt.Errorf("kagzi: fork run %s: %w", runID, err)
	}
	if o.Input != nil {
		if raw, ok := o.Input.(json.RawMessage); ok && json.Valid(raw) {
			input = raw
		} else if input, err = json.Marshal(o.Input); err != nil {
			return nil, invalidArgument("fork input does not encode as JSON: %v", err)
		}
	}
	version := o.Version
	if version == nil {
		version = origin.Version
	}
	opts := []StartOption{}
	if version != nil {
		opts = append(opts, WithRunVersion(*version))
	}
	if o.ID != "" {
		opts = append(opts, WithID(o.ID))
	}
	var run *Run[json.RawMessage]
	err = store.InTx(ctx, c.pool, store.TxIdleLimit, func(tx pgx.Tx) error {
		run, err = c.startRun(ctx, tx, origin.WorkflowType, input, opts, func(n *store.NewRun) {
			n.ForkedFromRunID, n.ForkedFromStep = &origin.RunID, fromStep
		})
		if err != nil {
			return err
		}
		if run.AlreadyExists {
			return fmt.Errorf("%w: workflow id %q is held by run %s", ErrAlreadyExists, run.WorkflowID, run.RunID)
		}
		forkID, _ := parseRunID(run.RunID)
		_, err := store.CopyStepsBefore(ctx, tx, origin.RunID, origin.Attributes, fromStep, forkID)
		if errors.Is(err, store.ErrNotFound) {
			return invalidArgument("run %s has no step %q", runID, fromStep)
		}
		var active *store.ChildActiveError
		if errors.As(err, &active) {
			// Its end would wake the origin, not the fork, which would wait on it for
			// an hour at a time; and the fork would not own it (a cancel of the fork
			// would leave it running).
			return invalidArgument("fork run %s from %q: %v; fork from its StartChild step or before it, or once "+
				"the child has ended", runID, fromStep, active)
		}
		return err
	})
	if err != nil {
		return nil, dbError("kagzi: fork run "+runID, err)
	}
	return run, nil
}
