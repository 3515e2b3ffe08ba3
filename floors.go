package kagzi

import (
	"context"
	"time"

	"github.com/kagzi/kagzi/internal/store"
)

// Floors. A claim reads a type's claimable runs from an index ordered by the time
// each became claimable. Every run claimed, leased and finished leaves entries behind
// in it until vacuum removes them, and a scan marks them dead once no transaction can
// see them; while a long transaction anywhere in the database pins the xmin horizon
// (a forgotten BEGIN, a REPEATABLE READ report), neither happens, and a claim reading
// from the start of the range walked every entry left since the pin began: pickups
// slowed by tens of milliseconds per minute of the pin.
//
// So the worker keeps a floor per type (store.Floors), where its next claim starts
// reading: a second before the last run it claimed of the type, or before the claim's
// now() when it claimed fewer than it asked for (kagzi.claim sets it, migration 00008).
// A run can still become claimable below a floor: a start whose transaction commits
// more than a second after its statement, a run whose row another transaction held
// when a claim passed it. A start, a wake-up or a hand-back announces its time, and the
// notification lowers the floor; a reconnected listener drops the floors (it may have
// missed some); and every PollInterval the probe below looks under the floors, off the
// claim loop, and lowers one that has a run beneath it. Its read is the walk the floors
// spare the claims, so under a long pin it looks less often (at most 2% of its time is
// spent reading). The runs of no key of types with limits or queued concurrency keys are
// read from the floors too (migration 00016).
//
// The queues of concurrency keys have floors of their own (migration 00017): a keyed
// run waits in its key's queue with the time it was started at, however long its key
// stays full, so a type's key floor is a second before its earliest queued keyed run
// (before now() when none is queued). The claim reads from it whether any is queued, the
// keys of the ring and each key's head; notifications, the reconnect and the probe lower
// or drop it as they do the other floors.

// probeCostShare bounds the share of its time the probe spends probing: under a pinned
// horizon its read walks every entry left since the pin began (1.2 s after ten minutes
// at 1,000 runs/s), so it waits at least that many times its last read's duration.
const probeCostShare = 50

// probeFloors looks for runs claimable below the worker's floors every PollInterval
// (or, while its read is slow, probeCostShare times its duration) until ctx ends, and
// has the claim loop claim them.
func (w *Worker) probeFloors(ctx context.Context) {
	c := store.Claimer{Namespace: w.client.ns, Types: w.types, Versions: w.versions, Floors: w.floors,
		KeyFloors: w.keyFloors}
	t := time.NewTimer(w.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		began := time.Now()
		lowered, err := store.ProbeBelowFloors(ctx, w.client.pool, c)
		t.Reset(max(w.cfg.PollInterval, probeCostShare*time.Since(began)))
		if err != nil {
			if ctx.Err() == nil {
				w.logger.Debug("kagzi: probe below the claim floors failed", "error", err)
			}
			continue
		}
		if lowered {
			select {
			case w.floorHit <- struct{}{}:
			default:
			}
		}
	}
}
