package kagzi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi/internal/cronspec"
	"github.com/kagzi/kagzi/internal/store"
)

// MaxScheduleIDLength is the longest schedule id, in bytes. The workflow ids of the
// runs a schedule fires append the tick time to it, and must fit in 255 bytes.
const MaxScheduleIDLength = 200

// MaxCatchupLimit is the largest Schedule.MaxCatchup.
const MaxCatchupLimit = 1000

// OverlapPolicy says what a schedule does when a tick comes due while a run it fired
// earlier is still active (PENDING, RUNNING or SLEEPING).
type OverlapPolicy int

const (
	// OverlapAllow (the default) fires every tick, whatever the schedule's other runs
	// are doing.
	OverlapAllow OverlapPolicy = iota
	// OverlapSkip does not fire a tick while a run of the schedule is active; the tick
	// is skipped for good and counted (ScheduleInfo.OverlapSkipped).
	OverlapSkip
	// OverlapBufferOne holds back one tick that came due while a run of the schedule
	// was active, and fires it (with its own tick time) as soon as none is. Further
	// ticks that come due while one is held back are skipped and counted.
	OverlapBufferOne
)

// String returns the policy's name: ALLOW, SKIP or BUFFER_ONE.
func (p OverlapPolicy) String() string {
	switch p {
	case OverlapAllow:
		return store.OverlapAllow
	case OverlapSkip:
		return store.OverlapSkip
	case OverlapBufferOne:
		return store.OverlapBufferOne
	}
	return "OverlapPolicy(" + strconv.Itoa(int(p)) + ")"
}

// MarshalText encodes the policy by its name (see String), as JSON does.
func (p OverlapPolicy) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText decodes a policy's name: ALLOW, SKIP or BUFFER_ONE.
func (p *OverlapPolicy) UnmarshalText(b []byte) error {
	switch s := string(b); s {
	case store.OverlapAllow, store.OverlapSkip, store.OverlapBufferOne:
		*p = parseOverlap(s)
		return nil
	}
	return invalidArgument("unknown overlap policy %q (want ALLOW, SKIP or BUFFER_ONE)", b)
}

func parseOverlap(s string) OverlapPolicy {
	switch s {
	case store.OverlapSkip:
		return OverlapSkip
	case store.OverlapBufferOne:
		return OverlapBufferOne
	}
	return OverlapAllow
}

// Schedule defines a cron schedule: a workflow that Kagzi starts at every tick of a
// cron expression. Create one with Client.CreateSchedule. Every worker takes part
// in firing schedules (unless WorkerConfig.DisableScheduler); the database makes sure
// each tick fires exactly once, however many processes run.
type Schedule struct {
	// ID names the schedule, unique in the client's namespace: 1 to
	// MaxScheduleIDLength bytes of UTF-8 without control characters.
	ID string
	// WorkflowType is the workflow type to start. No worker needs to have registered
	// it yet: its runs wait PENDING until one does.
	WorkflowType string
	// Workflow is WorkflowType.
	//
	// Deprecated: use WorkflowType, the name RunFilter and RunInfo use too.
	Workflow string
	// Cron is the cron expression (github.com/robfig/cron/v3): 5 fields, minute hour
	// day-of-month month day-of-week ("0 6 * * *", "*/15 9-17 * * MON-FRI"); a
	// descriptor (@yearly, @monthly, @weekly, @daily, @hourly); or "@every <duration>"
	// with a whole number of seconds ("@every 90s").
	Cron string
	// Seconds makes Cron a 6-field expression whose first field is the second
	// ("*/10 * * * * *": every ten seconds).
	Seconds bool
	// TimeZone is the IANA zone Cron is read in, such as "America/New_York". Default
	// UTC. On daylight-saving days every scheduled local time fires exactly once: a
	// time skipped by spring-forward fires at the first instant after the gap, a time
	// repeated by fall-back fires at its first occurrence. "@every" intervals are
	// absolute time.
	TimeZone string
	// Input is every run's input, encoded with encoding/json (a json.RawMessage is
	// stored as it is, once checked to be valid JSON).
	Input any
	// MaxCatchup is how many due ticks one firing may start, at most MaxCatchupLimit.
	// After downtime (no worker ran, or the schedule's ticks came faster than they
	// could be fired) the most recent MaxCatchup due ticks fire, in chronological
	// order; older ones are skipped and counted (ScheduleInfo.CatchupSkipped).
	// 0 (the default) is 1: only the most recent due tick fires.
	MaxCatchup int
	// Overlap says what a tick does while a run of the schedule is still active.
	// Default OverlapAllow.
	Overlap OverlapPolicy
	// Paused creates the schedule paused (see PauseSchedule); in UpdateSchedule, it
	// pauses or resumes it.
	Paused bool
}

