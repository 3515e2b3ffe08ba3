package kagzi

import (
	"context"
	"errors"
	"runtime/debug"

	"github.com/kagzi/kagzi/internal/store"
)

// execute runs the workflow function of a claimed run (see runFunction), decides how
// the execution ended (decide), and writes that.
func (w *Worker) execute(x *execution) {
	if x.alone {
		w.markAlone(x)
	}
	x.runFunction(w)
}

// afterFunction decides how the execution ended, given what the workflow function did
// (res), and writes that.
func (w *Worker) afterFunction(x *execution, res result) {
	defer w.executionDone(x)
	x.mu.Lock()
	s := stopped{reason: x.exit, res: res, workflowType: x.run.WorkflowType, attempt: x.run.Attempt,
		policy: x.def.retry.or(w.cfg.DefaultRetry).or(DefaultRetry), maxBytes: x.rt.payloads.maxBytes,
		nondeterminism: x.nondeterminism, takeovers: x.run.Takeovers, maxTakeovers: w.cfg.MaxTakeovers}
	x.mu.Unlock()
	if x.ctx.Err() != nil {
		s.cause = context.Cause(x.ctx)
	}
	e := decide(s)
	switch e.kind {
	case endNothing:
		x.rt.endExecution(x, e.hookOutcome(), nil)
	case endHandBack:
		// A completed step whose record was held back is written before the run is
		// handed back, so that the next worker does not run it again.
		if err := x.flush(); err != nil {
			x.log().Warn("kagzi: cannot record the last step before handing the run back", "error", err)
		}
		w.mu.Lock()
		w.handBack = append(w.handBack, x.run.Fence)
		w.mu.Unlock()
		x.rt.endExecution(x, e.hookOutcome(), nil)
	case endRetry:
		x.retry(e)
		x.rt.endExecution(x, e.hookOutcome(), e.detailBytes())
	case endFinish:
		w.end(x, e)
	case endContinue:
		w.continueRun(x, e)
	}
}

// runFunction calls the workflow function with the run's input on the calling
// goroutine, then w.afterFunction with how it ended. A panic is a failure of the
// function (CodePanic, with its stack), and so is a call of runtime.Goexit by the
// function or a step body on its goroutine. A run cancelled, past its deadline or taken
// over too often before it started does not run at all.
//
// Step and Sleep unwind the function with runtime.Goexit (when the run sleeps, or its
// lease was lost), which ends the goroutine: afterFunction then runs on another
// goroutine of the pool. A function that returns (most do) costs no hand-off: running
// it on a goroutine of its own and waiting for it cost a busy worker a goroutine
// switch, a channel and a closure a run.
func (x *execution) runFunction(w *Worker) {
	var res result
	after := false
	defer func() {
		if !after {
			// The goroutine is ending (runtime.Goexit; also when a deferred call of the
			// function panicked while Goexit unwound it and the panic was recovered
			// below: the Goexit goes on): the execution goes on elsewhere.
			x.rt.goroutines.Go(func() { w.afterFunction(x, res) })
		}
	}()
	wctx := &Context{Context: x.ctx, x: x, sc: &scope{counts: map[string]int{}}}
	func() {
		defer func() {
			wctx.sc.ended.Store(true)
			if r := recover(); r != nil {
				res = result{returned: true, err: &panicError{value: r, stack: string(debug.Stack())}}
			} else if !res.returned && x.exitReason() == exitNone {
				// Unwound, and not by the engine (which records why first): the
				// function, or a step body running on its goroutine, called
				// runtime.Goexit. A failure, as a panic is; not a lost lease, after
				// which the run would be taken over and unwound again, MaxTakeovers times.
				res = result{returned: true, err: goexited(x.goexitWhere())}
			}
		}()
		res = x.callFunction(wctx)
	}()
	after = true
	w.afterFunction(x, res)
}

// callFunction decodes the run's input and calls the workflow function with it.
func (x *execution) callFunction(wctx *Context) result {
	wctx.checkAlive()
	input, err := x.rt.payloads.decodePayload(x.run.Input)
	if err != nil {
		return result{returned: true, err: inputCodecError(&x.run, err)}
	}
	out, err := x.def.run(wctx, input)
	if err == nil {
		out, err = x.rt.payloads.encodeRunOutput(&x.run, out)
	}
	return result{returned: true, out: out, err: err}
}

