package kagzi_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	_ "time/tzdata" // the zones the tests use, whatever the host has

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

// schedTick is the workflow most schedule tests fire; it records the tick it ran for.
var schedTick = kagzi.Define("sched-tick", func(ctx *kagzi.Context, in string) (string, error) {
	return "tick " + in, nil
})

// schedUnclaimed is registered by the schedulers of tests whose fired runs must stay
// PENDING: they fire runs of the type "sched-nobody", which no worker runs.
var schedUnclaimed = kagzi.Define("sched-unclaimed", func(ctx *kagzi.Context, _ int) (int, error) { return 0, nil })

// testClock is a WorkerConfig.Clock that a test moves by hand.
type testClock struct{ ns atomic.Int64 }

func newTestClock(t time.Time) *testClock {
	c := &testClock{}
	c.Set(t)
	return c
}

func (c *testClock) Now() time.Time  { return time.Unix(0, c.ns.Load()) }
func (c *testClock) Set(t time.Time) { c.ns.Store(t.UnixNano()) }

// schedulerWorker runs a worker that fires schedules with the given clock (nil: the
// real one) and executes schedTick runs.
func schedulerWorker(t *testing.T, c *kagzi.Client, clock func() time.Time) (stop func()) {
	t.Helper()
	cfg := fastWorker()
	cfg.Clock = clock
	return runWorker(t, c, cfg, schedTick, schedUnclaimed)
}

