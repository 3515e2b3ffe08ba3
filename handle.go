package kagzi

import (
	"context"
)

// RunOf returns a handle on the run runID of the client's namespace, typed by the
// workflow's output, so that a request or process other than the one that started
// the run can wait for its result: POST starts the run and answers with its id, GET
// waits.
//
//	run := kagzi.RunOf[Receipt](client, runID)
//	receipt, err := run.Wait(ctx)
//
// It reads nothing, so its WorkflowID and WorkflowType are empty (RunOfWorkflow
// fills them); Wait reports a run id that is not a UUID (ErrInvalidArgument), or of
// no run of the namespace (ErrNotFound). Out must be the type the run's output
// decodes into, as for Start.
func RunOf[Out any](c *Client, runID string) *Run[Out] {
	return &Run[Out]{RunID: runID, client: c}
}

// RunOfWorkflow returns a handle on the run of a workflow id (the active run of the
// id, else its newest), typed by the workflow's output, to wait for its result from
// any request or process; see RunOf. It reads the run: ErrNotFound when the id has
// none in the client's namespace.
func RunOfWorkflow[Out any](ctx context.Context, c *Client, workflowID string) (*Run[Out], error) {
	if err := c.usable("RunOfWorkflow"); err != nil {
		return nil, err
	}
	info, err := c.GetRunByWorkflowID(ctx, workflowID)
	if err != nil {
		return nil, err
	}
	return &Run[Out]{RunID: info.RunID, WorkflowID: info.WorkflowID, WorkflowType: info.WorkflowType, client: c}, nil
}
