package ui

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

// cancelledWaiter is a run cancelled 6.1 s after it started, while it slept for an
// hour in one step and waited for a signal in another (the signal wait's step stays
// WAITING in the database).
func cancelledWaiter() (*kagzi.RunInfo, []kagzi.StepInfo) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	end := t0.Add(6100 * time.Millisecond)
	wake := t0.Add(100*time.Millisecond + time.Hour)
	run := &kagzi.RunInfo{RunID: "0195f2a0-0000-7000-8000-000000000001", WorkflowType: "nap", Status: kagzi.StatusCancelled,
		CreatedAt: t0, FinishedAt: &end, UpdatedAt: end}
	steps := []kagzi.StepInfo{
		{Key: "nap#1", Name: "nap", Kind: kagzi.KindSleep, Status: kagzi.StepWaiting, WakeAt: &wake,
			CreatedAt: t0.Add(100 * time.Millisecond), UpdatedAt: t0.Add(100 * time.Millisecond)},
		{Key: "approve#1", Name: "approve", Kind: kagzi.KindSignal, Status: kagzi.StepWaiting,
			CreatedAt: t0.Add(200 * time.Millisecond), UpdatedAt: t0.Add(200 * time.Millisecond)},
	}
	return run, steps
}

// Found by an outside tester: the sleep and the signal wait of a cancelled run were
// drawn up to now ("wakes in 58m 13s", "waiting") while the run's facts said it had
// finished after 6.1 s.
func TestAFinishedRunsOpenSleepAndSignalWaitEndWhenTheRunEndedAndSaySo(t *testing.T) {
	run, steps := cancelledWaiter()
	now := run.FinishedAt.Add(2 * time.Minute)
	lanes := runLanes(run, steps, nil, "n/default/", now)
	if len(lanes) != 3 {
		t.Fatalf("%d lanes, want the run, the sleep and the signal wait", len(lanes))
	}
	for _, l := range lanes[1:] {
		if len(l.bars) != 1 || !l.bars[0].end.Equal(*run.FinishedAt) {
			t.Errorf("lane %s: bars %+v, want one ending when the run ended (%s)", l.label, l.bars, ts(*run.FinishedAt))
		}
		if strings.Contains(l.note, "wakes in") || strings.Contains(l.note, "waiting") || !strings.Contains(l.note, "ended with the run") {
			t.Errorf("lane %s: note %q, want it to say that the wait ended with the run", l.label, l.note)
		}
		if title := l.bars[0].title; !strings.Contains(title, "CANCELLED") || strings.Contains(title, "so far") {
			t.Errorf("lane %s: bar title %q, want it to say that the run ended CANCELLED", l.label, title)
		}
	}
}

var axisLabel = regexp.MustCompile(`class="axis">\+([^<]*)</text>`)

// The axis of a finished run's timeline ends at the run's end: it does not stretch
// with every reload.
func TestAFinishedRunsTimelineEndsAtTheRunsEndAtEveryReload(t *testing.T) {
	run, steps := cancelledWaiter()
	first := timeline(run, steps, nil, "n/default/", run.FinishedAt.Add(time.Second))
	later := timeline(run, steps, nil, "n/default/", run.FinishedAt.Add(3*time.Hour))
	if first != later {
		t.Errorf("the timeline of a finished run changes with the time it is drawn:\n%s\n%s", first, later)
	}
	labels := axisLabel.FindAllStringSubmatch(string(first), -1)
	if len(labels) == 0 || labels[len(labels)-1][1] != took(*run) {
		t.Errorf("the axis ends at %v, want +%s (the run took %s)", labels, took(*run), took(*run))
	}
}

// An unfinished run's sleep and signal wait still run to now, and say for how long.
func TestAnUnfinishedRunsSleepAndSignalWaitRunToNow(t *testing.T) {
	run, steps := cancelledWaiter()
	run.Status, run.FinishedAt = kagzi.StatusSleeping, nil
	now := run.CreatedAt.Add(90 * time.Second)
	lanes := runLanes(run, steps, nil, "n/default/", now)
	if l := lanes[1]; !l.bars[0].end.Equal(now) || !strings.HasPrefix(l.note, "wakes in 58m") {
		t.Errorf("the sleep: ends %s, note %q; want it drawn to now and waking in 58m", ts(l.bars[0].end), l.note)
	}
	if l := lanes[2]; !l.bars[0].end.Equal(now) || l.note != "waiting" {
		t.Errorf("the signal wait: ends %s, note %q; want it drawn to now and waiting", ts(l.bars[0].end), l.note)
	}
}

// Lane labels and notes fit in the image, whatever their length: a long one is cut,
// and its title holds it whole.
func TestLaneLabelsAndNotesAreCutToFitTheImageWithTheirWholeTextInATitle(t *testing.T) {
	run, steps := cancelledWaiter()
	long := "reserve-inventory-for-every-warehouse-in-the-region"
	steps = append(steps, kagzi.StepInfo{Key: long + "#1", Name: long, Kind: kagzi.KindStep, Status: kagzi.StepCompleted,
		CreatedAt: run.CreatedAt, UpdatedAt: run.CreatedAt.Add(time.Second)})
	run.Status, run.FinishedAt = kagzi.StatusSleeping, nil // its sleep's note: "wakes in 59m 53s"
	svg := string(timeline(run, steps, nil, "n/default/", run.CreatedAt.Add(time.Second)))
	// The widest a character of the timeline's 11 px fonts is, on average (DejaVu
	// Sans, Chromium's default on Debian, is wider than most); the browser test
	// measures the text as drawn.
	const maxCharW, width = 7.0, 960.0
	if !strings.Contains(svg, "<title>"+long+"#1</title>") {
		t.Errorf("the long step key has no title holding it whole:\n%s", svg)
	}
	for _, m := range regexp.MustCompile(`<text x="([0-9.]+)" y="[0-9.]+" text-anchor="(start|end)" class="(lane|note)">(?:<title>[^<]*</title>)?([^<]*)</text>`).
		FindAllStringSubmatch(svg, -1) {
		var x float64
		if _, err := fmt.Sscan(m[1], &x); err != nil {
			t.Fatal(err)
		}
		w := maxCharW * float64(len([]rune(m[4])))
		if (m[2] == "end" && x-w < 0) || (m[2] == "start" && x+w > width) {
			t.Errorf("%s %q at x=%.1f (%s), %.0f px wide at most, does not fit in %.0f px", m[3], m[4], x, m[2], w, width)
		}
	}
}