// scheduleRuns lists the runs a schedule fired, oldest first.
func scheduleRuns(t *testing.T, c *kagzi.Client, id string) []kagzi.RunInfo {
	t.Helper()
	page, err := c.ListRuns(context.Background(), kagzi.RunFilter{ScheduleID: id, PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(page.Runs)
	return page.Runs
}

func ticksOf(runs []kagzi.RunInfo) []time.Time {
	out := make([]time.Time, len(runs))
	for i, r := range runs {
		out[i] = *r.ScheduleTick
	}
	return out
}

func getSchedule(t *testing.T, c *kagzi.Client, id string) *kagzi.ScheduleInfo {
	t.Helper()
	info, err := c.GetSchedule(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// advanceTo moves the clock to at and waits until the scheduler has fired everything
// due by then.
func advanceTo(t *testing.T, c *kagzi.Client, clock *testClock, at time.Time, ids ...string) {
	t.Helper()
	clock.Set(at)
	eventually(t, "the schedulers to catch up with "+at.String(), func() bool {
		for _, id := range ids {
			info := getSchedule(t, c, id)
			if info.NextFireAt != nil && !info.NextFireAt.After(at) {
				return false
			}
		}
		return true
	})
}

func TestEachTickFiresExactlyOnceWithThreeProcessesRacing(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var clients []*kagzi.Client
	for range 3 { // three "processes": separate pools, notifiers and workers
		pool, err := pgxpool.New(ctx, e.url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		c := newClient(t, pool, "")
		clients = append(clients, c)
	}
	info, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: "every-second", WorkflowType: schedTick.Name(),
		Cron: "* * * * * *", Seconds: true, Input: "x", MaxCatchup: 10})
	if err != nil {
		t.Fatal(err)
	}
	var stops []func()
	for _, c := range clients {
		stops = append(stops, schedulerWorker(t, c, nil))
	}
	const ticks = 4
	eventually(t, "four ticks", func() bool { return len(scheduleRuns(t, e.client, info.ID)) >= ticks })
	for _, stop := range stops {
		stop()
	}

	runs := scheduleRuns(t, e.client, info.ID)
	seen := map[time.Time]bool{}
	for _, r := range runs {
		tick := *r.ScheduleTick
		if seen[tick] {
			t.Fatalf("tick %v fired twice", tick)
		}
		seen[tick] = true
		if r.WorkflowID != kagzi.TickWorkflowID(info.ID, tick) || r.ScheduleID != info.ID {
			t.Fatalf("run %s has workflow id %q and schedule %q for tick %v", r.RunID, r.WorkflowID, r.ScheduleID, tick)
		}
	}
	ticksFired := ticksOf(runs)
	if !ticksFired[0].Equal(*info.NextFireAt) {
		t.Fatalf("first tick %v, want the schedule's first fire time %v", ticksFired[0], *info.NextFireAt)
	}
	for i := 1; i < len(ticksFired); i++ {
		if got := ticksFired[i].Sub(ticksFired[i-1]); got != time.Second {
			t.Fatalf("ticks %v and %v are %v apart: a tick was missed or fired out of order", ticksFired[i-1], ticksFired[i], got)
		}
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE schedule_id = $1`, info.ID); n != len(runs) {
		t.Fatalf("%d runs in the table, %d listed", n, len(runs))
	}
	if s := getSchedule(t, e.client, info.ID); s.CatchupSkipped != 0 || !s.LastFiredAt.Equal(ticksFired[len(ticksFired)-1]) {
		t.Fatalf("schedule after firing: skipped %d, last fired %v; want 0 and %v", s.CatchupSkipped, s.LastFiredAt, ticksFired[len(ticksFired)-1])
	}
}

func TestEachTickFiresExactlyOnceWithThreeSchedulersOnAFastClock(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	info, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: "fast", WorkflowType: "sched-nobody",
		Cron: "* * * * * *", Seconds: true, MaxCatchup: 1000})
	if err != nil {
		t.Fatal(err)
	}
	// Time runs 50 times faster for the schedulers: 50 ticks a second.
	start := time.Now()
	fast := func() time.Time { return start.Add(50 * time.Since(start)) }
	var stops []func()
	for range 3 {
		pool, err := pgxpool.New(ctx, e.url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		stops = append(stops, schedulerWorker(t, newClient(t, pool, ""), fast))
	}
	eventually(t, "60 ticks", func() bool { return len(scheduleRuns(t, e.client, info.ID)) >= 60 })
	for _, stop := range stops {
		stop()
	}
	ticks := ticksOf(scheduleRuns(t, e.client, info.ID))
	for i, tick := range ticks {
		if want := info.NextFireAt.Add(time.Duration(i) * time.Second); !tick.Equal(want) {
			t.Fatalf("run %d fired tick %v, want %v (each tick once, in order)", i, tick, want)
		}
	}
}

func TestCatchUpFiresTheMostRecentMaxCatchupTicksInOrderAndCountsTheRest(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var first time.Time
	for _, s := range []kagzi.Schedule{
		{ID: "keep-3", WorkflowType: "sched-nobody", Cron: "* * * * *", MaxCatchup: 3},
		{ID: "keep-default", WorkflowType: "sched-nobody", Cron: "* * * * *"},
	} {
		info, err := e.client.CreateSchedule(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		first = *info.NextFireAt
	}
	// The schedulers were down for ten ticks: first … first+9m are due.
	clock := newTestClock(first.Add(9*time.Minute + 30*time.Second))
	schedulerWorker(t, e.client, clock.Now)
	advanceTo(t, e.client, clock, clock.Now(), "keep-3", "keep-default")

	for _, tt := range []struct {
		id      string
		want    []time.Time
		skipped int64
	}{
		{"keep-3", []time.Time{first.Add(7 * time.Minute), first.Add(8 * time.Minute), first.Add(9 * time.Minute)}, 7},
		{"keep-default", []time.Time{first.Add(9 * time.Minute)}, 9},
	} {
		got := ticksOf(scheduleRuns(t, e.client, tt.id))
		if !slices.EqualFunc(got, tt.want, time.Time.Equal) {
			t.Errorf("%s fired %v, want %v (the most recent, oldest first)", tt.id, got, tt.want)
		}
		info := getSchedule(t, e.client, tt.id)
		if info.CatchupSkipped != tt.skipped || !info.NextFireAt.Equal(first.Add(10*time.Minute)) {
			t.Errorf("%s: skipped %d, next %v; want %d, %v", tt.id, info.CatchupSkipped, info.NextFireAt,
				tt.skipped, first.Add(10*time.Minute))
		}
	}
}

func TestOverlapSkipDoesNotFireWhileTheScheduleHasAnActiveRun(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	info, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: "skip", WorkflowType: "sched-nobody",
		Cron: "* * * * *", Overlap: kagzi.OverlapSkip})
	if err != nil {
		t.Fatal(err)
	}
	first := *info.NextFireAt
	clock := newTestClock(first)
	schedulerWorker(t, e.client, clock.Now)
	advanceTo(t, e.client, clock, first, "skip")
	runs := scheduleRuns(t, e.client, "skip")
	if len(runs) != 1 {
		t.Fatalf("%d runs after the first tick, want 1", len(runs))
	}

	// The first run is still PENDING: the next two ticks are skipped.
	advanceTo(t, e.client, clock, first.Add(time.Minute), "skip")
	advanceTo(t, e.client, clock, first.Add(2*time.Minute), "skip")
	if got := scheduleRuns(t, e.client, "skip"); len(got) != 1 {
		t.Fatalf("%d runs while the first is active, want 1", len(got))
	}
	if s := getSchedule(t, e.client, "skip"); s.OverlapSkipped != 2 {
		t.Fatalf("OverlapSkipped = %d, want 2", s.OverlapSkipped)
	}

	// Once it ended, the next tick fires.
	if err := e.client.Cancel(ctx, runs[0].RunID); err != nil {
		t.Fatal(err)
	}
	advanceTo(t, e.client, clock, first.Add(3*time.Minute), "skip")
	got := ticksOf(scheduleRuns(t, e.client, "skip"))
	if want := []time.Time{first, first.Add(3 * time.Minute)}; !slices.EqualFunc(got, want, time.Time.Equal) {
		t.Fatalf("fired %v, want %v", got, want)
	}
}

func TestOverlapBufferOneFiresOneHeldBackTickWhenTheActiveRunEnds(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	info, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: "buffer", WorkflowType: "sched-nobody",
		Cron: "* * * * *", Overlap: kagzi.OverlapBufferOne})
	if err != nil {
		t.Fatal(err)
	}
	first := *info.NextFireAt
	clock := newTestClock(first)
	schedulerWorker(t, e.client, clock.Now)
	advanceTo(t, e.client, clock, first, "buffer")
	advanceTo(t, e.client, clock, first.Add(time.Minute), "buffer")   // held back
	advanceTo(t, e.client, clock, first.Add(2*time.Minute), "buffer") // dropped: one is held already
	runs := scheduleRuns(t, e.client, "buffer")
	s := getSchedule(t, e.client, "buffer")
	if len(runs) != 1 || s.BufferedTick == nil || !s.BufferedTick.Equal(first.Add(time.Minute)) || s.OverlapSkipped != 1 {
		t.Fatalf("%d runs, buffered %v, skipped %d; want 1 run, %v buffered, 1 skipped",
			len(runs), s.BufferedTick, s.OverlapSkipped, first.Add(time.Minute))
	}

	// The clock stands still: the end of the active run alone releases the held tick.
	if err := e.client.Cancel(ctx, runs[0].RunID); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the buffered tick to fire", func() bool { return len(scheduleRuns(t, e.client, "buffer")) == 2 })
	got := ticksOf(scheduleRuns(t, e.client, "buffer"))
	if want := []time.Time{first, first.Add(time.Minute)}; !slices.EqualFunc(got, want, time.Time.Equal) {
		t.Fatalf("fired %v, want %v", got, want)
	}
	if s := getSchedule(t, e.client, "buffer"); s.BufferedTick != nil {
		t.Fatalf("buffered tick %v still held after it fired", s.BufferedTick)
	}
}

func TestOverlapAllowFiresEveryTickWhileRunsAreActive(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	info, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: "allow", WorkflowType: "sched-nobody", Cron: "* * * * *"})
	if err != nil {
		t.Fatal(err)
	}
	first := *info.NextFireAt
	clock := newTestClock(first)
	schedulerWorker(t, e.client, clock.Now)
	for i := range 3 {
		advanceTo(t, e.client, clock, first.Add(time.Duration(i)*time.Minute), "allow")
	}
	if runs := scheduleRuns(t, e.client, "allow"); len(runs) != 3 {
		t.Fatalf("%d runs, want 3 (all PENDING at once)", len(runs))
	}
}

// dstDays returns the next spring-forward and fall-back dates of loc after now.
func dstDays(t *testing.T, loc *time.Location) (spring, fall time.Time) {
	t.Helper()
	day := time.Now().In(loc)
	day = time.Date(day.Year(), day.Month(), day.Day(), 12, 0, 0, 0, loc)
	for range 800 {
		next := time.Date(day.Year(), day.Month(), day.Day()+1, 12, 0, 0, 0, loc)
		_, off := day.Zone()
		_, nextOff := next.Zone()
		switch {
		case nextOff > off && spring.IsZero():
			spring = next
		case nextOff < off && fall.IsZero() && !spring.IsZero():
			fall = next
		}
		if !fall.IsZero() {
			return spring, fall
		}
		day = next
	}
	t.Fatal("no daylight-saving changes found")
	return
}

func TestDailyScheduleFiresOnceOnDaylightSavingDaysInNewYork(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Skip("no tzdata:", err)
	}
	for _, s := range []kagzi.Schedule{
		{ID: "at-2", WorkflowType: "sched-nobody", Cron: "0 2 * * *", TimeZone: "America/New_York", MaxCatchup: 10},
		{ID: "at-1-30", WorkflowType: "sched-nobody", Cron: "30 1 * * *", TimeZone: "America/New_York", MaxCatchup: 10},
	} {
		if _, err := e.client.CreateSchedule(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	spring, fall := dstDays(t, ny)
	at := func(day time.Time, h, m int, zone string) time.Time {
		off := map[string]int{"EST": -5, "EDT": -4}[zone]
		return time.Date(day.Year(), day.Month(), day.Day(), h, m, 0, 0, time.FixedZone(zone, off*3600)).UTC()
	}
	dayBefore := func(d time.Time) time.Time { return d.AddDate(0, 0, -1) }
	dayAfter := func(d time.Time) time.Time { return d.AddDate(0, 0, 1) }

	clock := newTestClock(dayBefore(spring))
	schedulerWorker(t, e.client, clock.Now)
	// Step through the days one at a time (noon to noon), and through the repeated
	// hour of the fall-back night.
	for _, step := range []time.Time{
		dayBefore(spring), spring, dayAfter(spring),
		dayBefore(fall), at(fall, 1, 45, "EDT"), at(fall, 1, 45, "EST"), fall, dayAfter(fall),
	} {
		advanceTo(t, e.client, clock, step, "at-2", "at-1-30")
	}

	days := map[string]bool{}
	for _, d := range []time.Time{dayBefore(spring), spring, dayAfter(spring), dayBefore(fall), fall, dayAfter(fall)} {
		days[d.Format(time.DateOnly)] = true
	}
	for _, tt := range []struct {
		id   string
		want []time.Time
	}{
		{"at-2", []time.Time{
			at(dayBefore(spring), 2, 0, "EST"), at(spring, 3, 0, "EDT"), at(dayAfter(spring), 2, 0, "EDT"),
			at(dayBefore(fall), 2, 0, "EDT"), at(fall, 2, 0, "EST"), at(dayAfter(fall), 2, 0, "EST"),
		}},
		{"at-1-30", []time.Time{
			at(dayBefore(spring), 1, 30, "EST"), at(spring, 1, 30, "EST"), at(dayAfter(spring), 1, 30, "EDT"),
			at(dayBefore(fall), 1, 30, "EDT"), at(fall, 1, 30, "EDT"), at(dayAfter(fall), 1, 30, "EST"),
		}},
	} {
		var got []time.Time
		perDay := map[string]int{}
		for _, tick := range ticksOf(scheduleRuns(t, e.client, tt.id)) {
			perDay[tick.In(ny).Format(time.DateOnly)]++
			if days[tick.In(ny).Format(time.DateOnly)] { // the days around the changes
				got = append(got, tick)
			}
		}
		for day, n := range perDay {
			if n != 1 {
				t.Errorf("%s fired %d times on %s", tt.id, n, day)
			}
		}
		if !slices.EqualFunc(got, tt.want, time.Time.Equal) {
			t.Errorf("%s fired\n %v\nwant\n %v", tt.id, inZone(got, ny), inZone(tt.want, ny))
		}
	}
}

func inZone(ts []time.Time, loc *time.Location) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.In(loc).Format("2006-01-02 15:04 MST")
	}
	return out
}

func TestInvalidSchedulesAreRejectedWithWhatIsWrongAndNothingWritten(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	ok := kagzi.Schedule{ID: "report", WorkflowType: "generate-report", Cron: "0 6 * * *"}
	tests := []struct {
		name    string
		edit    func(*kagzi.Schedule)
		mention string
	}{
		{"too few fields", func(s *kagzi.Schedule) { s.Cron = "0 6 * *" }, "expected exactly 5 fields"},
		{"minute out of range", func(s *kagzi.Schedule) { s.Cron = "61 6 * * *" }, "61"},
		{"unknown descriptor", func(s *kagzi.Schedule) { s.Cron = "@fortnightly" }, "@fortnightly"},
		{"six fields without Seconds", func(s *kagzi.Schedule) { s.Cron = "0 0 6 * * *" }, "6-field"},
		{"never fires", func(s *kagzi.Schedule) { s.Cron = "0 0 31 2 *" }, "never fires"},
		{"sub-second interval", func(s *kagzi.Schedule) { s.Cron = "@every 500ms" }, "at least 1s"},
		{"unknown zone", func(s *kagzi.Schedule) { s.TimeZone = "Europe/Atlantis" }, "Europe/Atlantis"},
		{"local zone", func(s *kagzi.Schedule) { s.TimeZone = "Local" }, "Local"},
		{"empty id", func(s *kagzi.Schedule) { s.ID = "" }, "empty schedule id"},
		{"long id", func(s *kagzi.Schedule) { s.ID = strings.Repeat("x", 201) }, "longer than 200"},
		{"empty workflow type", func(s *kagzi.Schedule) { s.WorkflowType = "" }, "empty workflow type"},
		{"negative catch-up", func(s *kagzi.Schedule) { s.MaxCatchup = -1 }, "MaxCatchup"},
		{"huge catch-up", func(s *kagzi.Schedule) { s.MaxCatchup = 1001 }, "MaxCatchup"},
		{"unknown overlap", func(s *kagzi.Schedule) { s.Overlap = 7 }, "overlap"},
		{"input not JSON", func(s *kagzi.Schedule) { s.Input = json.RawMessage("{") }, "not valid JSON"},
		{"input not encodable", func(s *kagzi.Schedule) { s.Input = func() {} }, "does not encode"},
		// Workflow (WorkflowType's old name) naming another type was ignored.
		{"two workflow types", func(s *kagzi.Schedule) { s.Workflow = "other" }, "disagree"},
	}
	for _, tt := range tests {
		s := ok
		tt.edit(&s)
		_, err := e.client.CreateSchedule(ctx, s)
		if !errors.Is(err, kagzi.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.mention) {
			t.Errorf("%s: CreateSchedule = %v, want ErrInvalidArgument mentioning %q", tt.name, err, tt.mention)
		}
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.schedules`); n != 0 {
		t.Fatalf("%d schedules written by invalid creates", n)
	}

	// An update with a bad definition changes nothing either.
	created, err := e.client.CreateSchedule(ctx, ok)
	if err != nil {
		t.Fatal(err)
	}
	bad := ok
	bad.Cron, bad.TimeZone = "0 7 * * *", "Nowhere/Special"
	if _, err := e.client.UpdateSchedule(ctx, bad); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Fatalf("UpdateSchedule with a bad zone = %v, want ErrInvalidArgument", err)
	}
	if got := getSchedule(t, e.client, "report"); got.Cron != "0 6 * * *" || got.TimeZone != "UTC" ||
		!got.UpdatedAt.Equal(created.UpdatedAt) {
		t.Fatalf("schedule changed by a rejected update: %+v", got)
	}
	if _, err := e.client.CreateSchedule(ctx, ok); !errors.Is(err, kagzi.ErrAlreadyExists) {
		t.Fatalf("second CreateSchedule of the id = %v, want ErrAlreadyExists", err)
	}
	for name, err := range map[string]error{
		"get":     func() error { _, err := e.client.GetSchedule(ctx, "missing"); return err }(),
		"update":  func() error { s := ok; s.ID = "missing"; _, err := e.client.UpdateSchedule(ctx, s); return err }(),
		"delete":  e.client.DeleteSchedule(ctx, "missing"),
		"pause":   e.client.PauseSchedule(ctx, "missing"),
		"resume":  e.client.ResumeSchedule(ctx, "missing"),
		"trigger": func() error { _, err := e.client.TriggerSchedule(ctx, "missing"); return err }(),
	} {
		if !errors.Is(err, kagzi.ErrNotFound) {
			t.Errorf("%s of an unknown schedule = %v, want ErrNotFound", name, err)
		}
	}
}

func TestScheduleFieldsDescriptorsAndUpdates(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	before := time.Now()
	info, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: "every-90s", WorkflowType: "sched-nobody",
		Cron: "@every 90s", Input: map[string]int{"n": 1}, MaxCatchup: 5, Overlap: kagzi.OverlapSkip})
	if err != nil {
		t.Fatal(err)
	}
	if info.Namespace != "default" || info.TimeZone != "UTC" || string(info.Input) != `{"n": 1}` && string(info.Input) != `{"n":1}` ||
		info.Overlap != kagzi.OverlapSkip || info.MaxCatchup != 5 || info.Paused || info.LastFiredAt != nil {
		t.Fatalf("created %+v", info)
	}
	if d := info.NextFireAt.Sub(before); d < 89*time.Second || d > 91*time.Second {
		t.Fatalf("first tick of @every 90s is %v after the create", d)
	}
	for _, cron := range []string{"@daily", "@hourly", "@weekly", "@monthly", "@yearly", "*/5 9-17 * * MON-FRI"} {
		if _, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: "d" + cron, WorkflowType: "w", Cron: cron}); err != nil {
			t.Errorf("CreateSchedule(%q): %v", cron, err)
		}
	}

	// Changing the input keeps the next tick; changing the cron expression moves it.
	s := info.Schedule()
	s.Input = "new"
	updated, err := e.client.UpdateSchedule(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if string(updated.Input) != `"new"` || !updated.NextFireAt.Equal(*info.NextFireAt) || updated.Overlap != kagzi.OverlapSkip {
		t.Fatalf("after an input update: %+v", updated)
	}
	s.Cron, s.TimeZone = "0 6 * * *", "Asia/Tokyo"
	updated, err = e.client.UpdateSchedule(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if local := updated.NextFireAt.In(mustLoad(t, "Asia/Tokyo")); local.Hour() != 6 || local.Minute() != 0 {
		t.Fatalf("next tick after the update is %v, want 06:00 in Tokyo", local)
	}
	s.Paused = true
	if updated, err = e.client.UpdateSchedule(ctx, s); err != nil || !updated.Paused || updated.NextFireAt != nil {
		t.Fatalf("update to paused: %+v, %v", updated, err)
	}

	// Listing: pages by id, filters by workflow type and pause state.
	var ids []string
	for token := ""; ; {
		page, err := e.client.ListSchedules(ctx, kagzi.ScheduleFilter{PageSize: 3, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range page.Schedules {
			ids = append(ids, s.ID)
		}
		if token = page.NextPageToken; token == "" {
			break
		}
	}
	if len(ids) != 7 || !slices.IsSorted(ids) {
		t.Fatalf("listed %v, want 7 schedules by id", ids)
	}
	paused := true
	page, err := e.client.ListSchedules(ctx, kagzi.ScheduleFilter{Paused: &paused})
	if err != nil || len(page.Schedules) != 1 || page.Schedules[0].ID != "every-90s" {
		t.Fatalf("paused schedules: %+v, %v", page, err)
	}
	page, err = e.client.ListSchedules(ctx, kagzi.ScheduleFilter{WorkflowType: "w"})
	if err != nil || len(page.Schedules) != 6 {
		t.Fatalf("schedules of w: %d, %v", len(page.Schedules), err)
	}
	if _, err := e.client.ListSchedules(ctx, kagzi.ScheduleFilter{PageToken: "garbage!"}); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Fatalf("bad page token: %v", err)
	}

	// Nothing crosses namespaces.
	other := newClient(t, e.pool, "other")
	if _, err := other.GetSchedule(ctx, "every-90s"); !errors.Is(err, kagzi.ErrNotFound) {
		t.Fatalf("GetSchedule from another namespace = %v", err)
	}
	if page, err := other.ListSchedules(ctx, kagzi.ScheduleFilter{}); err != nil || len(page.Schedules) != 0 {
		t.Fatalf("ListSchedules from another namespace: %+v, %v", page, err)
	}
}

func mustLoad(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Skip("no tzdata:", err)
	}
	return loc
}

func TestResumeAfterPauseDoesNotBackFill(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	// Resume reads the real clock, so this test runs on it: a tick a second.
	if _, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: "pausable", WorkflowType: "sched-nobody",
		Cron: "* * * * * *", Seconds: true, MaxCatchup: 100}); err != nil {
		t.Fatal(err)
	}
	schedulerWorker(t, e.client, nil)
	eventually(t, "a first tick", func() bool { return len(scheduleRuns(t, e.client, "pausable")) > 0 })

	if err := e.client.PauseSchedule(ctx, "pausable"); err != nil {
		t.Fatal(err)
	}
	pausedAt := time.Now()
	if err := e.client.PauseSchedule(ctx, "pausable"); err != nil { // a no-op
		t.Fatal(err)
	}
	if s := getSchedule(t, e.client, "pausable"); !s.Paused || s.NextFireAt != nil {
		t.Fatalf("paused schedule: %+v", s)
	}
	firedBefore := len(scheduleRuns(t, e.client, "pausable"))
	time.Sleep(1500 * time.Millisecond) // at least one tick passes while paused
	if n := len(scheduleRuns(t, e.client, "pausable")); n != firedBefore {
		t.Fatalf("%d runs fired while paused", n-firedBefore)
	}

	resumedAt := time.Now()
	if err := e.client.ResumeSchedule(ctx, "pausable"); err != nil {
		t.Fatal(err)
	}
	if err := e.client.ResumeSchedule(ctx, "pausable"); err != nil { // a no-op
		t.Fatal(err)
	}
	s := getSchedule(t, e.client, "pausable")
	if s.Paused || s.NextFireAt == nil || !s.NextFireAt.After(resumedAt) || s.NextFireAt.Sub(resumedAt) > time.Second {
		t.Fatalf("resumed at %v, next tick %v: want the first tick after the resume", resumedAt, s.NextFireAt)
	}
	eventually(t, "a tick after the resume", func() bool { return len(scheduleRuns(t, e.client, "pausable")) > firedBefore })
	for _, tick := range ticksOf(scheduleRuns(t, e.client, "pausable")) {
		if tick.After(pausedAt) && !tick.After(resumedAt) {
			t.Fatalf("tick %v, due while paused (%v to %v), was back-filled", tick, pausedAt, resumedAt)
		}
	}
	if s := getSchedule(t, e.client, "pausable"); s.CatchupSkipped != 0 {
		t.Fatalf("CatchupSkipped = %d: paused ticks are not missed ticks", s.CatchupSkipped)
	}
}

