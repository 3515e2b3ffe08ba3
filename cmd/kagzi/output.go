package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

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

type runJSON struct {
	RunID           string          `json:"run_id"`
	WorkflowID      string          `json:"workflow_id"`
	Namespace       string          `json:"namespace"`
	WorkflowType    string          `json:"workflow_type"`
	Status          string          `json:"status"`
	Input           json.RawMessage `json:"input,omitempty"`
	Output          json.RawMessage `json:"output,omitempty"`
	Error           *errorJSON      `json:"error,omitempty"`
	Attempt         int             `json:"attempt"`
	Takeovers       int             `json:"takeovers"`
	WorkerID        string          `json:"worker_id,omitempty"`
	CancelRequested bool            `json:"cancel_requested,omitempty"`
	ScheduleID      string          `json:"schedule_id,omitempty"`
	ScheduleTick    *time.Time      `json:"schedule_tick,omitempty"`
	AvailableAt     time.Time       `json:"available_at"`
	CreatedAt       time.Time       `json:"created_at"`
	StartedAt       *time.Time      `json:"started_at,omitempty"`
	FinishedAt      *time.Time      `json:"finished_at,omitempty"`
	UpdatedAt       time.Time       `json:"updated_at"`
}

type attemptJSON struct {
	Number     int        `json:"number"`
	Status     string     `json:"status"`
	Error      *errorJSON `json:"error,omitempty"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt time.Time  `json:"finished_at"`
	DurationMS float64    `json:"duration_ms"`
}

type stepJSON struct {
	Key       string          `json:"key"`
	Name      string          `json:"name"`
	Kind      string          `json:"kind"`
	Status    string          `json:"status"`
	Output    json.RawMessage `json:"output,omitempty"`
	Error     *errorJSON      `json:"error,omitempty"`
	WakeAt    *time.Time      `json:"wake_at,omitempty"`
	Attempts  []attemptJSON   `json:"attempts"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
}

type workerJSON struct {
	WorkerID          string            `json:"worker_id"`
	Namespace         string            `json:"namespace"`
	Status            string            `json:"status"`
	Hostname          string            `json:"hostname"`
	PID               int               `json:"pid"`
	Version           string            `json:"version"`
	WorkflowTypes     []string          `json:"workflow_types"`
	MaxConcurrent     int               `json:"max_concurrent"`
	ActiveRuns        int               `json:"active_runs"`
	CompletedTotal    int64             `json:"completed_total"`
	FailedTotal       int64             `json:"failed_total"`
	HeartbeatInterval string            `json:"heartbeat_interval"`
	Labels            map[string]string `json:"labels,omitempty"`
	StartedAt         time.Time         `json:"started_at"`
	LastHeartbeatAt   time.Time         `json:"last_heartbeat_at"`
	StoppedAt         *time.Time        `json:"stopped_at,omitempty"`
}

type scheduleJSON struct {
	ScheduleID     string          `json:"schedule_id"`
	Namespace      string          `json:"namespace"`
	WorkflowType   string          `json:"workflow_type"`
	Cron           string          `json:"cron"`
	CronSeconds    bool            `json:"cron_seconds,omitempty"`
	TimeZone       string          `json:"time_zone"`
	Input          json.RawMessage `json:"input,omitempty"`
	Paused         bool            `json:"paused"`
	MaxCatchup     int             `json:"max_catchup"`
	Overlap        string          `json:"overlap"`
	NextFireAt     *time.Time      `json:"next_fire_at,omitempty"`
	LastFiredAt    *time.Time      `json:"last_fired_at,omitempty"`
	LastRunID      string          `json:"last_run_id,omitempty"`
	BufferedTick   *time.Time      `json:"buffered_tick,omitempty"`
	CatchupSkipped int64           `json:"catchup_skipped"`
	OverlapSkipped int64           `json:"overlap_skipped"`
	CreatedAt      time.Time       `json:"created_at"`
	UpdatedAt      time.Time       `json:"updated_at"`
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
	return runJSON{RunID: r.RunID, WorkflowID: r.WorkflowID, Namespace: r.Namespace, WorkflowType: r.WorkflowType,
		Status: string(r.Status), Input: r.Input, Output: r.Output, Error: errorOf(r.Error), Attempt: r.Attempt, Takeovers: r.Takeovers,
		WorkerID: r.LockedBy, CancelRequested: r.CancelRequested, ScheduleID: r.ScheduleID,
		ScheduleTick: utcp(r.ScheduleTick), AvailableAt: utc(r.AvailableAt), CreatedAt: utc(r.CreatedAt),
		StartedAt: utcp(r.StartedAt), FinishedAt: utcp(r.FinishedAt), UpdatedAt: utc(r.UpdatedAt)}
}

func stepOf(s *kagzi.StepInfo) stepJSON {
	out := stepJSON{Key: s.Key, Name: s.Name, Kind: string(s.Kind), Status: string(s.Status), Output: s.Output,
		Error: errorOf(s.Error), WakeAt: utcp(s.WakeAt), Attempts: []attemptJSON{}, CreatedAt: utc(s.CreatedAt),
		UpdatedAt: utc(s.UpdatedAt)}
	for _, a := range s.Attempts {
		out.Attempts = append(out.Attempts, attemptJSON{Number: a.Number, Status: string(a.Status),
			Error: errorOf(a.Error), StartedAt: utc(a.StartedAt), FinishedAt: utc(a.FinishedAt),
			DurationMS: float64(a.FinishedAt.Sub(a.StartedAt).Microseconds()) / 1000})
	}
	return out
}

func workerOf(w *kagzi.WorkerInfo) workerJSON {
	return workerJSON{WorkerID: w.ID, Namespace: w.Namespace, Status: string(w.Status), Hostname: w.Hostname,
		PID: w.PID, Version: w.Version, WorkflowTypes: w.WorkflowTypes, MaxConcurrent: w.MaxConcurrent,
		ActiveRuns: w.ActiveRuns, CompletedTotal: w.CompletedTotal, FailedTotal: w.FailedTotal,
		HeartbeatInterval: w.HeartbeatInterval.String(), Labels: w.Labels, StartedAt: utc(w.StartedAt),
		LastHeartbeatAt: utc(w.LastHeartbeatAt), StoppedAt: utcp(w.StoppedAt)}
}

func scheduleOf(s *kagzi.ScheduleInfo) scheduleJSON {
	return scheduleJSON{ScheduleID: s.ID, Namespace: s.Namespace, WorkflowType: s.WorkflowType, Cron: s.Cron,
		CronSeconds: s.Seconds, TimeZone: s.TimeZone, Input: s.Input, Paused: s.Paused, MaxCatchup: s.MaxCatchup,
		Overlap: s.Overlap.String(), NextFireAt: utcp(s.NextFireAt), LastFiredAt: utcp(s.LastFiredAt),
		LastRunID: s.LastRunID, BufferedTick: utcp(s.BufferedTick), CatchupSkipped: s.CatchupSkipped,
		OverlapSkipped: s.OverlapSkipped, CreatedAt: utc(s.CreatedAt), UpdatedAt: utc(s.UpdatedAt)}
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
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		cells[i] = strings.NewReplacer("\t", " ", "\n", " ").Replace(c)
	}
	fmt.Fprintln(t.w, strings.Join(cells, "\t"))
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

// short cuts a value for a table cell.
func short(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
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
