// Package cronspec parses cron expressions (with github.com/robfig/cron/v3) and
// computes their fire times in a time zone, with one rule for daylight-saving
// changes: every scheduled local time fires exactly once.
//
//   - A local time skipped by a spring-forward change fires once, at the first instant
//     after the gap (a daily "0 2 * * *" in America/New_York fires at 03:00 EDT on the
//     spring-forward day). Several skipped times, and a scheduled time at the end of
//     the gap, coalesce into that one instant: a tick is an instant, and fires once.
//   - A local time repeated by a fall-back change fires once, at its first occurrence
//     (robfig/cron alone fires it twice).
//
// The rule is implemented by letting robfig/cron enumerate the matching wall-clock
// times in a zone without transitions (UTC used as a naive clock) and mapping each
// wall-clock time to the instant it names in the schedule's zone. That mapping is
// monotone, so the fire times form a well-defined sorted set, and Next gives the same
// answer whatever time it starts from.
//
// "@every <duration>" schedules are intervals of absolute time; daylight-saving
// changes do not affect them.
package cronspec

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// Spec is a parsed cron expression in a time zone. It is immutable and safe for
// concurrent use.
type Spec struct {
	expr  string
	loc   *time.Location
	every time.Duration      // "@every d"; zero for calendar schedules
	wall  *cron.SpecSchedule // calendar schedules: matches wall-clock times, Location UTC
}

// MaxLen bounds a cron expression: a real one is a few dozen bytes, and a schedule's
// expression is stored and parsed again by every scheduler.
const MaxLen = 1024

// Parse parses a cron expression in the IANA time zone zone ("" means UTC).
//
// expr is a standard 5-field expression (minute hour day-of-month month day-of-week),
// a descriptor (@yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly), or
// "@every <duration>" with a whole number of seconds, at least 1s ("@every 90s",
// "@every 1h30m"). With withSeconds, a calendar expression has 6 fields, the first
// being the second. The zone goes in zone, not in a "TZ=" prefix.
//
// Parse rejects an expression that never fires. Every error it returns means the
// input is invalid, and says what is wrong; an expression longer than MaxLen is one.
func Parse(expr string, withSeconds bool, zone string) (*Spec, error) {
	loc, err := LoadZone(zone)
	if err != nil {
		return nil, err
	}
	expr = strings.TrimSpace(expr)
	s := &Spec{expr: expr, loc: loc}
	switch {
	case expr == "":
		return nil, errors.New("empty cron expression")
	case len(expr) > MaxLen:
		return nil, fmt.Errorf("cron expression longer than %d bytes", MaxLen)
	case strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ="):
		return nil, fmt.Errorf("cron expression %q: give the time zone separately, not as a prefix", expr)
	case strings.HasPrefix(expr, "@every"):
		arg := strings.TrimSpace(strings.TrimPrefix(expr, "@every"))
		d, err := time.ParseDuration(arg)
		if err != nil {
			return nil, fmt.Errorf("cron expression %q: %q is not a duration such as 90s or 1h30m", expr, arg)
		}
		if d < time.Second || d%time.Second != 0 {
			return nil, fmt.Errorf("cron expression %q: the interval must be a whole number of seconds, at least 1s", expr)
		}
		s.every = d
		return s, nil
	}
	opts := cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor
	if withSeconds {
		opts |= cron.Second
	}
	sched, err := cron.NewParser(opts).Parse(expr)
	if err != nil {
		msg := err.Error()
		if strings.Contains(msg, "expected exactly") {
			if withSeconds {
				msg += " (with seconds: second minute hour day-of-month month day-of-week)"
			} else {
				msg += " (minute hour day-of-month month day-of-week; set seconds for a 6-field expression)"
			}
		}
		return nil, fmt.Errorf("cron expression %q: %s", expr, msg)
	}
	spec, ok := sched.(*cron.SpecSchedule)
	if !ok { // robfig returns a SpecSchedule for everything but @every
		return nil, fmt.Errorf("cron expression %q: unsupported schedule %T", expr, sched)
	}
	wall := *spec
	wall.Location = time.UTC
	s.wall = &wall
	if s.Next(time.Now()).IsZero() {
		return nil, fmt.Errorf("cron expression %q never fires", expr)
	}
	return s, nil
}

// LoadZone loads an IANA time zone; "" is UTC. "Local" is rejected: processes that
// share a schedule may not share a local zone.
func LoadZone(zone string) (*time.Location, error) {
	switch zone {
	case "", "UTC":
		return time.UTC, nil
	case "Local":
		return nil, errors.New("time zone \"Local\" differs between processes; name an IANA zone such as Europe/Paris")
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, fmt.Errorf("time zone %q is not an IANA time zone name (such as America/New_York): %v", zone, err)
	}
	return loc, nil
}

// String returns the expression.
func (s *Spec) String() string { return s.expr }

// Location returns the schedule's time zone.
func (s *Spec) Location() *time.Location { return s.loc }

// Every returns the interval of an "@every" schedule, zero for a calendar schedule.
func (s *Spec) Every() time.Duration { return s.every }

