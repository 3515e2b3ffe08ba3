package cronspec

import (
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // the zones the tests use, whatever the host has
)

var newYork = mustZone("America/New_York")

func mustZone(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(err)
	}
	return loc
}

func ny(y int, m time.Month, d, h, min int, zone string) time.Time {
	// zone "EST"/"EDT" picks the offset explicitly, so repeated times are unambiguous.
	off := map[string]int{"EST": -5, "EDT": -4}[zone]
	return time.Date(y, m, d, h, min, 0, 0, time.FixedZone(zone, off*3600)).UTC()
}

// fires lists the fire times strictly after `after` and up to `until`.
func fires(t *testing.T, s *Spec, after, until time.Time) []time.Time {
	t.Helper()
	var out []time.Time
	for at := s.Next(after); !at.IsZero() && !at.After(until); at = s.Next(at) {
		out = append(out, at)
		if len(out) > 1000 {
			t.Fatal("too many fire times")
		}
	}
	return out
}

func TestFireTimesOnDaylightSavingDaysInNewYork(t *testing.T) {
	springFrom, springTo := ny(2026, 3, 7, 12, 0, "EST"), ny(2026, 3, 9, 12, 0, "EDT")
	fallFrom, fallTo := ny(2026, 10, 31, 12, 0, "EDT"), ny(2026, 11, 2, 12, 0, "EST")
	tests := []struct {
		name     string
		expr     string
		from, to time.Time
		want     []time.Time
	}{
		{"a time skipped by spring-forward fires at the end of the gap", "0 2 * * *", springFrom, springTo,
			[]time.Time{ny(2026, 3, 8, 3, 0, "EDT"), ny(2026, 3, 9, 2, 0, "EDT")}},
		{"a skipped half hour fires at the end of the gap", "30 2 * * *", springFrom, springTo,
			[]time.Time{ny(2026, 3, 8, 3, 0, "EDT"), ny(2026, 3, 9, 2, 30, "EDT")}},
		{"a time before the gap is unaffected in spring", "30 1 * * *", springFrom, springTo,
			[]time.Time{ny(2026, 3, 8, 1, 30, "EST"), ny(2026, 3, 9, 1, 30, "EDT")}},
		{"the end of the gap fires once in spring", "0 3 * * *", springFrom, springTo,
			[]time.Time{ny(2026, 3, 8, 3, 0, "EDT"), ny(2026, 3, 9, 3, 0, "EDT")}},
		{"a time repeated by fall-back fires at its first occurrence only", "30 1 * * *", fallFrom, fallTo,
			[]time.Time{ny(2026, 11, 1, 1, 30, "EDT"), ny(2026, 11, 2, 1, 30, "EST")}},
		{"the start of the repeated hour fires once", "0 1 * * *", fallFrom, fallTo,
			[]time.Time{ny(2026, 11, 1, 1, 0, "EDT"), ny(2026, 11, 2, 1, 0, "EST")}},
		{"the end of the repeated hour fires once in the fall", "0 2 * * *", fallFrom, fallTo,
			[]time.Time{ny(2026, 11, 1, 2, 0, "EST"), ny(2026, 11, 2, 2, 0, "EST")}},
		{"every half hour across spring-forward", "*/30 * * * *", ny(2026, 3, 8, 0, 45, "EST"), ny(2026, 3, 8, 4, 0, "EDT"),
			[]time.Time{
				ny(2026, 3, 8, 1, 0, "EST"), ny(2026, 3, 8, 1, 30, "EST"),
				ny(2026, 3, 8, 3, 0, "EDT"), // 02:00, 02:30 and 03:00 coalesce
				ny(2026, 3, 8, 3, 30, "EDT"), ny(2026, 3, 8, 4, 0, "EDT"),
			}},
		{"every half hour across fall-back", "*/30 * * * *", ny(2026, 11, 1, 0, 45, "EDT"), ny(2026, 11, 1, 3, 0, "EST"),
			[]time.Time{
				ny(2026, 11, 1, 1, 0, "EDT"), ny(2026, 11, 1, 1, 30, "EDT"),
				// 01:00 EST and 01:30 EST repeat times that already fired
				ny(2026, 11, 1, 2, 0, "EST"), ny(2026, 11, 1, 2, 30, "EST"), ny(2026, 11, 1, 3, 0, "EST"),
			}},
		{"hourly across fall-back", "@hourly", ny(2026, 11, 1, 0, 30, "EDT"), ny(2026, 11, 1, 3, 0, "EST"),
			[]time.Time{ny(2026, 11, 1, 1, 0, "EDT"), ny(2026, 11, 1, 2, 0, "EST"), ny(2026, 11, 1, 3, 0, "EST")}},
		{"daily descriptor on spring-forward day", "@daily", springFrom, springTo,
			[]time.Time{ny(2026, 3, 8, 0, 0, "EST"), ny(2026, 3, 9, 0, 0, "EDT")}},
		{"weekdays only skips the weekend", "0 2 * * MON-FRI", ny(2026, 3, 6, 12, 0, "EST"), ny(2026, 3, 10, 12, 0, "EDT"),
			[]time.Time{ny(2026, 3, 9, 2, 0, "EDT"), ny(2026, 3, 10, 2, 0, "EDT")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse(tt.expr, false, "America/New_York")
			if err != nil {
				t.Fatal(err)
			}
			got := fires(t, s, tt.from, tt.to)
			if !equalTimes(got, tt.want) {
				t.Fatalf("fire times of %q after %v:\n got %v\nwant %v", tt.expr, tt.from.In(newYork), inNY(got), inNY(tt.want))
			}
			// Next gives the same answer from any point between two fire times.
			prev := tt.from
			for _, want := range tt.want {
				for _, probe := range []time.Time{prev, prev.Add(time.Second), want.Add(-time.Second), want.Add(-time.Nanosecond)} {
					if !probe.Before(want) || probe.Before(prev) {
						continue
					}
					if got := s.Next(probe); !got.Equal(want) {
						t.Fatalf("Next(%v) = %v, want %v", probe.In(newYork), got.In(newYork), want.In(newYork))
					}
				}
				prev = want
			}
		})
	}
}