func TestDeletedScheduleStopsFiringAndKeepsItsRuns(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	info, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: "doomed", WorkflowType: "sched-nobody", Cron: "* * * * *"})
	if err != nil {
		t.Fatal(err)
	}
	first := *info.NextFireAt
	clock := newTestClock(first)
	schedulerWorker(t, e.client, clock.Now)
	advanceTo(t, e.client, clock, first, "doomed")
	if err := e.client.DeleteSchedule(ctx, "doomed"); err != nil {
		t.Fatal(err)
	}
	clock.Set(first.Add(5 * time.Minute))
	time.Sleep(300 * time.Millisecond) // a few scheduler looks at the injected clock
	runs := scheduleRuns(t, e.client, "doomed")
	if len(runs) != 1 || runs[0].ScheduleID != "doomed" {
		t.Fatalf("runs after the delete: %+v, want the one fired before it", runs)
	}
	if _, err := e.client.GetSchedule(ctx, "doomed"); !errors.Is(err, kagzi.ErrNotFound) {
		t.Fatalf("GetSchedule after delete = %v", err)
	}
}

func TestTriggerScheduleFiresAnExtraRunAtOnce(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	if _, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: "nightly", WorkflowType: schedTick.Name(),
		Cron: "0 3 * * *", Input: "manual", Paused: true}); err != nil {
		t.Fatal(err)
	}
	schedulerWorker(t, e.client, nil)
	// A run started by hand is not the schedule's.
	if _, err := kagzi.Start(ctx, e.client, schedTick, "by hand"); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	run, err := e.client.TriggerSchedule(ctx, "nightly")
	if err != nil {
		t.Fatal(err)
	}
	out, err := run.Wait(ctx)
	if err != nil || string(out) != `"tick manual"` {
		t.Fatalf("triggered run: %s, %v", out, err)
	}
	runs := scheduleRuns(t, e.client, "nightly")
	if len(runs) != 1 || runs[0].RunID != run.RunID || !strings.HasPrefix(run.WorkflowID, "nightly@trigger/") ||
		runs[0].ScheduleTick == nil || runs[0].ScheduleTick.Before(before.Add(-time.Second)) {
		t.Fatalf("runs of the schedule: %+v (triggered %+v)", runs, run)
	}
	s := getSchedule(t, e.client, "nightly")
	if s.LastRunID != run.RunID || s.LastFiredAt == nil || !s.Paused {
		t.Fatalf("schedule after the trigger: %+v", s)
	}
}

