package kagzi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi/internal/store"
)

// ErrSignalTimeout is returned by WaitSignal when its timeout passes first.
var ErrSignalTimeout = errors.New("kagzi: signal wait timed out")

// SignalOption configures Signal, SignalTx and SignalWorkflow.
type SignalOption func(*signalOptions)

type signalOptions struct {
	key    string
	keySet bool
}

// SignalKey makes the signal idempotent: a signal sent to a run that already has a
// signal of this key (whatever its name or payload, consumed or not) is not stored
// again, and the send returns nil, even once the run finished. Retrying a Signal
// whose outcome is unknown (a timeout, a lost connection) with the same key is then
// safe. The key is 1 to 255 bytes of UTF-8 without control characters; it is kept
// with the run's signals (pruned with the run). Keys are a run's: a signal not yet
// taken moves, with its key, to the run a continue-as-new starts (a retry sent to the
// first run's id then finds it there and returns nil), but the keys of the signals the
// run took stay with it, so a retry sent by workflow id after the run continued as new
// is stored again for the next run.
func SignalKey(key string) SignalOption {
	return func(o *signalOptions) { o.key, o.keySet = key, true }
}

// Signal sends a named signal with a payload (JSON-encoded) to a run of the client's
// namespace. Signals are kept until the run waits for them (WaitSignal) and each is
// delivered once, in the order sent; a run sleeping in WaitSignal for that name
// wakes at once. Signalling a finished run returns ErrRunFinished and stores nothing
// (unless SignalKey finds the signal already stored).
func (c *Client) Signal(ctx context.Context, runID, name string, payload any, opts ...SignalOption) error {
	if err := c.usable("Signal"); err != nil {
		return err
	}
	return c.signal(ctx, c.pool, runID, name, payload, opts, false)
}

// SignalTx is Signal inside the caller's transaction: the signal exists only if tx commits.
// The signal updates the run's row (it may wake the run), which stays locked until tx
// ends: keep tx short, as the run's worker waits for it to write the run. In a
// REPEATABLE READ or SERIALIZABLE transaction, a run whose row changed after tx's
// snapshot (a heartbeat, a step's end) makes the signal fail with PostgreSQL's
// serialization failure (SQLSTATE 40001): roll back and retry the transaction. An
// invalid run id, name, option or payload (one PostgreSQL cannot store too: a NUL
// character, bytes that are not UTF-8) is refused with ErrInvalidArgument before
// anything is sent, so the transaction stays usable.
func (c *Client) SignalTx(ctx context.Context, tx pgx.Tx, runID, name string, payload any, opts ...SignalOption) error {
	if err := c.usable("SignalTx"); err != nil {
		return err
	}
	if tx == nil {
		return invalidArgument("nil transaction")
	}
	return c.signal(ctx, tx, runID, name, payload, opts, false)
}

// SignalWorkflow is Signal to the run of a workflow id (its active run, else its newest).
// A run that continued as new (ContinueAsNew) before the signal was stored passes it
// on to the run that took over the workflow id: a workflow id that always has an
// active run never gives ErrRunFinished.
func (c *Client) SignalWorkflow(ctx context.Context, workflowID, name string, payload any, opts ...SignalOption) error {
	if err := c.usable("SignalWorkflow"); err != nil {
		return err
	}
	if err := validName("workflow id", workflowID); err != nil {
		return err
	}
	id, err := store.ActiveRunID(ctx, c.pool, c.ns, workflowID)
	if err != nil {
		return readError("kagzi: signal workflow id "+workflowID, err)
	}
	return c.signal(ctx, c.pool, id.String(), name, payload, opts, true)
}

// signal sends a signal to a run; with follow, a run that continued as new passes it
// on to the next run of its workflow id (and that one to its next, and so on).
func (c *Client) signal(ctx context.Context, db store.DBTX, runID, name string, payload any, opts []SignalOption, follow bool) error {
	id, err := parseRunID(runID)
	if err != nil {
		return err
	}
	if err := validName("signal name", name); err != nil {
		return err
	}
	if strings.ContainsRune(name, '#') {
		// WaitSignal's name is a step name, which cannot hold '#': no wait could
		// ever receive it.
		return invalidArgument("signal name %q: a signal name cannot contain '#' (no WaitSignal can wait for it)", name)
	}
	var o signalOptions
	for _, opt := range opts {
		if opt == nil {
			return invalidArgument("signal %q: nil SignalOption", name)
		}
		opt(&o)
	}
	var key *string
	if o.keySet {
		if err := validName("signal key", o.key); err != nil {
			return err
		}
		key = &o.key
	}
	b, err := json.Marshal(payload)
	if err != nil {
		return invalidArgument("payload of signal %q does not encode as JSON: %v", name, err)
	}
	if b, err = c.encodePayload(fmt.Sprintf("payload of signal %q", name), b); err != nil {
		return err
	}
	began := time.Now()
	sent, err := store.SendSignal(ctx, db, store.SignalSend{Namespace: c.ns, RunID: id, Name: name, Payload: b, Key: key})
	for err == nil && follow && !sent.Duplicate && sent.Status.Terminal() && sent.ContinuedAs != nil {
		id = *sent.ContinuedAs
		sent, err = store.SendSignal(ctx, db, store.SignalSend{Namespace: c.ns, RunID: id, Name: name, Payload: b, Key: key})
	}
	if err == nil && !follow && key != nil && !sent.Duplicate && sent.Status.Terminal() && sent.ContinuedAs != nil {
		// A retry of a keyed signal whose first send was stored and then moved, not
		// taken, to the run this one continued as: it was delivered, not refused.
		if sent.Duplicate, err = store.SignalKeyMoved(ctx, db, id, *key); err != nil {
			c.hookSignalSent(ctx, id, name, began, err)
			return readError("kagzi: signal run "+runID, err) // the send stored nothing; this looks
		}
	}
	if err == nil && !sent.Duplicate && sent.Status.Terminal() {
		err = fmt.Errorf("%w: run %s is %s", ErrRunFinished, id, sent.Status)
		c.hookSignalSent(ctx, id, name, began, err) // refused: nothing stored
		return err
	}
	c.hookSignalSent(ctx, id, name, began, err)
	if err != nil {
		return writeError("kagzi: signal run "+runID, db, err)
	}
	return nil
}

