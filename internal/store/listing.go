package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi/internal/vocab"
)

// listColumns is runColumns for ListRuns: qualified by the alias q ("r." or ""), and
// without reading the input and the output (NULL in their place) unless payloads.
func listColumns(q string, payloads bool) string {
	cols := strings.Split(runColumns, ",")
	for i, c := range cols {
		c = strings.TrimSpace(c)
		if !payloads && (c == "input" || c == "output") {
			cols[i] = "NULL::jsonb"
			continue
		}
		cols[i] = q + c
	}
	return strings.Join(cols, ", ")
}

// ListRunsParams filters ListRuns. Zero fields do not filter.
type ListRunsParams struct {
	Namespace string
	Statuses  []vocab.RunStatus
	// WorkflowTypes keeps the runs of any of these types.
	WorkflowTypes    []string
	WorkflowID       string
	WorkflowIDPrefix string
	ScheduleID       string
	ParentRunID      *uuid.UUID
	// RootOnly keeps the runs that are no run's child.
	RootOnly bool
	Version  *string
	// ErrorCode keeps the FAILED runs whose error has this code.
	ErrorCode string
	// Attributes keeps the runs whose attributes contain this JSON object.
	Attributes    []byte
	CreatedAfter  *time.Time
	CreatedBefore *time.Time
	// After is the keyset cursor: the (created_at, run_id) of the last row of the
	// previous page.
	AfterCreated *time.Time
	AfterRunID   uuid.UUID
	// Ascending lists the oldest runs first; the default is newest first.
	Ascending bool
	// Payloads reads the runs' input and output; without it they are nil.
	Payloads bool
	Limit    int
}

// ListRuns lists runs newest (or oldest) first, one page at a time. A filter with an
// index of its own (workflow id, schedule, parent, attributes) reads that index;
// otherwise the page is read in order from kagzi.runs_created, each entry joined to
// its run.
//
// A page in ListRuns' order, newest first, is first read among the runs created in
// the day before its start (now, or the page token's time) only: those are in the
// live tables and in the history partitions of that day and after (a run finishes
// after it is created), so the statement is planned over those partitions alone, not
// over every day of the retention. When that does not fill the page, the page is read
// again without the bound.
func ListRuns(ctx context.Context, db DBTX, p ListRunsParams) ([]Run, error) {
	if bound, ok := recentBound(p); ok {
		runs, err := listRuns(ctx, db, p, &bound)
		if err != nil || len(runs) == p.Limit {
			return runs, err
		}
	}
	return listRuns(ctx, db, p, nil)
}

// recentBound is the bound of a page's first read (see ListRuns), ok false when
// the page is not read that way: not in ListRuns' order, oldest first, or already
// bounded by CreatedAfter (which bounds the partitions itself).
func recentBound(p ListRunsParams) (time.Time, bool) {
	byOrder := p.WorkflowID == "" && p.ScheduleID == "" && p.ParentRunID == nil && p.Attributes == nil
	if !byOrder || p.Ascending || p.CreatedAfter != nil || p.Limit <= 0 {
		return time.Time{}, false
	}
	from := time.Now()
	if p.AfterCreated != nil {
		from = *p.AfterCreated
	}
	if p.CreatedBefore != nil && p.CreatedBefore.Before(from) {
		from = *p.CreatedBefore
	}
	return from.Add(-24 * time.Hour), true
}

func listRuns(ctx context.Context, db DBTX, p ListRunsParams, bound *time.Time) ([]Run, error) {
	setup, sql, args := listRunsQuery(p, bound)
	var rows pgx.Rows
	var err error
	if setup != "" {
		rows, err = queryAfter(ctx, db, setup, sql, args...)
	} else {
		rows, err = db.Query(ctx, sql, args...)
	}
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Run, error) { return scanRun(row) })
}

// orderedPlansSQL is sent before a page read in order from an index (see queryAfter):
// kagzi.runs_created, or runs_by_schedule or runs_by_parent. The plan must walk it in
// the page's order (looking each run up by its key, for runs_created), stopping when
// the page is full. Filters that no index orders
// (statuses, types, a prefix, an error code) would otherwise let the planner, when
// its statistics say they select few runs, scan one of runs' partial indexes (or the
// table) whole and sort the matches: that is quick while the statistics are right,
// and reads every finished run of the namespace when they are not. Walking in order
// costs what the runs skipped cost: nothing when the filter matches most runs, and a
// read of the namespace's runs when it matches few (CreatedAfter and CreatedBefore
// bound it). TestAPageOfRunsIsReadInOrderFromAnIndexWithoutSortingOrScanningRuns
// checks the plans.
const orderedPlansSQL = `SELECT set_config('enable_sort', 'off', true), set_config('enable_seqscan', 'off', true),
	set_config('enable_bitmapscan', 'off', true), set_config('enable_hashjoin', 'off', true),
	set_config('enable_mergejoin', 'off', true)`