// Next returns the first fire time strictly after t, in UTC; the zero time if there
// is none within five years. For "@every d" it is t+d, rounded down to the second.
func (s *Spec) Next(t time.Time) time.Time {
	if s.every > 0 {
		return t.Add(s.every).Truncate(time.Second).UTC()
	}
	// Every wall-clock time whose instant is after t is at or after t's own wall-clock
	// time (see the package doc: a later instant with an earlier wall-clock time is
	// a repeated time's second occurrence, which does not fire).
	x := s.naive(t).Truncate(time.Second).Add(-time.Second)
	for {
		w := s.wallNext(x) // the first matching wall-clock time > x
		if w.IsZero() {
			return time.Time{}
		}
		if at := s.instant(w); at.After(t) {
			return at
		}
		x = w
	}
}

// wallNext returns the first matching wall-clock time after x, or zero when none
// comes within a century. robfig/cron looks five years on from x's year: a 29
// February falls eight years apart across 2100, which is no leap year.
func (s *Spec) wallNext(x time.Time) time.Time {
	for range 20 {
		if w := s.wall.Next(x); !w.IsZero() {
			return w
		}
		// Nothing up to the end of x's year + 5: go on from there.
		x = time.Date(x.Year()+6, time.January, 1, 0, 0, 0, 0, time.UTC).Add(-time.Second)
	}
	return time.Time{}
}

// naive returns t's wall-clock time in the schedule's zone, as a UTC time.
func (s *Spec) naive(t time.Time) time.Time {
	if s.loc == time.UTC {
		return t.UTC()
	}
	l := t.In(s.loc)
	return time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), l.Nanosecond(), time.UTC)
}

// instant returns the instant at which wall-clock time w (a UTC time read as a
// naive clock) happens in the schedule's zone: its first occurrence when a fall-back
// repeats it, the end of the gap when a spring-forward skips it.
func (s *Spec) instant(w time.Time) time.Time {
	if s.loc == time.UTC {
		return w
	}
	u := w.Unix()
	// Offsets are within ±14h, so a transition near w has the offset before it in
	// effect a day earlier and the offset after it a day later.
	var first time.Time
	for _, probe := range [...]int64{u - 86400, u, u + 86400} {
		_, off := time.Unix(probe, 0).In(s.loc).Zone()
		c := time.Unix(u-int64(off), 0)
		if s.naive(c).Equal(w) && (first.IsZero() || c.Before(first)) {
			first = c
		}
	}
	if !first.IsZero() {
		return first.UTC()
	}
	// w falls in a gap. Read with the offset from before the gap, it names an instant
	// just after the transition; the zone period that instant is in starts at the end
	// of the gap.
	_, before := time.Unix(u-86400, 0).In(s.loc).Zone()
	start, _ := time.Unix(u-int64(before), 0).In(s.loc).ZoneBounds()
	return start.UTC()
}

// Due lists the fire times from `from` (itself a fire time, normally the schedule's
// recorded next fire time) up to and including now, keeping the most recent max of
// them (max >= 1), in chronological order. skipped counts the older ones it drops.
// next is the first fire time it did not list or count: after now, unless the work
// was cut short (see below).
//
// The cost is proportional to the fire times counted. To bound it, Due counts at
// most about a hundred thousand of them per call: when more are due, and none of
// those it counted is among the most recent max, it returns no fire times, skipped
// as counted, and next at or before now; the caller records the progress and calls
// again.
func (s *Spec) Due(from, now time.Time, max int) (due []time.Time, skipped int64, next time.Time) {
	return s.due(from, now, max, 100_000)
}

func (s *Spec) due(from, now time.Time, max int, limit int64) (due []time.Time, skipped int64, next time.Time) {
	if max < 1 {
		max = 1
	}
	from = from.UTC()
	if from.After(now) {
		return nil, 0, from
	}
	if s.every > 0 {
		n := int64(now.Sub(from)/s.every) + 1 // fire times from, from+every, … <= now
		keep := min(n, int64(max))
		for k := n - keep; k < n; k++ {
			due = append(due, from.Add(time.Duration(k)*s.every))
		}
		return due, n - keep, from.Add(time.Duration(n) * s.every)
	}
	ring := make([]time.Time, 0, max) // the most recent max fire times seen
	var seen int64
	checked := false
	t := from
	for !t.IsZero() && !t.After(now) {
		if seen >= limit && !checked {
			if s.dueCount(t, now, max) == max {
				// At least max more are due: everything counted so far is older than
				// the most recent max, and is skipped.
				return nil, seen, t
			}
			checked = true // fewer than max remain: list them
		}
		if len(ring) == max {
			copy(ring, ring[1:])
			ring = ring[:max-1]
		}
		ring = append(ring, t)
		seen++
		t = s.Next(t)
	}
	return ring, seen - int64(len(ring)), t
}

// dueCount counts the fire times from t on that are due by now, up to max.
func (s *Spec) dueCount(t, now time.Time, max int) int {
	n := 0
	for n < max && !t.IsZero() && !t.After(now) {
		n++
		t = s.Next(t)
	}
	return n
}
