package ui

import (
	"fmt"
	"html/template"
	"net/url"
	"strings"
	"time"

	"github.com/kagzi/kagzi"
)

// bar is one span of a run's timeline.
type bar struct {
	start, end time.Time
	class      string
	title      string
	href       string // a link (a child run), relative to the page's base
}

// lane is one row of the timeline: the run, a step, or a child.
type lane struct {
	label string
	note  string // the duration, or what it waits for
	bars  []bar
}

// The timeline's geometry, in pixels: the image's width, the labels' column on the
// left and the height of a lane.
const (
	timelineWidth = 960.0
	labelW        = 190.0
	laneH         = 22.0
)

// The most characters of a lane's label and note the timeline shows (a longer one is
// cut, with its whole text in a title), and the width a character takes at most, on
// average, in the timeline's 11 px fonts (DejaVu Sans, Chromium's default on Debian,
// takes 7 px a digit): the labels' column holds maxLabelChars of it and the notes'
// column is sized with it, so that no text is cut off at the image's edge.
const (
	maxLabelChars = 24
	maxNoteChars  = 24
	charW         = 7.5
)

// timelineErrChars is the most of an attempt's error its bar's title (a tooltip)
// holds: the step table has the whole message.
const timelineErrChars = 300

// timeline draws a run's lanes as SVG bars on one time axis, from the run's
// creation to its end (or now). A finished run's timeline is the same whenever it
// is drawn: its waits end with it (see stepLane).
func timeline(run *kagzi.RunInfo, steps []kagzi.StepInfo, children []kagzi.RunInfo, base string, now time.Time) template.HTML {
	lanes := runLanes(run, steps, children, base, now)
	t0, t1 := run.CreatedAt, now
	if run.FinishedAt != nil {
		t1 = *run.FinishedAt
	}
	longestNote := 0
	for _, l := range lanes {
		for _, b := range l.bars {
			if b.end.After(t1) {
				t1 = b.end
			}
			if b.start.Before(t0) {
				t0 = b.start
			}
		}
		longestNote = max(longestNote, len([]rune(clip(l.note, maxNoteChars))))
	}
	span := max(t1.Sub(t0), time.Millisecond)
	const w, top = timelineWidth, 24.0
	noteW := 16 + charW*float64(max(longestNote, 6))
	plotW := w - labelW - noteW
	h := top + laneH*float64(len(lanes)) + 8
	s := newSVG(w, h, "timeline", "timeline of the run's steps, attempts, sleeps, signal waits and children")
	x := func(t time.Time) float64 { return labelW + plotW*float64(t.Sub(t0))/float64(span) }
	for i := 0; i <= 4; i++ {
		xi := labelW + plotW*float64(i)/4
		s.line(xi, top-6, xi, h-4, "grid")
		s.text(xi, 12, "middle", "axis", "+"+dur(span*time.Duration(i)/4))
	}
	for i, l := range lanes {
		y := top + laneH*float64(i)
		s.textTitled(labelW-8, y+15, "end", "lane", clip(l.label, maxLabelChars), l.label)
		for _, b := range l.bars {
			draw := func() { s.rect(x(b.start), y+4, x(b.end)-x(b.start), laneH-8, "bar "+b.class, b.title) }
			if b.href != "" {
				s.link(b.href, draw)
			} else {
				draw()
			}
		}
		s.textTitled(w-noteW+8, y+15, "start", "note", clip(l.note, maxNoteChars), l.note)
	}
	return s.html()
}