// maxNextFireTimes bounds NextFireTimes' n.
const maxNextFireTimes = 1000

// NextFireTimes returns the next n (1 to 1000) fire times of the schedule's Cron in
// its TimeZone strictly after from, in UTC, oldest first, by the rules the scheduler
// fires by (each local time once on daylight-saving days; see Schedule.TimeZone):
// for a UI that shows upcoming runs, or a test. It reads nothing, and applies no
// pause, catch-up or overlap policy. An "@every" schedule's ticks count from from
// (the scheduler counts them from the schedule's creation, update or resume; its
// ScheduleInfo.NextFireAt is the next). A schedule that stops firing (a date that never comes again)
// gives fewer than n. A bad Cron, TimeZone or n is ErrInvalidArgument.
func (s Schedule) NextFireTimes(from time.Time, n int) ([]time.Time, error) {
	if n < 1 || n > maxNextFireTimes {
		return nil, invalidArgument("NextFireTimes: n %d is not within 1..%d", n, maxNextFireTimes)
	}
	spec, err := cronspec.Parse(s.Cron, s.Seconds, s.TimeZone)
	if err != nil {
		return nil, invalidArgument("schedule %q: %v", s.ID, err)
	}
	times := make([]time.Time, 0, n)
	for t := from; len(times) < n; {
		if t = spec.Next(t); t.IsZero() {
			break
		}
		times = append(times, t)
	}
	return times, nil
}

// ScheduleInfo is a schedule as the database holds it, for CreateSchedule,
// GetSchedule, ListSchedules and UpdateSchedule.
type ScheduleInfo struct {
	// ID, WorkflowType, Cron, Seconds, MaxCatchup and Overlap are as defined (see
	// Schedule); Namespace is the client's.
	ID           string `json:"schedule_id"`
	Namespace    string `json:"namespace"`
	WorkflowType string `json:"workflow_type"`
	// Workflow is WorkflowType.
	//
	// Deprecated: use WorkflowType.
	Workflow string `json:"-"`
	Cron     string `json:"cron"`
	Seconds  bool   `json:"cron_seconds,omitempty"`
	// TimeZone is the IANA zone of Cron, "UTC" when none was given.
	TimeZone string `json:"time_zone"`
	// Input is every run's input, JSON-encoded.
	Input      json.RawMessage `json:"input,omitempty"`
	Paused     bool            `json:"paused"`
	MaxCatchup int             `json:"max_catchup"`
	Overlap    OverlapPolicy   `json:"overlap"`
	// NextFireAt is the next tick to fire; nil while paused. A tick that is due but
	// not fired yet (no worker is running the scheduler) stays here, in the past.
	NextFireAt *time.Time `json:"next_fire_at,omitempty"`
	// LastFiredAt is the tick time of the newest run the schedule fired (for a
	// TriggerSchedule, when it was asked for), and LastRunID that run's id.
	LastFiredAt *time.Time `json:"last_fired_at,omitempty"`
	LastRunID   string     `json:"last_run_id,omitempty"`
	// BufferedTick is the tick OverlapBufferOne holds back until the schedule's active
	// run finishes.
	BufferedTick *time.Time `json:"buffered_tick,omitempty"`
	// CatchupSkipped counts due ticks skipped because they were older than the most
	// recent MaxCatchup; OverlapSkipped counts ticks skipped by the overlap policy.
	CatchupSkipped int64     `json:"catchup_skipped"`
	OverlapSkipped int64     `json:"overlap_skipped"`
	CreatedAt      time.Time `json:"created_at"`
	// UpdatedAt is when the definition or pause state last changed; fires do not
	// change it.
	UpdatedAt time.Time `json:"updated_at"`
}