func TestATickNeverFiresTwiceEvenAfterItsRunFinished(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	info, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: "once", WorkflowType: schedTick.Name(), Cron: "* * * * *", Input: "t"})
	if err != nil {
		t.Fatal(err)
	}
	first := *info.NextFireAt
	clock := newTestClock(first)
	schedulerWorker(t, e.client, clock.Now)
	advanceTo(t, e.client, clock, first, "once")
	runs := scheduleRuns(t, e.client, "once")
	if len(runs) != 1 {
		t.Fatalf("%d runs, want 1", len(runs))
	}
	eventually(t, "the tick's run to complete", func() bool { return runStatus(t, e.client, runs[0].RunID) == kagzi.StatusCompleted })

	// Make the tick due again behind Kagzi's back (as a clock gone backwards would):
	// its workflow id is never reused, so no second run starts.
	if _, err := e.pool.Exec(ctx, `UPDATE kagzi.schedules SET next_fire_at = $1`, first); err != nil {
		t.Fatal(err)
	}
	advanceTo(t, e.client, clock, first, "once")
	if runs := scheduleRuns(t, e.client, "once"); len(runs) != 1 {
		t.Fatalf("%d runs after the tick came due again, want 1", len(runs))
	}
}

func TestSchedulesOfANamespaceAreFiredOnlyByItsWorkers(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	other := newClient(t, e.pool, "other")
	info, err := other.CreateSchedule(ctx, kagzi.Schedule{ID: "theirs", WorkflowType: "sched-nobody", Cron: "* * * * *"})
	if err != nil {
		t.Fatal(err)
	}
	clock := newTestClock(info.NextFireAt.Add(time.Minute))
	schedulerWorker(t, e.client, clock.Now) // the default namespace's worker
	time.Sleep(300 * time.Millisecond)
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs`); n != 0 {
		t.Fatalf("a worker fired %d runs of another namespace's schedule", n)
	}
	schedulerWorker(t, other, clock.Now)
	advanceTo(t, other, clock, clock.Now(), "theirs")
	if runs := scheduleRuns(t, other, "theirs"); len(runs) != 1 || runs[0].Namespace != "other" {
		t.Fatalf("runs in the schedule's namespace: %+v", runs)
	}
}

func TestWorkerWithDisableSchedulerFiresNothing(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	info, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: "ignored", WorkflowType: "sched-nobody", Cron: "* * * * *"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := fastWorker()
	cfg.DisableScheduler = true
	cfg.Clock = newTestClock(info.NextFireAt.Add(time.Hour)).Now
	runWorker(t, e.client, cfg, schedUnclaimed)
	time.Sleep(300 * time.Millisecond)
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs`); n != 0 {
		t.Fatalf("a worker without a scheduler fired %d runs", n)
	}
}