// retry writes the next attempt of a run whose workflow function failed; see endRetry.
func (x *execution) retry(e ending) {
	err := x.write(func(ctx context.Context, db *writer) error {
		return db.retryRun(ctx, x.run.Fence, e.detailBytes(), e.retryIn)
	})
	if err != nil && !errors.Is(err, errLeaseLost) {
		x.log().Error("kagzi: cannot schedule the run's next attempt", "error", err)
	}
	x.log().Info("kagzi: run attempt failed; retrying", "attempt", x.run.Attempt, "retry_in", e.retryIn,
		"error", e.detail.Message)
}

// end writes the run's end, with its last step if the step's record was held back,
// and tells this client's waiters. The run's slot is free once the end is queued.
func (w *Worker) end(x *execution, e ending) {
	last := x.takePending()
	w.releaseSlot(x, false)
	final, e, err := x.finish(e, last)
	if errors.Is(err, errLeaseLost) {
		// A try whose answer the connection lost may have ended the run: then the
		// end is this execution's, and is counted and told as such. (Another end
		// under the same claim, a deadline's, records another status or code; a
		// cancel's turns any end CANCELLED, as a cancel requested before the end
		// would have.)
		code := ""
		if e.detail != nil {
			code = e.detail.Code
		}
		if ended, ok := x.endedUnder(); ok && (ended.Status == StatusCancelled ||
			(ended.Status == e.status && ended.Code == code)) {
			final, err = ended.Status, nil
		}
	}
	if err == nil {
		// This client's waiters hear of the end from us, with what it recorded; others'
		// from the end's own NOTIFY, when there are any (see waiters.go).
		w.client.notifier.PublishValue(store.DoneTopic(x.run.RunID)+"|"+string(final),
			&runEnd{status: final, output: e.output, detail: e.detailBytes(), workflowID: x.run.WorkflowID})
	}
	switch {
	case errors.Is(err, errLeaseLost):
		x.log().Info("kagzi: the run's lease was lost before its end was recorded; another worker takes it over")
	case err != nil:
		x.log().Error("kagzi: cannot record the end of the run", "error", err)
	case e.status == StatusCompleted:
		w.completed.Add(1)
	case e.status == StatusFailed:
		w.failed.Add(1)
	}
	x.rt.endExecution(x, outcomeOf(e.status, err), e.detailBytes())
}

// endedUnder reports how the run ended when it ended under this execution's claim
// (see store.EndedUnder); ok is false when it did not, or the database cannot tell
// now.
func (x *execution) endedUnder() (store.RunEnded, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), x.rt.cfg.LeaseDuration)
	defer cancel()
	ended, ok, err := store.EndedUnder(ctx, x.rt.db.pool, x.run.Fence)
	return ended, ok && err == nil
}

// finish writes the run's end e in one statement with last, its held-back last step
// (nil: none), and returns the status the run ended with (CANCELLED when a cancel
// came first) and the ending written. When the database rejects the statement, it
// tells whether the step or the end was at fault by writing the step alone: a step
// that cannot be recorded fails the run. An output the database rejects (jsonb
// cannot hold a NUL character, say) fails the run too: retried, it would fail for ever.
func (x *execution) finish(e ending, last *store.StepWrite) (RunStatus, ending, error) {
	var final RunStatus
	write := func(e ending, last *store.StepWrite) error {
		return x.writeNow(func(ctx context.Context, db *writer) (err error) {
			final, err = db.finish(ctx, store.FinishWrite{Fence: x.run.Fence, Status: e.status, Output: e.output,
				Error: e.detailBytes(), Last: last, HeldSlot: x.run.HoldsSlot})
			return err
		})
	}
	err := write(e, last)
	if err != nil && last != nil && !errors.Is(err, errLeaseLost) {
		x.flushMu.Lock()
		x.pending = last
		x.flushMu.Unlock()
		if ferr := x.flush(); ferr != nil {
			if errors.Is(ferr, errLeaseLost) {
				return final, e, ferr
			}
			e = failed(errorOf(ferr, CodeStepError, x.run.WorkflowType))
		}
		err = write(e, nil)
	}
	if err != nil && !errors.Is(err, errLeaseLost) && e.status == StatusCompleted {
		x.log().Error("kagzi: the run's output cannot be recorded", "error", err)
		e = failed(ErrorDetail{Code: CodeInvalidOutput, NonRetryable: true, Subject: x.run.WorkflowType,
			Message: "the output cannot be recorded: " + err.Error()})
		err = write(e, nil)
	}
	return final, e, err
}