// Schedule returns the definition of the schedule, ready to change and pass to
// UpdateSchedule.
func (s *ScheduleInfo) Schedule() Schedule {
	return Schedule{ID: s.ID, WorkflowType: s.WorkflowType, Cron: s.Cron, Seconds: s.Seconds, TimeZone: s.TimeZone,
		Input: s.Input, MaxCatchup: s.MaxCatchup, Overlap: s.Overlap, Paused: s.Paused}
}

func scheduleInfo(s store.Schedule) *ScheduleInfo {
	info := &ScheduleInfo{ID: s.ScheduleID, Namespace: s.Namespace, WorkflowType: s.WorkflowType,
		Workflow: s.WorkflowType, Cron: s.Cron,
		Seconds: s.CronSeconds, TimeZone: s.TimeZone, Input: s.Input, Paused: s.Paused,
		MaxCatchup: s.MaxCatchup, Overlap: parseOverlap(s.Overlap), NextFireAt: s.NextFireAt,
		LastFiredAt: s.LastFiredAt, BufferedTick: s.BufferedTick, CatchupSkipped: s.CatchupSkipped,
		OverlapSkipped: s.OverlapSkipped, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt}
	if s.LastRunID != nil {
		info.LastRunID = s.LastRunID.String()
	}
	return info
}

// validSchedule checks a schedule definition and returns it as stored, with its
// parsed cron expression. Its errors wrap ErrInvalidArgument and say what is wrong.
func (c *Client) validSchedule(s Schedule) (store.ScheduleDefinition, *cronspec.Spec, error) {
	var d store.ScheduleDefinition
	if err := validScheduleID(s.ID); err != nil {
		return d, nil, err
	}
	switch {
	case s.WorkflowType == "":
		s.WorkflowType = s.Workflow
	case s.Workflow != "" && s.Workflow != s.WorkflowType:
		return d, nil, invalidArgument("schedule %q: WorkflowType %q and Workflow %q disagree (Workflow is WorkflowType's old name)",
			s.ID, s.WorkflowType, s.Workflow)
	}
	if err := validName("workflow type", s.WorkflowType); err != nil {
		return d, nil, err
	}
	spec, err := cronspec.Parse(s.Cron, s.Seconds, s.TimeZone)
	if err != nil {
		return d, nil, invalidArgument("schedule %q: %v", s.ID, err)
	}
	if s.MaxCatchup < 0 || s.MaxCatchup > MaxCatchupLimit {
		return d, nil, invalidArgument("schedule %q: MaxCatchup %d is not within 0..%d", s.ID, s.MaxCatchup, MaxCatchupLimit)
	}
	if s.Overlap < OverlapAllow || s.Overlap > OverlapBufferOne {
		return d, nil, invalidArgument("schedule %q: unknown overlap policy %d", s.ID, int(s.Overlap))
	}
	var input []byte
	if raw, ok := s.Input.(json.RawMessage); ok {
		if !json.Valid(raw) {
			return d, nil, invalidArgument("schedule %q: input is not valid JSON", s.ID)
		}
		input = raw
	} else if input, err = json.Marshal(s.Input); err != nil {
		return d, nil, invalidArgument("schedule %q: input does not encode as JSON: %v", s.ID, err)
	}
	if input, err = c.encodePayload(fmt.Sprintf("schedule %q: input", s.ID), input); err != nil {
		return d, nil, err
	}
	zone := s.TimeZone
	if zone == "" {
		zone = "UTC"
	}
	return store.ScheduleDefinition{WorkflowType: s.WorkflowType, Cron: spec.String(), CronSeconds: s.Seconds,
		TimeZone: zone, Input: input, MaxCatchup: s.MaxCatchup, Overlap: s.Overlap.String()}, spec, nil
}

