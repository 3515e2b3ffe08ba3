package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/kagzi/kagzi"
)

// The JSON the tool prints: snake_case names, times in RFC 3339 (UTC), payloads as
// the JSON they are.

type errorJSON struct {
	Code         string            `json:"code"`
	Message      string            `json:"message"`
	NonRetryable bool              `json:"non_retryable,omitempty"`
	RetryAfter   string            `json:"retry_after,omitempty"`
	Subject      string            `json:"subject,omitempty"`
	Metadata     map[string]string `json:"metadata,omitempty"`
}

// runJSON is a run as the tool prints it: RunInfo's own JSON, times in UTC, and an
// error's retry_after as a duration.
type runJSON struct {
	kagzi.RunInfo
	Error *errorJSON `json:"error,omitempty"`
}

// attemptJSON is AttemptInfo's JSON with its duration.
type attemptJSON struct {
	kagzi.AttemptInfo
	Error      *errorJSON `json:"error,omitempty"`
	DurationMS float64    `json:"duration_ms"`
}

// stepJSON is StepInfo's JSON, its attempts as attemptJSON.
type stepJSON struct {
	kagzi.StepInfo
	Error    *errorJSON    `json:"error,omitempty"`
	Attempts []attemptJSON `json:"attempts"`
}

// workerJSON is WorkerInfo's JSON, its heartbeat interval as a duration.
type workerJSON struct {
	kagzi.WorkerInfo
	HeartbeatInterval string `json:"heartbeat_interval"`
}

func utc(t time.Time) time.Time { return t.UTC() }

func utcp(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func errorOf(d *kagzi.ErrorDetail) *errorJSON {
	if d == nil {
		return nil
	}
	e := &errorJSON{Code: d.Code, Message: d.Message, NonRetryable: d.NonRetryable, Subject: d.Subject, Metadata: d.Metadata}
	if d.RetryAfter > 0 {
		e.RetryAfter = d.RetryAfter.String()
	}
	return e
}

func runOf(r *kagzi.RunInfo) runJSON {
	c := *r
	c.AvailableAt, c.CreatedAt, c.UpdatedAt = utc(c.AvailableAt), utc(c.CreatedAt), utc(c.UpdatedAt)
	c.ScheduleTick, c.StartedAt, c.FinishedAt = utcp(c.ScheduleTick), utcp(c.StartedAt), utcp(c.FinishedAt)
	c.Deadline = utcp(c.Deadline)
	c.Hold = holdOf(c.Hold)
	return runJSON{RunInfo: c, Error: errorOf(r.Error)}
}

// holdOf is a copy of a run's hold with its time in UTC.
func holdOf(h *kagzi.Hold) *kagzi.Hold {
	if h == nil {
		return nil
	}
	c := *h
	c.Until = utcp(c.Until)
	return &c
}

// limitsOf is a type's limits as the tool prints them: their own JSON, times in UTC.
func limitsOf(l *kagzi.Limits) kagzi.Limits {
	c := *l
	c.UpdatedAt = utc(c.UpdatedAt)
	return c
}

func stepOf(s *kagzi.StepInfo) stepJSON {
	c := *s
	c.WakeAt, c.CreatedAt, c.UpdatedAt = utcp(c.WakeAt), utc(c.CreatedAt), utc(c.UpdatedAt)
	out := stepJSON{StepInfo: c, Error: errorOf(s.Error), Attempts: []attemptJSON{}}
	for _, a := range s.Attempts {
		a.StartedAt, a.FinishedAt = utc(a.StartedAt), utc(a.FinishedAt)
		out.Attempts = append(out.Attempts, attemptJSON{AttemptInfo: a, Error: errorOf(a.Error),
			DurationMS: float64(a.FinishedAt.Sub(a.StartedAt).Microseconds()) / 1000})
	}
	return out
}

func workerOf(w *kagzi.WorkerInfo) workerJSON {
	c := *w
	c.StartedAt, c.LastHeartbeatAt, c.StoppedAt = utc(c.StartedAt), utc(c.LastHeartbeatAt), utcp(c.StoppedAt)
	return workerJSON{WorkerInfo: c, HeartbeatInterval: w.HeartbeatInterval.String()}
}

// scheduleOf is a schedule as the tool prints it: ScheduleInfo's own JSON, times in UTC.
func scheduleOf(s *kagzi.ScheduleInfo) kagzi.ScheduleInfo {
	c := *s
	c.NextFireAt, c.LastFiredAt, c.BufferedTick = utcp(c.NextFireAt), utcp(c.LastFiredAt), utcp(c.BufferedTick)
	c.CreatedAt, c.UpdatedAt = utc(c.CreatedAt), utc(c.UpdatedAt)
	return c
}

func (a *app) printJSON(v any) error {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table writes aligned columns.
type table struct{ w *tabwriter.Writer }

func newTable(out io.Writer, header ...string) *table {
	t := &table{w: tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)}
	if len(header) > 0 { // a table of facts, one per line, has none
		t.row(header...)
	}
	return t
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		cells[i] = printable(c)
	}
	fmt.Fprintln(t.w, strings.Join(cells, "\t"))
}

// printable makes a cell one line of text that cannot drive the terminal: tabs,
// newlines and carriage returns become spaces, and the other control characters
// (an error message's escape sequences) are shown as Go escapes (\x1b).
func printable(s string) string {
	if !strings.ContainsFunc(s, unicode.IsControl) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\t' || r == '\n' || r == '\r':
			b.WriteByte(' ')
		case unicode.IsControl(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func (t *table) flush() { _ = t.w.Flush() }

const timeLayout = "2006-01-02 15:04:05Z"

// when formats a time for tables, in UTC; "-" for none.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(timeLayout)
}

func whenp(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return when(*t)
}

// whenMilli is when with milliseconds, for step timelines.
func whenMilli(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// short cuts a value for a table cell to n characters (runes, as the table counts
// them), never inside a character.
func short(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	i := 0
	for range n - 1 {
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
	}
	return s[:i] + "…"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// detail formats an error detail on one line.
func detail(d *kagzi.ErrorDetail) string {
	if d == nil {
		return ""
	}
	s := d.Code + ": " + d.Message
	if d.NonRetryable {
		s += " (non-retryable)"
	}
	if d.RetryAfter > 0 {
		s += " (retry after " + d.RetryAfter.String() + ")"
	}
	return s
}

func labels(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}

// duration formats an attempt's duration compactly.
func duration(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return d.Round(100 * time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}
