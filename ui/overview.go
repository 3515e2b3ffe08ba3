package ui

import (
	"context"
	"html/template"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi/internal/store"
)

// The overview's bounds: what it reads costs the same whatever the number of runs.
const (
	// overviewTypes is the most workflow types the overview lists.
	overviewTypes = 200
	// perTypeScan is the most unfinished runs it reads of each type, claimable ones
	// first: counts past it show as "≥".
	perTypeScan = 5000
	// throughputScan is the most starts, and the most ends, of the last hour it reads,
	// newest first.
	throughputScan = 20000
	// stuckListed is the most stuck runs it lists.
	stuckListed = 20
	// chartMinutes is the span of the chart.
	chartMinutes = 60
)

// typeRow is one workflow type on the overview.
type typeRow struct {
	Type                              string
	Ready, Delayed, Running, Sleeping capped
	LeaseExpired, TakenOver           capped
	OldestReady                       string
	Completed, Failed, Cancelled      capped
	NoWorker                          bool
}

type overviewData struct {
	Types       []typeRow
	TypesCapped bool
	Chart       template.HTML
	ChartNote   string
	Since       time.Time
	QueueDepth  capped
	OldestReady string
	NoWorker    []string // the types with runs ready and no live worker, as Health says
	Stuck       []store.StuckRun
	Started     capped
	Finished    map[string]capped // by status, last hour
	PerTypeScan int
}

func (c *console) overview(q *req) (string, any, error) {
	ctx := q.r.Context()
	var types []string
	var acts []store.TypeActivity
	var stuck []store.StuckRun
	var noWorker []string
	var tp []store.MinuteCount
	end := time.Now().Truncate(time.Minute).Add(time.Minute)
	since := end.Add(-chartMinutes * time.Minute)
	err := readWithoutJIT(ctx, q.read, func(db store.DBTX) (err error) {
		if types, err = store.ConsoleTypes(ctx, db, q.ns, overviewTypes); err != nil {
			return err
		}
		if acts, err = store.ActivityByType(ctx, db, q.ns, types, perTypeScan); err != nil {
			return err
		}
		if stuck, err = store.StuckRuns(ctx, db, q.ns, types, perTypeScan, stuckListed); err != nil {
			return err
		}
		// The types Health reports: runs ready (due, or past their lease) and no live
		// worker of their type, or of the version a run is pinned to.
		if noWorker, err = store.PendingTypesWithoutWorker(ctx, db, q.ns); err != nil {
			return err
		}
		tp, err = store.Throughput(ctx, db, q.ns, since, throughputScan)
		return err
	})
	if err != nil {
		return "", nil, err
	}
	d := &overviewData{TypesCapped: len(types) == overviewTypes, Stuck: stuck, Since: since,
		Finished: map[string]capped{}, PerTypeScan: perTypeScan, NoWorker: noWorker}
	rows := map[string]*typeRow{}
	row := func(t string) *typeRow {
		if rows[t] == nil {
			rows[t] = &typeRow{Type: t}
		}
		return rows[t]
	}
	var oldest *time.Time
	for _, a := range acts {
		r := row(a.WorkflowType)
		full := a.Scanned >= perTypeScan
		allReady := full && a.Ready == a.Scanned
		r.Ready, r.LeaseExpired = capped{a.Ready, allReady}, capped{a.LeaseExpired, allReady}
		r.Delayed, r.Running, r.Sleeping = capped{a.Delayed, full}, capped{a.Running, full}, capped{a.Sleeping, full}
		r.TakenOver = capped{a.TakenOver, full}
		if a.OldestReady != nil {
			r.OldestReady = dur(time.Since(*a.OldestReady))
			if oldest == nil || a.OldestReady.Before(*oldest) {
				oldest = a.OldestReady
			}
		}
		r.NoWorker = slices.Contains(noWorker, a.WorkflowType)
		d.QueueDepth.N += a.Ready
		d.QueueDepth.AtLeast = d.QueueDepth.AtLeast || allReady
	}
	if oldest != nil {
		d.OldestReady = dur(time.Since(*oldest))
	}
	d.Chart, d.ChartNote = c.throughput(tp, end, row, d)
	for _, t := range types {
		row(t)
	}
	for _, r := range rows {
		endsCut := d.Finished["COMPLETED"].AtLeast || d.Finished["FAILED"].AtLeast || d.Finished["CANCELLED"].AtLeast
		r.Completed.AtLeast, r.Failed.AtLeast, r.Cancelled.AtLeast = endsCut, endsCut, endsCut
		d.Types = append(d.Types, *r)
	}
	slices.SortFunc(d.Types, func(a, b typeRow) int { return strings.Compare(a.Type, b.Type) })
	return "Overview", d, nil
}

// throughput fills the last hour's counts by type and draws the chart.
func (c *console) throughput(tp []store.MinuteCount, end time.Time, row func(string) *typeRow, d *overviewData) (template.HTML, string) {
	index := func(t time.Time) int { return chartMinutes - 1 - int(end.Sub(t.Add(time.Minute))/time.Minute) }
	all := map[string]*series{
		"STARTED":   {Name: "started", Class: "started", Counts: make([]int64, chartMinutes)},
		"COMPLETED": {Name: "completed", Class: "completed", Counts: make([]int64, chartMinutes)},
		"FAILED":    {Name: "failed", Class: "failed", Counts: make([]int64, chartMinutes)},
		"CANCELLED": {Name: "cancelled", Class: "cancelled", Counts: make([]int64, chartMinutes)},
	}
	var started, finished int64
	for _, m := range tp {
		if i := index(m.Minute); i >= 0 && i < chartMinutes {
			all[m.Status].Counts[i] += m.Count
		}
		if m.Status == "STARTED" {
			started += m.Count
			continue
		}
		finished += m.Count
		r := row(m.WorkflowType)
		switch m.Status {
		case "COMPLETED":
			r.Completed.N += m.Count
		case "FAILED":
			r.Failed.N += m.Count
		case "CANCELLED":
			r.Cancelled.N += m.Count
		}
		f := d.Finished[m.Status]
		f.N += m.Count
		d.Finished[m.Status] = f
	}
	endsCut := finished >= throughputScan
	d.Started = capped{started, started >= throughputScan}
	for k, f := range d.Finished {
		f.AtLeast = endsCut
		d.Finished[k] = f
	}
	note := ""
	if d.Started.AtLeast || endsCut {
		note = "More than " + num(throughputScan) + " runs started or ended this hour: the chart and the hour's counts cover the newest " +
			num(throughputScan) + " of each, and show as ≥."
	}
	return minuteChart(end, chartMinutes, []series{*all["STARTED"], *all["COMPLETED"], *all["FAILED"], *all["CANCELLED"]}), note
}

// readWithoutJIT runs the overview's reads in one read-only transaction whose
// statements PostgreSQL does not JIT-compile: their plans' costs, estimated over a
// large history, pass jit_above_cost, and compiling them took 190 of the overview's
// 225 ms at a million runs (BenchmarkConsolePages/overview) for reads of a few ms.
func readWithoutJIT(ctx context.Context, db *pgxpool.Pool, fn func(store.DBTX) error) error {
	return pgx.BeginTxFunc(ctx, db, pgx.TxOptions{BeginQuery: "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY; SET LOCAL jit = off"},
		func(tx pgx.Tx) error { return fn(tx) })
}