// clip cuts s to n characters at most, the last of them "…" when it was cut.
func clip(s string, n int) string {
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

// runLanes are the lanes of a run: the run itself, then its steps in the order
// they were recorded, each child under the step that started it.
func runLanes(run *kagzi.RunInfo, steps []kagzi.StepInfo, children []kagzi.RunInfo, base string, now time.Time) []lane {
	end, open := now, true
	if run.FinishedAt != nil {
		end, open = *run.FinishedAt, false
	}
	runLane := lane{label: "run " + strings.ToLower(string(run.Status)), note: dur(end.Sub(run.CreatedAt)),
		bars: []bar{{start: run.CreatedAt, end: end, class: "run " + strings.ToLower(string(run.Status)),
			title: fmt.Sprintf("run %s: %s, %s", run.Status, ts(run.CreatedAt), spanText(run.CreatedAt, end, open))}}}
	lanes := []lane{runLane}
	byStep := map[string][]kagzi.RunInfo{}
	for _, ch := range children {
		byStep[ch.ParentStepKey] = append(byStep[ch.ParentStepKey], ch)
	}
	for _, st := range steps {
		lanes = append(lanes, stepLane(st, run, now))
		for _, ch := range byStep[st.Key] {
			lanes = append(lanes, childLane(ch, base, now))
		}
		delete(byStep, st.Key)
	}
	for _, rest := range byStep { // children whose start step is not recorded (yet)
		for _, ch := range rest {
			lanes = append(lanes, childLane(ch, base, now))
		}
	}
	return lanes
}

func spanText(a, b time.Time, open bool) string {
	if open {
		return dur(b.Sub(a)) + " so far"
	}
	return dur(b.Sub(a))
}

// stepLane draws a step by kind: every attempt of a step, a sleep until its wake
// time, a signal wait until it was received (or timed out), a mark for the others.
// A sleep or signal wait of a finished run that was still open when the run ended
// (cancelled, failed past its deadline) ends there, and its note says so.
func stepLane(st kagzi.StepInfo, run *kagzi.RunInfo, now time.Time) lane {
	l := lane{label: st.Key}
	switch st.Kind {
	case kagzi.KindSleep:
		wake := now
		if st.WakeAt != nil {
			wake = *st.WakeAt
		}
		b := bar{start: st.CreatedAt, end: minTime(wake, now), class: "sleep",
			title: fmt.Sprintf("sleep %s until %s", st.Key, ts(wake))}
		l.note = dur(wake.Sub(st.CreatedAt))
		switch {
		case run.FinishedAt != nil && wake.After(*run.FinishedAt):
			b.end = maxTime(st.CreatedAt, *run.FinishedAt)
			b.title += endedWith(run, b)
			l.note = endedNote
		case wake.After(now):
			l.note = "wakes in " + dur(wake.Sub(now))
		}
		l.bars = []bar{b}
	case kagzi.KindSignal:
		b := bar{start: st.CreatedAt, end: st.UpdatedAt, class: "signal " + strings.ToLower(string(st.Status))}
		switch {
		case st.Status == kagzi.StepWaiting && run.FinishedAt != nil:
			b.end = maxTime(st.CreatedAt, *run.FinishedAt)
			b.title = fmt.Sprintf("signal wait %s: not received", st.Name) + endedWith(run, b)
			l.note = endedNote
		case st.Status == kagzi.StepWaiting:
			b.end = now
			b.title = fmt.Sprintf("signal wait %s: %s, %s", st.Name, st.Status, spanText(b.start, b.end, true))
			l.note = "waiting"
		default:
			b.title = fmt.Sprintf("signal wait %s: %s, %s", st.Name, st.Status, spanText(b.start, b.end, false))
			l.note = spanText(b.start, b.end, false)
		}
		l.bars = []bar{b}
	case kagzi.KindStep:
		l.bars, l.note = attemptBars(st)
	default: // child starts and results, events, patches: a mark
		l.bars = []bar{{start: st.CreatedAt, end: st.CreatedAt.Add(time.Microsecond), class: "mark",
			title: fmt.Sprintf("%s %s at %s", strings.ToLower(string(st.Kind)), st.Key, ts(st.CreatedAt))}}
		l.note = strings.ToLower(string(st.Kind))
	}
	return l
}

// endedNote is the note of a wait that was still open when its run ended.
const endedNote = "ended with the run"

// endedWith says, in a wait's title, that its run ended during it, and when.
func endedWith(run *kagzi.RunInfo, b bar) string {
	return fmt.Sprintf(": the run ended %s at %s, %s into the wait", run.Status, ts(b.end), dur(b.end.Sub(b.start)))
}

func attemptBars(st kagzi.StepInfo) ([]bar, string) {
	if len(st.Attempts) == 0 {
		return []bar{{start: st.CreatedAt, end: st.UpdatedAt, class: "step " + strings.ToLower(string(st.Status)),
			title: fmt.Sprintf("step %s: %s", st.Key, st.Status)}}, string(st.Status)
	}
	var bars []bar
	var total time.Duration
	for _, a := range st.Attempts {
		title := fmt.Sprintf("%s attempt %d: %s, %s", st.Key, a.Number, a.Status, dur(a.FinishedAt.Sub(a.StartedAt)))
		if a.Error != nil {
			title += " — " + clip(a.Error.String(), timelineErrChars)
		}
		bars = append(bars, bar{start: a.StartedAt, end: a.FinishedAt, class: "attempt " + strings.ToLower(string(a.Status)), title: title})
		total += a.FinishedAt.Sub(a.StartedAt)
	}
	note := dur(total)
	if len(st.Attempts) > 1 {
		note += fmt.Sprintf(" ×%d", len(st.Attempts))
	}
	return bars, note
}

func childLane(ch kagzi.RunInfo, base string, now time.Time) lane {
	end, open := now, true
	if ch.FinishedAt != nil {
		end, open = *ch.FinishedAt, false
	}
	return lane{label: "↳ child " + ch.WorkflowType, note: spanText(ch.CreatedAt, end, open),
		bars: []bar{{start: ch.CreatedAt, end: end, class: "child " + strings.ToLower(string(ch.Status)),
			href:  base + "runs/" + url.PathEscape(ch.RunID),
			title: fmt.Sprintf("child run %s (%s): %s, %s", ch.RunID, ch.WorkflowType, ch.Status, spanText(ch.CreatedAt, end, open))}}}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
