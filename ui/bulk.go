package ui

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/clientdb"
	"github.com/kagzi/kagzi/internal/store"
)

// bulkCountCap is the most matches the bulk confirmation counts before it says "at
// least": counting reads the matches a page of 1000 at a time.
const bulkCountCap = 2000

// countedAtField is the bulk confirmation's form field that carries when it counted
// the matches (RFC 3339, to the microsecond, UTC): the action covers the runs the
// filter matches that were created up to then, so that runs started while the
// operator read the count are not cancelled or rerun with the runs counted.
const countedAtField = "counted_at"

func (d *bulkData) refused() bool { return d.Error != "" }

type bulkData struct {
	Action    string // "cancel" or "rerun"
	Filter    runFilter
	Matches   capped
	CountedAt time.Time // when the matches were counted: the action's cutoff
	Error     string
}

// CountedAtValue is CountedAt as the form carries it.
func (d *bulkData) CountedAtValue() string { return d.CountedAt.Format(time.RFC3339Nano) }

// createdUpTo narrows a filter to the runs created at or before t (runs' creation
// times are microseconds): its own CreatedBefore stays when it is earlier.
func createdUpTo(f kagzi.RunFilter, t time.Time) kagzi.RunFilter {
	bound := t.Truncate(time.Microsecond).Add(time.Microsecond) // CreatedBefore is exclusive
	if f.CreatedBefore.IsZero() || f.CreatedBefore.After(bound) {
		f.CreatedBefore = bound
	}
	return f
}

// bulkConfirm shows how many runs a filter matches, created up to now, and asks to
// confirm a bulk cancel or rerun of all of them: its form carries the time it
// counted them (countedAtField).
func (c *console) bulkConfirm(q *req) (string, any, error) {
	action := q.r.FormValue("action")
	a := Action("bulk-" + action)
	if a != ActionBulkCancel && a != ActionBulkRerun {
		return "", nil, badRequest("unknown bulk action %q", action)
	}
	if !c.can(q, a) {
		return "", nil, fmt.Errorf("%w: %v", errForbidden, errNoActions)
	}
	f, err := parseRunFilter(q.r)
	if err != nil {
		return "", nil, err
	}
	d := &bulkData{Action: action, Filter: f, CountedAt: time.Now().UTC().Truncate(time.Microsecond)}
	if d.Matches, err = countMatches(q, createdUpTo(f.RunFilter, d.CountedAt), bulkCountCap); err != nil {
		if !isBadInput(err) {
			return "", nil, err
		}
		d.Error = err.Error()
	}
	return "Confirm bulk " + action, d, nil
}

// countMatches counts the runs a filter matches, up to limit (then AtLeast), on the
// primary, where the action will change them: a read pool that lags counted fewer
// than the action then changed.
func countMatches(q *req, f kagzi.RunFilter, limit int) (capped, error) {
	f.PageSize, f.PageToken = min(limit, 1000), ""
	var n int64
	for {
		res, err := clientdb.ListRunsPrimary(q.r.Context(), q.client, f)
		if err != nil {
			return capped{}, err
		}
		page := res.(*kagzi.RunPage)
		n += int64(len(page.Runs))
		switch {
		case page.NextPageToken == "":
			return capped{N: n}, nil
		case n >= int64(limit):
			return capped{N: n, AtLeast: true}, nil
		}
		f.PageToken = page.NextPageToken
	}
}

type bulkDoneData struct {
	Action    string
	Filter    runFilter  // the recorded filter (empty when it no longer reads)
	Described string     // the recorded filter in words
	CountedAt *time.Time // the recorded cutoff: when the confirmation counted the matches
	Result    kagzi.BulkResult
	Error     string
}

