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
func ListRuns(ctx context.Context, db DBTX, p ListRunsParams) ([]Run, error) {
	setup, sql, args := listRunsQuery(p)
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
// it (see queryAfter; "" for none).
func listRunsQuery(p ListRunsParams) (setup, sql string, args []any) {
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
	q.args = append(q.args, p.Limit)
	from := "kagzi.runs_all"
	if byOrder {
		from = listedRunsSQL
	}
	if p.WorkflowID == "" && p.Attributes == nil { // runs_created, runs_by_schedule, runs_by_parent
		setup = orderedPlansSQL
	}
	return setup, `SELECT ` + listColumns(r, p.Payloads) + ` FROM ` + from + ` WHERE ` + q.where +
		` ORDER BY ` + o + `created_at ` + dir + `, ` + o + `run_id ` + dir + ` LIMIT $` + strconv.Itoa(len(q.args)), q.args
}

// listedRunsSQL is the entries of ListRuns' order (runs_created_all c), each joined
// to its run (r): in the live table, or in the one partition of the history its entry
// names (run_finished_at), a lookup each either way.
const listedRunsSQL = `kagzi.runs_created_all c CROSS JOIN LATERAL (
		SELECT * FROM kagzi.runs l WHERE c.run_finished_at IS NULL AND l.run_id = c.run_id
		UNION ALL
		SELECT * FROM kagzi.runs_history h
		WHERE c.run_finished_at IS NOT NULL AND h.run_id = c.run_id AND h.finished_at = c.run_finished_at
	) r`

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