// schedChain waits for a signal "next": "continue" continues it as new, anything else
// ends it.
var schedChain = kagzi.Define("sched-chain", func(ctx *kagzi.Context, gen int) (int, error) {
	v, err := kagzi.WaitSignal[string](ctx, "next", 0)
	if err != nil {
		return 0, err
	}
	if v == "continue" {
		return 0, kagzi.ContinueAsNew(ctx, gen+1)
	}
	return gen, nil
})

// A run a schedule fired that continues as new is still the tick's: the next run
// keeps the schedule and the tick, so the overlap policy holds the schedule back until
// the chain ends, and the schedule's runs list it (found from outside: under
// OverlapSkip, three chains of continued runs active at once).
func TestAScheduledRunThatContinuesAsNewHoldsTheScheduleBackUntilItsChainEnds(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	skip, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: "chain-skip", WorkflowType: "sched-chain",
		Cron: "* * * * *", Overlap: kagzi.OverlapSkip, Input: 0})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: "chain-buffer", WorkflowType: "sched-chain",
		Cron: "* * * * *", Overlap: kagzi.OverlapBufferOne, Input: 0}); err != nil {
		t.Fatal(err)
	}
	first := *skip.NextFireAt
	clock := newTestClock(first)
	cfg := fastWorker()
	cfg.Clock = clock.Now
	runWorker(t, e.client, cfg, schedChain)
	advanceTo(t, e.client, clock, first, "chain-skip", "chain-buffer")
	for _, id := range []string{"chain-skip", "chain-buffer"} {
		runs := scheduleRuns(t, e.client, id)
		if len(runs) != 1 {
			t.Fatalf("%s: %d runs after the first tick, want 1", id, len(runs))
		}
		// The fired run continues as new (the signal waits in the run until it is taken).
		if err := e.client.Signal(ctx, runs[0].RunID, "next", "continue"); err != nil {
			t.Fatal(err)
		}
		eventually(t, id+"'s run to continue as new", func() bool {
			return len(scheduleRuns(t, e.client, id)) == 2
		})
		runs = scheduleRuns(t, e.client, id)
		if !runs[1].ScheduleTick.Equal(first) || runs[1].WorkflowID != runs[0].WorkflowID {
			t.Fatalf("%s: the continued run's tick %v and workflow id %q, want %v and %q", id, runs[1].ScheduleTick,
				runs[1].WorkflowID, first, runs[0].WorkflowID)
		}
	}
	// The next tick comes while the continued runs are active: skipped, or buffered.
	advanceTo(t, e.client, clock, first.Add(time.Minute), "chain-skip", "chain-buffer")
	if s := getSchedule(t, e.client, "chain-skip"); s.OverlapSkipped != 1 || len(scheduleRuns(t, e.client, "chain-skip")) != 2 {
		t.Fatalf("chain-skip: skipped %d, %d runs; want the tick skipped while the chain is active", s.OverlapSkipped,
			len(scheduleRuns(t, e.client, "chain-skip")))
	}
	if s := getSchedule(t, e.client, "chain-buffer"); s.BufferedTick == nil || len(scheduleRuns(t, e.client, "chain-buffer")) != 2 {
		t.Fatalf("chain-buffer: buffered %v, %d runs; want the tick held back while the chain is active", s.BufferedTick,
			len(scheduleRuns(t, e.client, "chain-buffer")))
	}
	// The chains end: the buffered tick fires (the clock stands still).
	for _, id := range []string{"chain-skip", "chain-buffer"} {
		if err := e.client.SignalWorkflow(ctx, scheduleRuns(t, e.client, id)[0].WorkflowID, "next", "done"); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the buffered tick to fire once the chain ended", func() bool {
		return len(scheduleRuns(t, e.client, "chain-buffer")) == 3
	})
	if got := ticksOf(scheduleRuns(t, e.client, "chain-buffer")); !got[2].Equal(first.Add(time.Minute)) {
		t.Fatalf("chain-buffer fired %v, want the held tick %v third", got, first.Add(time.Minute))
	}
}