func validScheduleID(id string) error {
	if err := validName("schedule id", id); err != nil {
		return err
	}
	if len(id) > MaxScheduleIDLength {
		return invalidArgument("schedule id longer than %d bytes", MaxScheduleIDLength)
	}
	return nil
}

// CreateSchedule creates a schedule in the client's namespace. Its first tick is the
// first time the cron expression names after now; nothing is back-filled. An invalid
// definition (a bad cron expression or time zone, say) returns ErrInvalidArgument
// with what is wrong, and an id that is taken ErrAlreadyExists; neither writes
// anything. Schedulers hear of the new schedule at once.
func (c *Client) CreateSchedule(ctx context.Context, s Schedule) (*ScheduleInfo, error) {
	if err := c.usable("CreateSchedule"); err != nil {
		return nil, err
	}
	d, spec, err := c.validSchedule(s)
	if err != nil {
		return nil, err
	}
	var next *time.Time
	if !s.Paused {
		t := spec.Next(c.scheduleClock())
		next = &t
	}
	row, inserted, err := store.InsertSchedule(ctx, c.pool, c.ns, s.ID, d, next)
	if err != nil {
		return nil, dbError("kagzi: create schedule "+s.ID, err)
	}
	if !inserted {
		return nil, fmt.Errorf("%w: schedule %q already exists in namespace %q", ErrAlreadyExists, s.ID, c.ns)
	}
	return c.decodeScheduleInfo(scheduleInfo(row)), nil
}

// GetSchedule reads a schedule of the client's namespace; ErrNotFound if there is none.
func (c *Client) GetSchedule(ctx context.Context, id string) (*ScheduleInfo, error) {
	if err := c.usable("GetSchedule"); err != nil {
		return nil, err
	}
	if err := validScheduleID(id); err != nil {
		return nil, err
	}
	row, err := store.GetSchedule(ctx, c.pool, c.ns, id)
	if err != nil {
		return nil, readError("kagzi: get schedule "+id, err)
	}
	return c.decodeScheduleInfo(scheduleInfo(row)), nil
}

// ScheduleFilter selects schedules for ListSchedules. Zero fields select everything.
type ScheduleFilter struct {
	// WorkflowType selects the schedules of one workflow type.
	WorkflowType string
	// Workflow is WorkflowType.
	//
	// Deprecated: use WorkflowType.
	Workflow string
	// Paused, when set, selects paused (true) or active (false) schedules only.
	Paused *bool
	// PageSize is the most schedules a page holds: default 50, at most 1000.
	PageSize int
	// PageToken continues a listing: pass the NextPageToken of the previous page.
	PageToken string
}

// SchedulePage is one page of ListSchedules, ordered by schedule id.
type SchedulePage struct {
	Schedules []ScheduleInfo
	// NextPageToken fetches the next page; empty on the last page.
	NextPageToken string
}

