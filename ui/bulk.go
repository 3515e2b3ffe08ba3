package ui

import (
	"fmt"
	"net/http"

	"github.com/kagzi/kagzi"
)

// bulkCountCap is the most matches the bulk confirmation counts before it says "at
// least": counting reads the matches a page of 1000 at a time.
const bulkCountCap = 2000

type bulkData struct {
	Action  string // "cancel" or "rerun"
	Filter  runFilter
	Matches capped
	Error   string
}

// bulkConfirm shows how many runs a filter matches and asks to confirm a bulk
// cancel or rerun of all of them.
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
	d := &bulkData{Action: action, Filter: f}
	if d.Matches, err = countMatches(q, f.RunFilter, bulkCountCap); err != nil {
		if !isBadInput(err) {
			return "", nil, err
		}
		d.Error = err.Error()
	}
	return "Confirm bulk " + action, d, nil
}

// countMatches counts the runs a filter matches, up to limit (then AtLeast).
func countMatches(q *req, f kagzi.RunFilter, limit int) (capped, error) {
	f.PageSize, f.PageToken = min(limit, 1000), ""
	var n int64
	for {
		page, err := q.client.ListRuns(q.r.Context(), f)
		if err != nil {
			return capped{}, err
		}
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
	Action string
	Filter runFilter
	Result kagzi.BulkResult
	Error  string
}

// bulkAction cancels or reruns every run the posted filter matches, records it, and
// shows what it did.
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
	var res kagzi.BulkResult
	detail := map[string]any{"filter": f.Values, "confirmed_count": q.r.PostFormValue("count")}
	err = c.audited(q, a, f.Describe(), nil, detail, func() ([]string, int64, map[string]any, error) {
		var err error
		if a == ActionBulkCancel {
			res, err = q.client.CancelRuns(q.r.Context(), f.RunFilter)
		} else {
			res, err = q.client.RerunRuns(q.r.Context(), f.RunFilter)
		}
		ids := res.ChangedRunIDs
		if ids == nil {
			ids = []string{}
		}
		return ids, int64(res.Changed), map[string]any{"matched": res.Matched, "changed": res.Changed,
			"skipped": res.Skipped}, err
	})
	d := &bulkDoneData{Action: string(a)[len("bulk-"):], Filter: f, Result: res}
	if err != nil {
		d.Error = err.Error()
	}
	c.render(q, http.StatusOK, "bulkdone", "Bulk "+d.Action, d)
	return "", nil
}