func TestDailyScheduleFiresOncePerDayAcrossAYearOfDaylightSavingChanges(t *testing.T) {
	for _, expr := range []string{"0 2 * * *", "30 1 * * *", "59 1 * * *", "0 0 * * *"} {
		s, err := Parse(expr, false, "America/New_York")
		if err != nil {
			t.Fatal(err)
		}
		got := fires(t, s, ny(2025, 12, 31, 12, 0, "EST"), ny(2026, 12, 31, 12, 0, "EST"))
		if len(got) != 365 {
			t.Fatalf("%q fired %d times in 2026, want 365", expr, len(got))
		}
		days := map[string]bool{}
		for _, at := range got {
			days[at.In(newYork).Format("2006-01-02")] = true
		}
		if len(days) != 365 {
			t.Fatalf("%q fired on %d distinct days, want 365", expr, len(days))
		}
	}
}

func TestEveryIsAbsoluteTimeAcrossDaylightSaving(t *testing.T) {
	s, err := Parse("@every 90m", false, "America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	from := ny(2026, 11, 1, 0, 0, "EDT")
	got := fires(t, s, from, from.Add(6*time.Hour))
	if len(got) != 4 {
		t.Fatalf("got %d fire times, want 4: %v", len(got), got)
	}
	for i, at := range got {
		if want := from.Add(time.Duration(i+1) * 90 * time.Minute); !at.Equal(want) {
			t.Fatalf("fire %d at %v, want %v", i, at, want)
		}
	}
}

func TestSecondsFieldWhenAskedFor(t *testing.T) {
	s, err := Parse("*/15 * * * * *", true, "")
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 1, 1, 0, 0, 7, 0, time.UTC)
	if got, want := s.Next(base), base.Add(8*time.Second); !got.Equal(want) {
		t.Fatalf("Next = %v, want %v", got, want)
	}
	if _, err := Parse("*/15 * * * * *", false, ""); err == nil {
		t.Fatal("a 6-field expression was accepted without seconds")
	}
	if _, err := Parse("*/15 * * * *", true, ""); err == nil {
		t.Fatal("a 5-field expression was accepted with seconds")
	}
}

