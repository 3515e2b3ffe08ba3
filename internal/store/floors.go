package store

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Floors are where a worker's claims start reading each type's claimable runs
// (runs_claimable), or, in a second set, each type's queues of concurrency keys
// (runs_key_queue and runs_key_due, migration 00017), kept so that a claim does not
// walk the index entries of every run claimed before: under a pinned xmin horizon (a
// long transaction anywhere in the database) those entries cannot be removed or marked
// dead, and a claim reading from the start of a type's range walked them all
// (migration 00008). A type without a floor is read from its start.
//
// The claim advances a floor (see kagzi.claim); notifications and the probe
// (ProbeBelowFloors) lower it. Every run below a floor is claimable all the same:
// lowering the floor, or the claim of a worker without one, takes it.
type Floors struct {
	mu sync.Mutex
	at map[string]time.Time
	// low holds, per type, the lowest floor asked for since the claim under way read
	// the floors: the floor the claim returns must not pass it.
	low map[string]time.Time
}

// NewFloors returns floors for none of the types: claims read from the start.
func NewFloors() *Floors {
	return &Floors{at: map[string]time.Time{}, low: map[string]time.Time{}}
}

// read returns the floor of each type (nil: none) for a claim about to run.
func (f *Floors) read(types []string) []*time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.low)
	return f.snapshot(types)
}

// current returns the floor of each type (nil: none), for a read that does not claim.
func (f *Floors) current(types []string) []*time.Time {
	if f == nil {
		return make([]*time.Time, len(types))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snapshot(types)
}

// snapshot returns the floor of each type (nil: none); f.mu is held.
func (f *Floors) snapshot(types []string) []*time.Time {
	out := make([]*time.Time, len(types))
	for i, t := range types {
		if at, ok := f.at[t]; ok {
			out[i] = &at
		}
	}
	return out
}

// advance sets the floor of a type that the claim returned, unless a lower one was
// asked for since the claim read the floors.
func (f *Floors) advance(workflowType string, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	low, ok := f.low[workflowType]
	switch {
	case ok && low.IsZero(): // reset since: read from the start
		delete(f.at, workflowType)
	case ok && low.Before(at):
		f.at[workflowType] = low
	default:
		f.at[workflowType] = at
	}
}

// Lower makes claims of the type read from at or earlier: a run of the type became
// claimable at that time.
func (f *Floors) Lower(workflowType string, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cur, ok := f.at[workflowType]; ok && at.Before(cur) {
		f.at[workflowType] = at
	}
	if low, ok := f.low[workflowType]; !ok || (!low.IsZero() && at.Before(low)) {
		f.low[workflowType] = at
	}
}

// Reset drops every floor: the next claim reads each type from its start (after
// notifications may have been missed).
func (f *Floors) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for t := range f.at {
		f.low[t] = time.Time{} // the claim under way, if any, must not set it again
	}
	clear(f.at)
}

// probeSQL finds, for each type with a floor ($4), the earliest run below it that is
// claimable now: a run whose start committed well after its statement's now(), or
// that a claim skipped because another transaction held its row; and for each type
// with a floor of its key queue ($5), the earliest queued keyed run below it (a start
// that committed late). It reads the index entries the floors spare the claims, so it
// runs seldom (every PollInterval) and off the claim loop.
const probeSQL = `
SELECT t.workflow_type, x.available_at, false
FROM unnest($2::text[], $3::text[], $4::timestamptz[]) AS t(workflow_type, version, floor),
LATERAL (
	SELECT r.available_at FROM kagzi.runs r
	WHERE r.namespace = $1 AND r.workflow_type = t.workflow_type
	  AND r.status IN ('PENDING', 'RUNNING', 'SLEEPING') AND r.available_at < t.floor AND r.available_at <= now()
	  AND (r.flow_key IS NULL OR r.started_at IS NOT NULL)
	  AND (r.version IS NULL OR r.version = t.version)
	ORDER BY r.available_at
	LIMIT 1
) x
WHERE t.floor IS NOT NULL
UNION ALL
SELECT t.workflow_type, x.available_at, true
FROM unnest($2::text[], $5::timestamptz[]) AS t(workflow_type, floor),
LATERAL (
	SELECT q.available_at FROM kagzi.runs q
	WHERE q.namespace = $1 AND q.workflow_type = t.workflow_type
	  AND q.flow_key IS NOT NULL AND q.started_at IS NULL AND q.status = 'PENDING' AND q.priority >= 0
	  AND q.available_at < t.floor
	ORDER BY q.available_at
	LIMIT 1
) x
WHERE t.floor IS NOT NULL`

// ProbeBelowFloors lowers each floor of the claimer's types below which a run is
// claimable now, to that run, and each floor of a type's key queue below which a keyed
// run is queued, to that run; it reports whether it lowered any.
func ProbeBelowFloors(ctx context.Context, db DBTX, c Claimer) (bool, error) {
	at, keyAt := c.Floors.current(c.Types), c.KeyFloors.current(c.Types)
	some := func(t *time.Time) bool { return t != nil }
	if !slices.ContainsFunc(at, some) && !slices.ContainsFunc(keyAt, some) {
		return false, nil
	}
	rows, err := db.Query(ctx, probeSQL, c.Namespace, c.Types, c.Versions, at, keyAt)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	lowered := false
	for rows.Next() {
		var t string
		var a time.Time
		var keyed bool
		if err := rows.Scan(&t, &a, &keyed); err != nil {
			return false, err
		}
		if keyed {
			c.KeyFloors.Lower(t, a)
		} else {
			c.Floors.Lower(t, a)
		}
		lowered = true
	}
	return lowered, rows.Err()
}

// Of returns the floor of a type, if it has one.
func (f *Floors) Of(workflowType string) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	at, ok := f.at[workflowType]
	return at, ok
}