// ListSchedules lists the namespace's schedules by id, a page at a time.
// With Config.ReadPool it reads from it (a replica may lag the primary).
func (c *Client) ListSchedules(ctx context.Context, f ScheduleFilter) (*SchedulePage, error) {
	if err := c.usable("ListSchedules"); err != nil {
		return nil, err
	}
	if f.WorkflowType == "" {
		f.WorkflowType = f.Workflow
	}
	p := store.ListSchedulesParams{Namespace: c.ns, WorkflowType: f.WorkflowType, Paused: f.Paused, Limit: f.PageSize}
	var err error
	if f.WorkflowType != "" {
		if err := validName("workflow type", f.WorkflowType); err != nil {
			return nil, err
		}
	}
	if p.Limit, err = pageSize(f.PageSize); err != nil {
		return nil, err
	}
	if f.PageToken != "" {
		raw, err := base64.RawURLEncoding.DecodeString(f.PageToken)
		if err != nil || len(raw) < 2 || string(raw[:2]) != "s/" {
			return nil, invalidArgument("malformed page token %q", f.PageToken)
		}
		p.AfterID = string(raw[2:])
	}
	want := p.Limit
	p.Limit++ // one more tells whether there is a next page
	rows, err := store.ListSchedules(ctx, c.read, p)
	if err != nil {
		return nil, readError("kagzi: list schedules", err)
	}
	page := &SchedulePage{Schedules: make([]ScheduleInfo, 0, min(len(rows), want))}
	if len(rows) > want {
		rows = rows[:want]
		page.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte("s/" + rows[want-1].ScheduleID))
	}
	for _, r := range rows {
		page.Schedules = append(page.Schedules, *c.decodeScheduleInfo(scheduleInfo(r)))
	}
	return page, nil
}

// UpdateSchedule replaces the definition of the schedule s.ID with s: every field,
// so start from ScheduleInfo.Schedule to change one. A changed cron expression,
// Seconds or time zone takes effect from now (its next tick is the first after now);
// otherwise the next tick stays. Setting Paused pauses the schedule, clearing it
// resumes it without back-fill (as ResumeSchedule). Invalid input returns
// ErrInvalidArgument and changes nothing; an unknown id returns ErrNotFound.
func (c *Client) UpdateSchedule(ctx context.Context, s Schedule) (*ScheduleInfo, error) {
	if err := c.usable("UpdateSchedule"); err != nil {
		return nil, err
	}
	d, spec, err := c.validSchedule(s)
	if err != nil {
		return nil, err
	}
	var info *ScheduleInfo
	err = store.InTx(ctx, c.pool, store.TxIdleLimit, func(tx pgx.Tx) error {
		cur, err := store.LockSchedule(ctx, tx, c.ns, s.ID)
		if err != nil {
			return err
		}
		next := cur.NextFireAt
		switch {
		case s.Paused:
			next = nil
		case cur.Paused || cur.Cron != d.Cron || cur.CronSeconds != d.CronSeconds || cur.TimeZone != d.TimeZone:
			t := spec.Next(c.scheduleClock())
			next = &t
		}
		row, err := store.UpdateSchedule(ctx, tx, c.ns, s.ID, d, next)
		info = c.decodeScheduleInfo(scheduleInfo(row))
		return err
	})
	if err != nil {
		return nil, wrapStoreErr("kagzi: update schedule "+s.ID, err)
	}
	return info, nil
}

// DeleteSchedule deletes a schedule: it fires no more. The runs it fired are left
// alone (they keep its id, see RunFilter.ScheduleID). An unknown id returns
// ErrNotFound.
func (c *Client) DeleteSchedule(ctx context.Context, id string) error {
	if err := c.usable("DeleteSchedule"); err != nil {
		return err
	}
	if err := validScheduleID(id); err != nil {
		return err
	}
	return wrapStoreErr("kagzi: delete schedule "+id, store.DeleteSchedule(ctx, c.pool, c.ns, id))
}

// PauseSchedule stops a schedule from firing until ResumeSchedule; a tick held back
// by OverlapBufferOne is dropped. Pausing a paused schedule changes nothing; an
// unknown id returns ErrNotFound.
func (c *Client) PauseSchedule(ctx context.Context, id string) error {
	if err := c.usable("PauseSchedule"); err != nil {
		return err
	}
	if err := validScheduleID(id); err != nil {
		return err
	}
	return wrapStoreErr("kagzi: pause schedule "+id, store.PauseSchedule(ctx, c.pool, c.ns, id))
}