func TestInvalidExpressionsAndZonesSayWhatIsWrong(t *testing.T) {
	tests := []struct {
		expr, zone string
		seconds    bool
		mention    string
	}{
		{"", "", false, "empty"},
		{"* * *", "", false, "expected exactly 5 fields"},
		{"61 * * * *", "", false, "61"},
		{"0 25 * * *", "", false, "25"},
		{"@sometimes", "", false, "@sometimes"},
		{"@every 0s", "", false, "at least 1s"},
		{"@every 1500ms", "", false, "whole number of seconds"},
		{"@every often", "", false, "not a duration"},
		{"0 0 30 2 *", "", false, "never fires"},
		{"TZ=UTC 0 * * * *", "", false, "time zone separately"},
		{"0 6 * * *", "Mars/Olympus_Mons", false, "Mars/Olympus_Mons"},
		{"0 6 * * *", "Local", false, "Local"},
		{"0 6 * * *", "est5edt ", false, "not an IANA time zone"},
		{"0 6 * * " + strings.Repeat("1,", 600) + "1", "", false, "longer than 1024 bytes"},
	}
	for _, tt := range tests {
		_, err := Parse(tt.expr, tt.seconds, tt.zone)
		if err == nil {
			t.Errorf("Parse(%q, %q) accepted", tt.expr, tt.zone)
			continue
		}
		if !strings.Contains(err.Error(), tt.mention) {
			t.Errorf("Parse(%q, %q) = %v, want an error that mentions %q", tt.expr, tt.zone, err, tt.mention)
		}
	}
}

func TestDueKeepsTheMostRecentMaxInOrderAndCountsTheRest(t *testing.T) {
	from := time.Date(2026, 1, 1, 6, 0, 0, 0, time.UTC)
	now := from.Add(9*24*time.Hour + time.Hour) // ten daily fire times are due
	for _, expr := range []string{"0 6 * * *", "@every 24h"} {
		s, err := Parse(expr, false, "")
		if err != nil {
			t.Fatal(err)
		}
		due, skipped, next := s.Due(from, now, 3)
		want := []time.Time{from.Add(7 * 24 * time.Hour), from.Add(8 * 24 * time.Hour), from.Add(9 * 24 * time.Hour)}
		if !equalTimes(due, want) || skipped != 7 || !next.Equal(from.Add(10*24*time.Hour)) {
			t.Fatalf("%q: Due = %v, %d skipped, next %v; want %v, 7 skipped, next %v",
				expr, due, skipped, next, want, from.Add(10*24*time.Hour))
		}
		due, skipped, next = s.Due(from, from.Add(-time.Second), 3)
		if len(due) != 0 || skipped != 0 || !next.Equal(from) {
			t.Fatalf("%q: nothing due yet, got %v, %d, %v", expr, due, skipped, next)
		}
		due, skipped, _ = s.Due(from, now, 0)
		if len(due) != 1 || skipped != 9 {
			t.Fatalf("%q: max 0 keeps the most recent one: got %v, %d skipped", expr, due, skipped)
		}
	}
}

func TestDueCountsAHugeBacklogInBoundedChunks(t *testing.T) {
	s, err := Parse("* * * * * *", true, "")
	if err != nil {
		t.Fatal(err)
	}
	from := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := from.Add(1000 * time.Second) // 1001 fire times are due
	var total int64
	var due []time.Time
	calls := 0
	for t0 := from; ; calls++ {
		d, skipped, next := s.due(t0, now, 5, 100)
		total += skipped
		if len(d) > 0 {
			due = d
			if !next.After(now) {
				t.Fatalf("next %v is not after now once the fire times are listed", next)
			}
			break
		}
		t0 = next
	}
	if total != 996 || len(due) != 5 || !due[4].Equal(now) || calls < 5 {
		t.Fatalf("skipped %d (want 996), due %v, in %d calls", total, due, calls+1)
	}
}

func equalTimes(a, b []time.Time) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

func inNY(ts []time.Time) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.In(newYork).Format("2006-01-02 15:04 MST")
	}
	return out
}

// Found from outside: robfig/cron looks five years ahead, and 29 February falls eight
// years apart across 2100 (no leap year): a leap-day schedule found no tick after 2096
// and was paused for good.
func TestALeapDayScheduleFiresAcrossACenturyWithoutALeapYear(t *testing.T) {
	s, err := Parse("0 0 29 2 *", false, "UTC")
	if err != nil {
		t.Fatal(err)
	}
	got := fires(t, s, time.Date(2095, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2110, 1, 1, 0, 0, 0, 0, time.UTC))
	want := []time.Time{time.Date(2096, 2, 29, 0, 0, 0, 0, time.UTC), time.Date(2104, 2, 29, 0, 0, 0, 0, time.UTC),
		time.Date(2108, 2, 29, 0, 0, 0, 0, time.UTC)}
	if len(got) != len(want) {
		t.Fatalf("fire times %v, want %v", got, want)
	}
	for i := range want {
		if !got[i].Equal(want[i]) {
			t.Fatalf("fire times %v, want %v", got, want)
		}
	}
}
