package kagzi

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/kagzi/kagzi/internal/cronspec"
	"github.com/kagzi/kagzi/internal/notifier"
	"github.com/kagzi/kagzi/internal/store"
)

// The scheduler daemon: every worker (unless WorkerConfig.DisableScheduler) fires the
// namespace's due cron ticks; the database makes sure each fires once. The schedule
// API is in schedule.go.

// scheduler fires the due ticks of the namespace's schedules; see runScheduler.
type scheduler struct {
	w        *Worker
	c        *Client
	clock    func() time.Time
	injected bool
	specs    map[string]*cronspec.Spec
	// unreadable holds the schedules this process cannot read (a time zone its tzdata
	// lacks), until when it passes over them; others may fire them.
	unreadable map[string]time.Time
}

// runScheduler fires the cron schedules that are due, until ctx is done. Every worker
// runs one: a pass claims due schedules with FOR UPDATE SKIP LOCKED, inserts the runs
// of their due ticks and advances their next fire time in one transaction, so a tick
// fires once however many schedulers race for it. Between passes it sleeps until the
// earliest next tick, a schedule change (NOTIFY), the end of a run that holds back a
// buffered tick (NOTIFY), or scheduleIdleCheck. It logs errors and backs off; it never
// stops before ctx is done.
func (w *Worker) runScheduler(ctx context.Context) {
	s := &scheduler{w: w, c: w.client, clock: w.cfg.Clock, specs: map[string]*cronspec.Spec{},
		unreadable: map[string]time.Time{}, injected: reflect.ValueOf(w.cfg.Clock).Pointer() != reflect.ValueOf(time.Now).Pointer()}
	s.run(ctx)
}

func (s *scheduler) run(ctx context.Context) {
	sub := s.c.notifier.Subscribe(store.ScheduleTopic(s.c.ns))
	defer sub.Close()
	var blockSub *notifier.Subscription // the runs holding back buffered ticks
	var blocking map[uuid.UUID]bool
	defer func() {
		if blockSub != nil {
			blockSub.Close()
		}
	}()
	var backoff, contended time.Duration
	relooked := false
	for ctx.Err() == nil {
		wait, blockers, err := s.pass(ctx)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			backoff = min(max(backoff*2, 100*time.Millisecond), scheduleIdleCheck)
			s.w.logger.Warn("kagzi: scheduler pass failed; retrying", "error", err, "retry_in", backoff)
			wait = backoff
		case wait < 0: // a due schedule is locked by another scheduler: let it commit
			backoff = 0
			contended = min(max(contended*2, 20*time.Millisecond), time.Second)
			wait = contended
		default:
			backoff, contended = 0, 0
		}
		if err == nil && !sameRuns(blocking, blockers) {
			// Listen for the new blockers before looking again, so that none of their
			// completions is missed.
			var next *notifier.Subscription
			blocking = map[uuid.UUID]bool{}
			if len(blockers) > 0 {
				topics := make([]string, len(blockers))
				for i, id := range blockers {
					topics[i] = store.DoneTopic(id)
					blocking[id] = true
				}
				next = s.c.notifier.Subscribe(topics...)
			}
			if blockSub != nil {
				blockSub.Close()
			}
			blockSub = next
			if len(blockers) > 0 && !relooked {
				s.c.awaitEnds(ctx) // before looking again: their ends notify this client
				relooked = true
				continue
			}
		}
		relooked = false
		var done <-chan notifier.Notification
		if blockSub != nil {
			done = blockSub.C
			s.c.awaitEnds(ctx)
		}
		if wait > 0 {
			timer := time.NewTimer(wait)
			select {
			case <-ctx.Done():
			case <-timer.C:
			case <-sub.C:
			case <-done:
			}
			timer.Stop()
		}
	}
}

func sameRuns(a map[uuid.UUID]bool, b []uuid.UUID) bool {
	if len(a) != len(b) {
		return false
	}
	for _, id := range b {
		if !a[id] {
			return false
		}
	}
	return true
}