// ResumeSchedule resumes a paused schedule without back-fill: its next tick is the
// first one after now; the ticks it missed while paused never fire. Resuming an
// active schedule changes nothing; an unknown id returns ErrNotFound.
func (c *Client) ResumeSchedule(ctx context.Context, id string) error {
	if err := c.usable("ResumeSchedule"); err != nil {
		return err
	}
	if err := validScheduleID(id); err != nil {
		return err
	}
	err := store.InTx(ctx, c.pool, store.TxIdleLimit, func(tx pgx.Tx) error {
		cur, err := store.LockSchedule(ctx, tx, c.ns, id)
		if err != nil || !cur.Paused {
			return err
		}
		spec, err := cronspec.Parse(cur.Cron, cur.CronSeconds, cur.TimeZone)
		if err != nil {
			return invalidArgument("schedule %q: %v", id, err)
		}
		return store.ResumeSchedule(ctx, tx, c.ns, id, spec.Next(c.scheduleClock()))
	})
	if errors.Is(err, ErrInvalidArgument) {
		return err
	}
	return wrapStoreErr("kagzi: resume schedule "+id, err)
}

// TriggerSchedule fires an extra run of the schedule at once, with the schedule's
// input, whatever its cron expression, pause state and overlap policy say. The run
// records the schedule and the time of the trigger as its tick (RunInfo.ScheduleID,
// ScheduleTick); its workflow id is "<schedule id>@trigger/<run id>". The schedule's
// next tick does not move. An unknown id returns ErrNotFound.
func (c *Client) TriggerSchedule(ctx context.Context, id string) (*Run[json.RawMessage], error) {
	if err := c.usable("TriggerSchedule"); err != nil {
		return nil, err
	}
	if err := validScheduleID(id); err != nil {
		return nil, err
	}
	var run store.Run
	err := store.InTx(ctx, c.pool, store.TxIdleLimit, func(tx pgx.Tx) error {
		sc, err := store.LockSchedule(ctx, tx, c.ns, id)
		if err != nil {
			return err
		}
		runID, err := uuid.NewV7()
		if err != nil {
			return err
		}
		tick := c.scheduleClock().UTC()
		run, _, err = store.InsertRun(ctx, tx, store.NewRun{RunID: runID, Namespace: c.ns,
			WorkflowID: id + "@trigger/" + runID.String(), WorkflowType: sc.WorkflowType, Input: sc.Input,
			ReuseNever: true, ScheduleID: id, ScheduleTick: &tick})
		if err != nil {
			return err
		}
		return store.RecordTrigger(ctx, tx, c.ns, id, tick, run.RunID)
	})
	if err != nil {
		return nil, wrapStoreErr("kagzi: trigger schedule "+id, err)
	}
	return &Run[json.RawMessage]{RunID: run.RunID.String(), WorkflowID: run.WorkflowID,
		WorkflowType: run.WorkflowType, client: c}, nil
}

// TickWorkflowID is the workflow id of the run a schedule fires for a tick:
// "<schedule id>@<tick in UTC, RFC 3339>", for example
// "daily-report@2026-11-21T06:00:00Z". Kagzi never reuses it: once a tick's run
// exists, firing the tick again (it cannot happen, but if it did) returns that run
// even after it finished. Workflow ids of this form are the schedule's; do not start
// runs with them.
func TickWorkflowID(scheduleID string, tick time.Time) string {
	return scheduleID + "@" + tick.UTC().Format(time.RFC3339Nano)
}

// Scheduler settings.
const (
	// scheduleBatch is how many due schedules one transaction claims.
	scheduleBatch = 10
	// scheduleIdleCheck bounds the sleep of an idle scheduler: the fallback for a lost
	// notification. Schedule changes arrive by NOTIFY, and the next tick by a timer.
	scheduleIdleCheck = 30 * time.Second
	// scheduleInjectedClockCheck bounds the sleep when WorkerConfig.Clock is not
	// time.Now: the scheduler cannot know how an injected clock moves.
	scheduleInjectedClockCheck = 100 * time.Millisecond
	// scheduleMaxBlockers is how many runs holding back buffered ticks a scheduler
	// listens for at once; it notices the others at its next look.
	scheduleMaxBlockers = 100
)