// WaitSignal waits durably for the next signal of the name sent to this run and
// returns its payload. A signal sent before the wait is received at once. With a
// positive timeout, fixed when the wait first runs (a restart does not extend it),
// WaitSignal returns ErrSignalTimeout when it passes first; with 0 it waits for ever.
//
// While it waits, the run is released (SLEEPING, no slot held) and woken by the
// signal's NOTIFY; from a branch (see Go) it waits in process. The outcome is
// memoized as a step: a replay returns the same payload (or timeout).
func WaitSignal[T any](ctx *Context, name string, timeout time.Duration) (T, error) {
	var zero T
	if timeout < 0 {
		return zero, invalidArgument("signal %q: negative timeout %v", name, timeout)
	}
	key, pos, err := ctx.nextKey(name, KindSignal)
	if err != nil {
		return zero, err
	}
	ctx.checkAlive()
	x := ctx.x
	if rec, ok := x.hist.get(key); ok && rec.Status != StepWaiting {
		return signalResult[T](x, key, rec.Status, rec.Output)
	}
	poll := 50 * time.Millisecond
	for {
		var w store.SignalWait
		ctx.ensureLease()
		ctx.write(func(c context.Context, db *writer) (err error) {
			w, err = db.takeSignal(c, store.SignalTake{Fence: x.run.Fence, Key: key, Name: name, Position: pos, Timeout: timeout})
			return err
		})
		if w.Received {
			x.hist.set(key, store.StepRecord{Kind: KindSignal, Status: StepCompleted, Output: w.Payload})
			ctx.hookSignalWait(key, name, SignalReceived)
			return signalResult[T](x, key, StepCompleted, w.Payload)
		}
		if w.TimeoutAt != nil && !w.DBNow.Before(*w.TimeoutAt) {
			d := encodeDetail(ErrorDetail{Code: CodeDeadlineExceeded, Message: "signal wait timed out", Subject: key})
			ctx.write(func(c context.Context, db *writer) error {
				return db.recordResult(c, store.ResultStep{Fence: x.run.Fence, Key: key, Name: name, Kind: KindSignal,
					Status: StepFailed, Position: &pos, Error: d})
			})
			x.hist.set(key, store.StepRecord{Kind: KindSignal, Status: StepFailed, Error: d})
			ctx.hookSignalWait(key, name, SignalTimedOut)
			return zero, fmt.Errorf("%w: %s", ErrSignalTimeout, key)
		}
		wake := w.DBNow.Add(time.Hour) // a safety re-check; the signal itself wakes the run
		if w.TimeoutAt != nil && w.TimeoutAt.Before(wake) {
			wake = *w.TimeoutAt
		}
		remaining := wake.Sub(w.DBNow)
		if ctx.canSuspend() && remaining > x.rt.cfg.MaxInProcessSleep {
			ctx.hookSignalWait(key, name, SignalWaiting)
			ctx.write(func(c context.Context, db *writer) error {
				_, err := db.suspendForWait(c, store.WaitWrite{Fence: x.run.Fence, WakeAt: wake, Signal: name})
				return err
			})
			ctx.stop(exitSuspended)
		}
		ctx.waitInProcess(min(poll, remaining))
		poll = min(poll*2, time.Second)
	}
}

func signalResult[T any](x *execution, key string, status StepStatus, payload []byte) (T, error) {
	var out T
	if status != StepCompleted {
		return out, fmt.Errorf("%w: %s", ErrSignalTimeout, key)
	}
	if err := x.rt.payloads.unmarshalPayload(payload, &out); err != nil {
		return out, NonRetryable(fmt.Errorf("kagzi: signal %s of run %s does not decode into %s: %w",
			key, x.run.RunID, typeName[T](), err))
	}
	return out, nil
}