// pass fires everything that is due and tells how long to sleep: zero to look again
// at once, negative when a due schedule is being fired by another scheduler.
func (s *scheduler) pass(ctx context.Context) (wait time.Duration, blockers []uuid.UUID, err error) {
	claimed := 0
	for {
		n, err := s.fireBatch(ctx, s.clock())
		if err != nil {
			return 0, nil, err
		}
		claimed += n
		if n < scheduleBatch {
			break
		}
	}
	next, blockers, err := store.NextScheduleWake(ctx, s.c.pool, s.c.ns, scheduleMaxBlockers, s.passedOver())
	if err != nil {
		return 0, nil, dbError("kagzi: scheduler", err)
	}
	limit := scheduleIdleCheck
	if !s.c.notifier.Connects() {
		// No NOTIFY tells of a schedule created or changed elsewhere: look as
		// often as the worker looks for runs.
		limit = min(limit, s.w.cfg.PollInterval)
	}
	if s.injected {
		limit = scheduleInjectedClockCheck
	}
	if next == nil {
		return limit, blockers, nil
	}
	wait = next.Sub(s.clock())
	switch {
	case wait <= 0 && claimed > 0:
		return 0, blockers, nil // more to do (a long catch-up, or more than a batch due)
	case wait <= 0:
		return -1, blockers, nil
	}
	return min(wait, limit), blockers, nil
}

// fireBatch claims up to scheduleBatch schedules with something due at now, fires
// them and advances them, in one transaction. It returns how many it claimed. The
// transaction locks the schedules it claimed, which the other processes' schedulers
// pass over: if its process stops in it for longer than a lease, PostgreSQL ends it
// (store.InTx), and they fire the schedules instead.
func (s *scheduler) fireBatch(ctx context.Context, now time.Time) (int, error) {
	claimed := 0
	err := store.InTx(ctx, s.c.pool, s.w.cfg.LeaseDuration, func(tx pgx.Tx) error {
		due, err := store.ClaimDueSchedules(ctx, tx, s.c.ns, now, scheduleBatch, s.passedOver())
		if err != nil || len(due) == 0 {
			return err
		}
		claimed = len(due)
		ids := make([]string, len(due))
		for i, sc := range due {
			ids[i] = sc.ScheduleID
		}
		active, err := store.ActiveScheduleRuns(ctx, tx, s.c.ns, ids)
		if err != nil {
			return err
		}
		for _, sc := range due {
			if _, err := s.spec(sc); err != nil {
				// This process cannot read it (a time zone its tzdata lacks): the
				// others' schedules fire, and so does it, by a process that can.
				s.unreadable[sc.ScheduleID] = time.Now().Add(scheduleIdleCheck)
				s.w.logger.Warn("kagzi: this process cannot read a schedule; it passes over it (a process that can "+
					"fires it)", "schedule_id", sc.ScheduleID, "time_zone", sc.TimeZone, "error", err,
					"look_again_in", scheduleIdleCheck)
				continue
			}
			if err := s.fire(ctx, tx, sc, now, active[sc.ScheduleID]); err != nil {
				return fmt.Errorf("schedule %q: %w", sc.ScheduleID, err)
			}
		}
		return nil
	})
	if err != nil {
		return 0, dbError("kagzi: fire schedules", err)
	}
	return claimed, nil
}

// passedOver returns the schedules the process cannot read, for now.
func (s *scheduler) passedOver() []string {
	var ids []string
	now := time.Now()
	for id, until := range s.unreadable {
		if now.After(until) {
			delete(s.unreadable, id) // look again: it may have been changed
			continue
		}
		ids = append(ids, id)
	}
	return ids
}