// Found from outside: a schedule in a time zone one process's tzdata lacks failed the
// transaction that fired its batch, and, first in every later batch, stopped every
// schedule of the namespace in that process. The process passes over it now.
func TestASchedulesTimeZoneAProcessCannotReadDoesNotStopTheOtherSchedules(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	for _, id := range []string{"a-unreadable", "b-readable"} {
		if _, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: id, WorkflowType: "sched-nobody",
			Cron: "* * * * * *", Seconds: true}); err != nil {
			t.Fatal(err)
		}
	}
	// As a process whose tzdata lacks the zone sees it (claimed first: it is due first).
	if _, err := e.pool.Exec(ctx, `UPDATE kagzi.schedules SET time_zone = 'Nowhere/Unknown',
		next_fire_at = next_fire_at - interval '1 second' WHERE schedule_id = 'a-unreadable'`); err != nil {
		t.Fatal(err)
	}
	schedulerWorker(t, e.client, time.Now)
	eventually(t, "the readable schedule to fire three ticks", func() bool {
		return len(scheduleRuns(t, e.client, "b-readable")) >= 3
	})
	if n := len(scheduleRuns(t, e.client, "a-unreadable")); n != 0 {
		t.Fatalf("the unreadable schedule fired %d runs", n)
	}
}