// bulkAction cancels or reruns every run the posted filter matches among those
// created up to when the confirmation counted them (countedAtField), records it, and
// sends the browser to what it did (bulkDone, read from the audit log): a reload or
// the back button shows the result again and does not post the action again.
func (c *console) bulkAction(q *req, a Action) (string, error) {
	f, err := parseRunFilter(q.r)
	if err != nil {
		return "", err
	}
	// A filter the listing refuses (a parent that is not a run id, a type too long)
	// is the request's fault: refused before anything is done or audited.
	if err := f.RunFilter.Err(); err != nil {
		return "", err
	}
	// Without the confirmation's time the action would match the runs started since
	// the count as well: it was not posted by the confirmation's button.
	countedAt, err := time.Parse(time.RFC3339Nano, q.r.PostFormValue(countedAtField))
	if err != nil {
		return "", badRequest("a bulk %s needs the time its confirmation counted the runs (%s): confirm it on its page",
			strings.TrimPrefix(string(a), "bulk-"), countedAtField)
	}
	// A time to come (a page of another console process whose clock runs ahead, or one
	// made up) covers no run that does not exist now.
	countedAt = minTime(countedAt, time.Now())
	matching := createdUpTo(f.RunFilter, countedAt)
	var res kagzi.BulkResult
	detail := map[string]any{"filter": f.Values, "confirmed_count": q.r.PostFormValue("count"),
		countedAtField: countedAt.UTC().Format(time.RFC3339Nano)}
	err = c.audited(q, a, f.Describe(), nil, detail, func() ([]string, int64, map[string]any, error) {
		var err error
		if a == ActionBulkCancel {
			res, err = q.client.CancelRuns(q.r.Context(), matching)
		} else {
			res, err = q.client.RerunRuns(q.r.Context(), matching)
		}
		ids := res.ChangedRunIDs
		if ids == nil {
			ids = []string{}
		}
		return ids, int64(res.Changed), map[string]any{"matched": res.Matched, "changed": res.Changed,
			"skipped": res.Skipped}, err
	})
	if q.auditID == 0 { // not even recorded: nothing was done
		return "", err
	}
	return q.base() + "bulk/done?audit=" + strconv.FormatInt(q.auditID, 10), nil
}

// bulkDone shows what a bulk action did, from its record in the audit log (the
// audit query parameter): its counts, the filter it was given and its cutoff, all as
// recorded. A filter in the page's address is ignored: the record says what was done.
func (c *console) bulkDone(q *req) (string, any, error) {
	id, err := strconv.ParseInt(q.r.FormValue("audit"), 10, 64)
	if err != nil || id <= 0 {
		return "", nil, badRequest("bulk result: the audit entry %q is not an id", q.r.FormValue("audit"))
	}
	// From the primary (q.pool), where the action was just recorded: a replica serving
	// the other pages (Config.ReadPool) may not have it yet.
	entries, err := store.ListAudit(q.r.Context(), q.pool, q.ns, nil, id+1, 1)
	if err != nil {
		return "", nil, err
	}
	if len(entries) == 0 || entries[0].ID != id || !strings.HasPrefix(entries[0].Action, "bulk-") {
		return "", nil, fmt.Errorf("%w: no bulk action %d in the audit log of namespace %q", kagzi.ErrNotFound, id, q.ns)
	}
	e := entries[0]
	d := &bulkDoneData{Action: strings.TrimPrefix(e.Action, "bulk-")}
	var detail struct {
		Filter    url.Values                   `json:"filter"`
		CountedAt *time.Time                   `json:"counted_at"`
		Matched   int                          `json:"matched"`
		Changed   int                          `json:"changed"`
		Skipped   map[kagzi.BulkSkipReason]int `json:"skipped"`
	}
	if err := json.Unmarshal(e.Detail, &detail); err != nil {
		return "", nil, err
	}
	// The filter as bulkAction recorded it (it was read by filterOf then). Should it
	// no longer read (a field renamed since), the record's target is the filter in
	// the words of its day.
	if d.Filter, err = filterOf(detail.Filter); err != nil || detail.Filter == nil {
		d.Filter, d.Described = runFilter{}, e.Target
	} else {
		d.Described = d.Filter.Describe()
	}
	d.CountedAt = detail.CountedAt
	d.Result = kagzi.BulkResult{Matched: detail.Matched, Changed: detail.Changed, Skipped: detail.Skipped}
	switch {
	case e.Outcome == nil:
		d.Error = "still running (reload for its result)"
	case *e.Outcome != "ok":
		d.Error = *e.Outcome
	}
	return "Bulk " + d.Action, d, nil
}