// spec returns the parsed cron expression of a schedule, from a cache.
func (s *scheduler) spec(sc store.Schedule) (*cronspec.Spec, error) {
	key := strconv.FormatBool(sc.CronSeconds) + "\x00" + sc.TimeZone + "\x00" + sc.Cron
	if spec := s.specs[key]; spec != nil {
		return spec, nil
	}
	spec, err := cronspec.Parse(sc.Cron, sc.CronSeconds, sc.TimeZone)
	if err != nil {
		return nil, err
	}
	if len(s.specs) >= 1000 {
		clear(s.specs)
	}
	s.specs[key] = spec
	return spec, nil
}

// firePlan is what a pass does to one schedule.
type firePlan struct {
	ticks []time.Time // to fire, in order
	store.Fired
}

// plan decides which ticks of schedule sc fire at now: the most recent MaxCatchup
// due ticks (older ones skipped and counted), then the overlap policy, given whether
// a run of the schedule is active; a buffered tick goes first.
func plan(sc store.Schedule, spec *cronspec.Spec, now time.Time, active bool) firePlan {
	p := firePlan{Fired: store.Fired{NextFireAt: sc.NextFireAt, BufferedTick: sc.BufferedTick}}
	var due []time.Time
	if sc.NextFireAt != nil && !sc.NextFireAt.After(now) {
		var next time.Time
		due, p.CatchupSkipped, next = spec.Due(*sc.NextFireAt, now, sc.MaxCatchup)
		p.NextFireAt = nil // never fires again
		if !next.IsZero() {
			p.NextFireAt = &next
		}
	}
	overlap := parseOverlap(sc.Overlap)
	if p.BufferedTick != nil && (!active || overlap == OverlapAllow) {
		p.ticks = append(p.ticks, *p.BufferedTick)
		p.BufferedTick = nil
		active = true
	}
	for _, tick := range due {
		switch {
		case overlap == OverlapAllow || !active:
			p.ticks = append(p.ticks, tick)
			active = true
		case overlap == OverlapBufferOne && p.BufferedTick == nil:
			t := tick
			p.BufferedTick = &t
		default:
			p.OverlapSkipped++
		}
	}
	return p
}

// fire fires the due ticks of one claimed schedule and advances it, in tx.
func (s *scheduler) fire(ctx context.Context, tx pgx.Tx, sc store.Schedule, now time.Time, active bool) error {
	spec, err := s.spec(sc)
	if err != nil {
		return err // fireBatch passed over it
	}
	p := plan(sc, spec, now, active)
	log := s.w.logger.With("schedule_id", sc.ScheduleID, "workflow_type", sc.WorkflowType)
	for _, tick := range p.ticks {
		runID, err := uuid.NewV7()
		if err != nil {
			return err
		}
		tick := tick.UTC()
		wfID := TickWorkflowID(sc.ScheduleID, tick)
		run, inserted, err := store.InsertRun(ctx, tx, store.NewRun{RunID: runID, Namespace: sc.Namespace,
			WorkflowID: wfID, WorkflowType: sc.WorkflowType, Input: sc.Input, ReuseNever: true,
			ScheduleID: sc.ScheduleID, ScheduleTick: &tick})
		if err != nil {
			return err
		}
		if !inserted {
			log.Warn("kagzi: the workflow id of a schedule tick is already taken; the tick does not fire again",
				"workflow_id", wfID, "run_id", run.RunID, "run_workflow_type", run.WorkflowType)
			continue
		}
		log.Debug("kagzi: schedule fired", "tick", tick, "run_id", run.RunID)
		p.LastFiredAt, p.LastRunID = &tick, &run.RunID
	}
	if p.CatchupSkipped > 0 {
		log.Info("kagzi: schedule skipped missed ticks older than its MaxCatchup", "skipped", p.CatchupSkipped,
			"max_catchup", sc.MaxCatchup)
	}
	if p.NextFireAt == nil {
		log.Warn("kagzi: schedule has no further tick; it is paused", "cron", sc.Cron)
	}
	return store.RecordFired(ctx, tx, sc.Namespace, sc.ScheduleID, p.Fired)
}
