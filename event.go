package kagzi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/kagzi/kagzi/internal/store"
)

// SetEvent publishes a key/value state of the running workflow (progress, a
// confirmation URL, ...) that callers read with GetEvent or wait for with WaitEvent.
// A later SetEvent of the same key replaces the value. The call is memoized as a
// step: a replay does not write again.
func (c *Context) SetEvent(key string, value any) error {
	if err := validName("event key", key); err != nil {
		return err
	}
	stepKey, pos, err := c.nextKey(key, KindEvent)
	if err != nil {
		return err
	}
	c.checkAlive()
	x := c.x
	if _, ok := x.hist.get(stepKey); ok {
		return nil
	}
	b, err := json.Marshal(value)
	if err != nil {
		return NonRetryable(invalidArgument("event %q does not encode as JSON: %v", key, err))
	}
	if b, err = x.rt.payloads.encodePayload(fmt.Sprintf("kagzi: event %q", key), b); err != nil {
		return NonRetryable(err)
	}
	c.ensureLease()
	if err := c.write(func(ctx context.Context, db *writer) error {
		return db.setEvent(ctx, store.EventWrite{Fence: x.run.Fence, StepKey: stepKey, Key: key, Position: pos, Value: b})
	}); err != nil {
		// The database refused the value (a NUL character, which jsonb cannot hold):
		// nothing was published, and the workflow hears it (ErrInvalidArgument).
		return NonRetryable(dbError(fmt.Sprintf("kagzi: event %q", key), err))
	}
	x.hist.set(stepKey, store.StepRecord{Kind: KindEvent, Status: StepCompleted, Output: b})
	return nil
}

// GetEvent reads the event key of a run of the client's namespace. It returns
// ErrNotFound when the run does not exist or has not set the event.
func GetEvent[T any](ctx context.Context, c *Client, runID, key string) (T, error) {
	var out T
	if err := c.usable("GetEvent"); err != nil {
		return out, err
	}
	id, err := parseRunID(runID)
	if err != nil {
		return out, err
	}
	if err := validName("event key", key); err != nil {
		return out, err
	}
	raw, err := store.GetEvent(ctx, c.pool, c.ns, id, key)
	if err != nil {
		return out, readError("kagzi: get event "+key+" of run "+runID, err)
	}
	if raw == nil {
		return out, fmt.Errorf("%w: run %s has no event %q", errEventNotSet, runID, key)
	}
	if err := c.unmarshalPayload(raw, &out); err != nil {
		return out, fmt.Errorf("kagzi: event %q of run %s does not decode into %s: %w", key, runID, typeName[T](), err)
	}
	return out, nil
}

// WaitEvent waits until the run sets the event key and returns its value, or until
// timeout (ErrDeadlineExceeded) or ctx ends. It listens for the event's notification
// and looks again every few seconds in case one was missed. While the database is
// unavailable it keeps waiting, looking again, until the timeout or ctx ends (whose
// error then wraps ErrUnavailable too).
func WaitEvent[T any](ctx context.Context, c *Client, runID, key string, timeout time.Duration) (T, error) {
	var zero T
	if err := c.usable("WaitEvent"); err != nil {
		return zero, err
	}
	id, err := parseRunID(runID)
	if err != nil {
		return zero, err
	}
	if err := validName("event key", key); err != nil {
		return zero, err
	}
	if timeout <= 0 {
		return zero, invalidArgument("WaitEvent needs a positive timeout, got %v", timeout)
	}
	sub := c.notifier.Subscribe(store.EventTopic(id))
	defer sub.Close()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	poll := 250 * time.Millisecond
	var down error // the database was unavailable at the last look
	for {
		out, err := GetEvent[T](ctx, c, runID, key)
		down = nil
		switch {
		case errors.Is(err, ErrUnavailable) && ctx.Err() == nil:
			// The database is out of reach: the wait rides it out, as Run.Wait does,
			// looking again until the timeout.
			down = err
		case err == nil || !isNotSet(err):
			return out, err
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			if down != nil {
				return zero, fmt.Errorf("%w (the database was unavailable at the last look: %w)", ctx.Err(), down)
			}
			return zero, ctx.Err()
		case <-deadline.C:
			t.Stop()
			if down != nil {
				return zero, fmt.Errorf("%w: run %s did not set event %q within %v (the database was unavailable at the last look: %w)",
					ErrDeadlineExceeded, runID, key, timeout, down)
			}
			return zero, fmt.Errorf("%w: run %s did not set event %q within %v", ErrDeadlineExceeded, runID, key, timeout)
		case <-sub.C:
		case <-t.C:
			poll = min(poll*2, 5*time.Second)
		}
		t.Stop()
	}
}

// errEventNotSet is the ErrNotFound of a run that exists but has not set the event.
var errEventNotSet = fmt.Errorf("%w: event not set", ErrNotFound)

// isNotSet tells "the event is not set yet" from "no such run".
func isNotSet(err error) bool { return errors.Is(err, errEventNotSet) }