// listRunsQuery is ListRuns' statement and arguments, and the settings to send before
// it (see queryAfter; "" for none). A bound (in ListRuns' order only) keeps the runs
// created at or after it, and names the partitions that can hold them (see ListRuns).
func listRunsQuery(p ListRunsParams, bound *time.Time) (setup, sql string, args []any) {
	byOrder := p.WorkflowID == "" && p.ScheduleID == "" && p.ParentRunID == nil && p.Attributes == nil
	r, o := "", "" // the qualifiers of runs' columns and of the order's
	if byOrder {
		r, o = "r.", "c."
	}
	q := listQuery{args: []any{p.Namespace}, where: r + "namespace = $1"}
	if byOrder {
		q.where += " AND c.namespace = $1"
	}
	if len(p.Statuses) > 0 {
		statuses := make([]string, len(p.Statuses))
		for i, s := range p.Statuses {
			statuses[i] = string(s)
		}
		q.add(r+"status = ANY(%s)", statuses)
	}
	if len(p.WorkflowTypes) == 1 {
		q.add(r+"workflow_type = %s", p.WorkflowTypes[0])
		if byOrder { // the page in order from runs_created_by_type
			q.where += " AND c.workflow_type = $" + strconv.Itoa(len(q.args))
		}
	} else if len(p.WorkflowTypes) > 1 {
		q.add(r+"workflow_type = ANY(%s)", p.WorkflowTypes)
	}
	if p.WorkflowID != "" {
		// The status condition is always true, but it lets the planner read a workflow
		// id's runs from its two partial indexes (active, finished) instead of
		// scanning the namespace.
		q.add("workflow_id = %s AND (status IN ('PENDING', 'RUNNING', 'SLEEPING') OR status IN ('COMPLETED', 'FAILED', 'CANCELLED'))", p.WorkflowID)
	}
	q.filters(p, r, o)
	dir, cmp := "DESC", "<"
	if p.Ascending {
		dir, cmp = "ASC", ">"
	}
	if p.AfterCreated != nil {
		q.args = append(q.args, *p.AfterCreated, p.AfterRunID)
		n := len(q.args)
		q.where += " AND (" + o + "created_at, " + o + "run_id) " + cmp + " ($" + strconv.Itoa(n-1) + ", $" + strconv.Itoa(n) + ")"
	}
	from := "kagzi.runs_all"
	if byOrder {
		from = listedRunsSQL("")
		if bound != nil {
			q.args = append(q.args, *bound)
			b := "$" + strconv.Itoa(len(q.args))
			from = listedRunsSQL(b)
			q.where += " AND c.created_at >= " + b + " AND (c.run_finished_at IS NULL OR c.run_finished_at >= " + b + ")"
		}
	}
	q.args = append(q.args, p.Limit)
	if p.WorkflowID == "" && p.Attributes == nil { // runs_created, runs_by_schedule, runs_by_parent
		setup = orderedPlansSQL
	}
	return setup, `SELECT ` + listColumns(r, p.Payloads) + ` FROM ` + from + ` WHERE ` + q.where +
		` ORDER BY ` + o + `created_at ` + dir + `, ` + o + `run_id ` + dir + ` LIMIT $` + strconv.Itoa(len(q.args)), q.args
}

// listedRunsSQL is the entries of ListRuns' order (runs_created_all c), each joined
// to its run (r): in the live table, or in the one partition of the history its entry
// names (run_finished_at), a lookup each either way. With bound (a placeholder), only
// the history's partitions from the bound on are named.
func listedRunsSQL(bound string) string {
	h := ""
	if bound != "" {
		h = " AND h.finished_at >= " + bound
	}
	return `kagzi.runs_created_all c CROSS JOIN LATERAL (
		SELECT * FROM kagzi.runs l WHERE c.run_finished_at IS NULL AND l.run_id = c.run_id
		UNION ALL
		SELECT * FROM kagzi.runs_history h
		WHERE c.run_finished_at IS NOT NULL AND h.run_id = c.run_id AND h.finished_at = c.run_finished_at` + h + `
	) r`
}

// filters adds ListRuns' filters that no index orders: r qualifies runs' columns, o
// the order's.
func (q *listQuery) filters(p ListRunsParams, r, o string) {
	if p.WorkflowIDPrefix != "" {
		q.add("starts_with("+r+"workflow_id, %s)", p.WorkflowIDPrefix)
	}
	if p.ScheduleID != "" {
		q.add("schedule_id = %s", p.ScheduleID)
	}
	if p.ParentRunID != nil {
		q.add("parent_run_id = %s", *p.ParentRunID)
	}
	if p.RootOnly {
		q.where += " AND " + r + "parent_run_id IS NULL"
	}
	if p.Version != nil {
		q.add(r+"version = %s", *p.Version)
	}
	if p.ErrorCode != "" {
		q.add(r+"status = 'FAILED' AND "+r+"error->>'code' = %s", p.ErrorCode)
	}
	if p.Attributes != nil {
		q.add("attributes @> %s::jsonb", p.Attributes)
	}
	if p.CreatedAfter != nil {
		q.add(o+"created_at >= %s", *p.CreatedAfter)
	}
	if p.CreatedBefore != nil {
		q.add(o+"created_at < %s", *p.CreatedBefore)
	}
}

// listQuery builds a WHERE clause with positional arguments.
type listQuery struct {
	args  []any
	where string
}

// add appends " AND cond" to the clause, cond's %s being the position of v.
func (q *listQuery) add(cond string, v any) {
	q.args = append(q.args, v)
	q.where += " AND " + fmt.Sprintf(cond, "$"+strconv.Itoa(len(q.args)))
}
