package kagzi

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/kagzi/kagzi/internal/store"
)

// StartMany starts one run of wf per input in a single statement (one round trip and
// one commit, and one notification for the workers, whatever the number of inputs).
// Each run gets a generated workflow id, so WithID is not allowed; the other start
// options apply to every run (WithAttributes gives each run the same attributes;
// RequireWorker checks the registry once). The runs are returned in the inputs' order. The Start
// hooks (Config.Hooks) are called for each run: every StartBegin before the insert
// (each run stores the carrier its StartBegin filled), every StartEnd after it.
func StartMany[In, Out any](ctx context.Context, c *Client, wf *Workflow[In, Out], inputs []In, opts ...StartOption) ([]*Run[Out], error) {
	if err := c.usable("StartMany"); err != nil {
		return nil, err
	}
	if err := wf.invalid(); err != nil {
		return nil, err
	}
	o := startOptions{version: &wf.version}
	for _, opt := range opts {
		if opt == nil {
			return nil, invalidArgument("StartMany of %q: nil StartOption", wf.name)
		}
		opt(&o)
	}
	if o.idSet {
		return nil, invalidArgument("StartMany generates the workflow ids; WithID is not allowed")
	}
	if o.debounce != nil {
		return nil, invalidArgument("StartMany starts every input; WithDebounce is not allowed")
	}
	if o.reuse != IDReuseAfterFinish && o.reuse != IDReuseNever {
		return nil, invalidArgument("StartMany of %q: unknown IDReuse %d", wf.name, o.reuse)
	}
	like := store.NewRun{Namespace: c.ns, WorkflowType: wf.name, Version: o.version}
	if err := o.flowOptions(&like); err != nil {
		return nil, err
	}
	if err := validVersion(*o.version); err != nil {
		return nil, err
	}
	var err error
	if like.StartAt, like.Deadline, err = o.times(time.Now()); err != nil {
		return nil, err
	}
	attrs, err := o.startAttributes()
	if err != nil {
		return nil, err
	}
	ids := make([]uuid.UUID, len(inputs))
	encoded := make([][]byte, len(inputs))
	for i, in := range inputs {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, invalidArgument("input %d of %s does not encode as JSON: %v", i, wf.name, err)
		}
		if encoded[i], err = c.encodePayload(fmt.Sprintf("input %d of %s", i, wf.name), b); err != nil {
			return nil, err
		}
		if ids[i], err = uuid.NewV7(); err != nil {
			return nil, fmt.Errorf("kagzi: start many: %w", err)
		}
	}
	if len(inputs) == 0 {
		return nil, nil
	}
	if o.requireWorker {
		if err := c.requireWorker(ctx, nil, wf.name, o.version); err != nil {
			return nil, err
		}
	}
	var carriers [][]byte
	var hooked []startHook
	if c.hooks != nil {
		carriers, hooked = make([][]byte, len(ids)), make([]startHook, len(ids))
		for i, id := range ids {
			n := store.NewRun{RunID: id, Namespace: c.ns, WorkflowID: id.String(), WorkflowType: wf.name}
			hooked[i].ctx, hooked[i].e = c.hookStartBegin(ctx, &n)
			carriers[i] = n.Carrier
		}
	}
	err = store.InsertManyRuns(ctx, c.pool, store.ManyRuns{Namespace: c.ns, WorkflowType: wf.name, Version: o.version,
		IDs: ids, Inputs: encoded, Carriers: carriers, StartAt: like.StartAt, Deadline: like.Deadline, Attributes: attrs,
		Priority: like.Priority, FlowKey: like.FlowKey, ReuseNever: o.reuse == IDReuseNever})
	for i, h := range hooked {
		c.hookStartEnd(h.ctx, h.e, store.Run{RunID: ids[i], WorkflowType: wf.name}, err == nil, err)
	}
	if err != nil {
		return nil, dbError("kagzi: start many "+wf.name, err)
	}
	runs := make([]*Run[Out], len(ids))
	for i, id := range ids {
		runs[i] = &Run[Out]{RunID: id.String(), WorkflowID: id.String(), WorkflowType: wf.name, client: c}
	}
	return runs, nil
}

// startHook is the context and event of one run's StartBegin, for its StartEnd.
type startHook struct {
	ctx context.Context
	e   *StartEvent
}
