package kagzi

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/google/uuid"

	"github.com/kagzi/kagzi/internal/store"
)

// ContinueAsNew ends the run and starts a fresh run of the same workflow, with the
// same workflow id and input as its input: the way a workflow lives for months
// without its history growing (a loop that would run forever continues as new every
// so many iterations, carrying its state in the input). Return its result from the
// workflow function:
//
//	if iteration%1000 == 999 {
//		return State{}, kagzi.ContinueAsNew(ctx, state)
//	}
//
// When the workflow function returns it, the run ends COMPLETED with no output, naming
// the new run in RunInfo.ContinuedAsRunID, and the new run (PENDING, claimable at once)
// names it in ContinuedFromRunID; both happen in one transaction, so there is never a
// moment without a run of the workflow id, nor two. The new run starts with an empty
// history and keeps the workflow id, type, deadline, priority, concurrency key,
// attributes, id reuse policy, parent (a child that continues as new is still its
// parent's child: ChildRun.Get returns the last run's result) and schedule and tick
// (a schedule's overlap policy counts the chain as its tick's run until it ends); it takes the newest
// version an ONLINE worker registered, the one that came last (see
// docs/evolving-workflows.md: continue-as-new is where a long-lived workflow moves to
// new code). Signals the run had not taken yet go to the new run; children it
// started keep running on their own; its events stay with it.
//
// Run.Wait and RunOfWorkflow follow the chain: they return the result of the last run.
// A cancel requested before the run ends wins: it ends CANCELLED and nothing starts.
// Client.CancelWorkflow cancels whichever run of the chain is active.
//
// input must encode with encoding/json as the workflow's input type decodes it; one
// that does not encode is ErrInvalidArgument. ContinueAsNew records nothing by
// itself: only returning it from the workflow function continues the run (returned
// from a branch, or wrapped, it is an ordinary error).
func ContinueAsNew[In any](ctx *Context, input In) error {
	if err := ctx.usable("ContinueAsNew", ctx.WorkflowType()); err != nil {
		return err
	}
	b, err := json.Marshal(input)
	if err != nil {
		return invalidArgument("ContinueAsNew: input of %s does not encode as JSON: %v", ctx.WorkflowType(), err)
	}
	return &continueAsNew{input: b, root: !ctx.sc.branch}
}

// continueAsNew is the error ContinueAsNew returns; see decide.
type continueAsNew struct {
	input []byte
	root  bool // made with the workflow function's own Context, not a branch's
}

func (e *continueAsNew) Error() string {
	return "kagzi: continue as new (return this from the workflow function)"
}

// continueRun writes an endContinue: the run ends and its next run starts, in one
// transaction, after the held-back last step (if any) was recorded.
func (w *Worker) continueRun(x *execution, e ending) {
	w.releaseSlot(x, x.run.ConcurrencyKey != "") // its next run takes its key's place
	final := StatusCompleted
	err := x.flush()
	var next uuid.UUID
	if err == nil {
		next, err = uuid.NewV7()
	}
	var input []byte
	if err == nil {
		input, err = x.rt.payloads.encodePayload("input of "+x.run.WorkflowType, e.output)
	}
	if err == nil {
		err = x.writeNow(func(ctx context.Context, db *writer) (err error) {
			final, err = db.continueRun(ctx, store.ContinueWrite{Fence: x.run.Fence, Next: next, Input: input})
			return err
		})
		if errors.Is(err, errLeaseLost) {
			// A try whose answer the connection lost may have continued the run: then
			// the next run is this execution's, and is counted and told as such.
			if ended, ok := x.endedUnder(); ok && ended.ContinuedAs == next {
				final, err = ended.Status, nil
			}
		}
	}
	switch {
	case errors.Is(err, errLeaseLost):
		x.log().Info("kagzi: the run's lease was lost before it continued as new; another worker takes it over")
		x.rt.endExecution(x, OutcomeLeaseLost, nil)
		return
	case err != nil:
		// The input cannot be stored (or the write failed for good): the run fails.
		x.log().Error("kagzi: cannot continue the run as new", "error", err)
		w.end(x, failed(ErrorDetail{Code: CodeInvalidOutput, NonRetryable: true, Subject: x.run.WorkflowType,
			Message: "cannot continue as new: " + err.Error()}))
		return
	}
	w.client.notifier.Publish(store.DoneTopic(x.run.RunID) + "|" + string(final))
	if final == StatusCompleted {
		w.completed.Add(1)
		x.log().Info("kagzi: run continued as new", "next_run_id", next.String())
		if e, _ := x.ctx.Value(execEventKey{}).(*ExecutionEvent); e != nil {
			e.ContinuedAsRunID = next.String()
		}
	}
	x.rt.endExecution(x, outcomeOf(final, nil), nil)
}
