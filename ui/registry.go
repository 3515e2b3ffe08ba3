package ui

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/cronspec"
	"github.com/kagzi/kagzi/internal/store"
)

// listPageSize is how many workers, schedules or actions a page lists.
const listPageSize = 100

type workersData struct {
	Workers []kagzi.WorkerInfo
	Next    string
	Status  string
}

func (c *console) workers(q *req) (string, any, error) {
	f := kagzi.WorkerFilter{PageSize: listPageSize, PageToken: q.r.FormValue("page")}
	status := q.r.FormValue("status")
	if status != "" {
		f.Statuses = []kagzi.WorkerStatus{kagzi.WorkerStatus(status)}
	}
	page, err := q.client.ListWorkers(q.r.Context(), f)
	if err != nil {
		return "", nil, err
	}
	return "Workers", &workersData{Workers: page.Workers, Next: page.NextPageToken, Status: status}, nil
}

// scheduleView is a schedule with the fire times computed from its definition.
type scheduleView struct {
	kagzi.ScheduleInfo
	Next      []time.Time
	SpecError string
}

// CatchUp is how many due ticks one pass may fire: MaxCatchup, whose 0 (the
// default) is 1.
func (v scheduleView) CatchUp() int { return max(v.MaxCatchup, 1) }

// linkableSchedule refuses a schedule id the console cannot link to (see
// dotSegment); the schedules list shows such a schedule without a link or buttons.
func linkableSchedule(id string) error {
	if dotSegment(id) {
		return fmt.Errorf("%w: schedule %q cannot be shown or changed in the console: browsers resolve a %q path segment away, so no link to it would work; use the client or the admin API",
			kagzi.ErrInvalidArgument, id, id)
	}
	return nil
}

// nextFires computes up to n fire times of a schedule from its next recorded tick on
// (or from now, when it is paused), with the scheduler's own cron rules.
func nextFires(s kagzi.ScheduleInfo, n int) ([]time.Time, string) {
	spec, err := cronspec.Parse(s.Cron, s.Seconds, s.TimeZone)
	if err != nil {
		return nil, err.Error()
	}
	var out []time.Time
	t := time.Now()
	if s.NextFireAt != nil {
		out = append(out, *s.NextFireAt)
		t = *s.NextFireAt
	}
	for len(out) < n {
		t = spec.Next(t)
		if t.IsZero() {
			break
		}
		out = append(out, t)
	}
	return out, ""
}

type schedulesData struct {
	Schedules []scheduleView
	Next      string
	CanPause  bool
	CanResume bool
	CanFire   bool
}

func (c *console) schedules(q *req) (string, any, error) {
	page, err := q.client.ListSchedules(q.r.Context(), kagzi.ScheduleFilter{PageSize: listPageSize,
		PageToken: q.r.FormValue("page")})
	if err != nil {
		return "", nil, err
	}
	d := &schedulesData{Next: page.NextPageToken, CanPause: c.can(q, ActionPauseSchedule),
		CanResume: c.can(q, ActionResumeSchedule), CanFire: c.can(q, ActionTrigger)}
	for _, s := range page.Schedules {
		v := scheduleView{ScheduleInfo: s}
		v.Next, v.SpecError = nextFires(s, 3)
		d.Schedules = append(d.Schedules, v)
	}
	return "Schedules", d, nil
}

type scheduleData struct {
	scheduleView
	Input     payload
	Runs      []kagzi.RunInfo
	RunsQuery string
	CanPause  bool
	CanResume bool
	CanFire   bool
}

// scheduleRuns is how many of its newest runs a schedule's page lists.
const scheduleRuns = 20

func (c *console) schedule(q *req) (string, any, error) {
	ctx, id := q.r.Context(), q.r.PathValue("id")
	if err := linkableSchedule(id); err != nil {
		return "", nil, err
	}
	s, err := q.client.GetSchedule(ctx, id)
	if err != nil {
		return "", nil, err
	}
	runs, err := q.client.ListRuns(ctx, kagzi.RunFilter{ScheduleID: id, PageSize: scheduleRuns})
	if err != nil {
		return "", nil, err
	}
	d := &scheduleData{scheduleView: scheduleView{ScheduleInfo: *s}, Input: c.payload(s.Input), Runs: runs.Runs,
		RunsQuery: "schedule=" + url.QueryEscape(id), CanPause: c.can(q, ActionPauseSchedule),
		CanResume: c.can(q, ActionResumeSchedule), CanFire: c.can(q, ActionTrigger)}
	d.Next, d.SpecError = nextFires(*s, 10)
	return "Schedule " + s.ID, d, nil
}

type auditData struct {
	Entries []store.AuditEntry
	Next    string
}

func (c *console) audit(q *req) (string, any, error) {
	var before int64
	if p := q.r.FormValue("page"); p != "" {
		raw, err := base64.RawURLEncoding.DecodeString(p)
		if err == nil {
			before, err = strconv.ParseInt(string(raw), 10, 64)
		}
		if err != nil || before <= 0 {
			return "", nil, badRequest("malformed page token %q", p)
		}
	}
	entries, err := store.ListAudit(q.r.Context(), q.read, q.ns, nil, before, listPageSize+1)
	if err != nil {
		return "", nil, err
	}
	d := &auditData{Entries: entries}
	if len(entries) > listPageSize {
		d.Entries = entries[:listPageSize]
		d.Next = base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(d.Entries[listPageSize-1].ID, 10)))
	}
	return "Audit", d, nil
}
