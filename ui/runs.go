package ui

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/kagzi/kagzi"
)

// filterField is one field of the runs filter: its form input and how it sets a
// kagzi.RunFilter. The form, the query string, the bulk confirmation and its hidden
// fields are all built from runFilterFields, so a filter RunFilter gains (a workflow
// id prefix, an error code, attributes) is one entry here.
type filterField struct {
	Name  string // query parameter
	Label string
	Kind  string // "text", "statuses" (checkboxes), "time" (datetime-local, UTC)
	Hint  string
	// Multi: the field takes several values (a run matches any of them), as
	// RunFilter does for statuses and workflow types. A field without it refuses a
	// repeated value rather than apply one and describe them all.
	Multi bool
	set   func(f *kagzi.RunFilter, values []string) error
}

var runStatuses = []kagzi.RunStatus{kagzi.StatusPending, kagzi.StatusRunning, kagzi.StatusSleeping,
	kagzi.StatusCompleted, kagzi.StatusFailed, kagzi.StatusCancelled}

var runFilterFields = []filterField{
	{Name: "status", Label: "Status", Kind: "statuses", Multi: true, set: func(f *kagzi.RunFilter, v []string) error {
		for _, s := range v {
			if !slices.Contains(runStatuses, kagzi.RunStatus(s)) {
				return fmt.Errorf("%w: unknown status %q", kagzi.ErrInvalidArgument, s)
			}
			f.Statuses = append(f.Statuses, kagzi.RunStatus(s))
		}
		return nil
	}},
	{Name: "type", Label: "Workflow type", Kind: "text", Multi: true, set: func(f *kagzi.RunFilter, v []string) error {
		f.WorkflowTypes = v
		return nil
	}},
	{Name: "workflow_id", Label: "Workflow id", Kind: "text", Hint: "exact", set: func(f *kagzi.RunFilter, v []string) error {
		f.WorkflowID = v[0]
		return nil
	}},
	{Name: "workflow_id_prefix", Label: "Workflow id prefix", Kind: "text", set: func(f *kagzi.RunFilter, v []string) error {
		f.WorkflowIDPrefix = v[0]
		return nil
	}},
	{Name: "error_code", Label: "Error code", Kind: "text", Hint: "failed runs", set: func(f *kagzi.RunFilter, v []string) error {
		f.ErrorCode = v[0]
		return nil
	}},
	{Name: "attributes", Label: "Attributes", Kind: "text", Hint: `JSON, e.g. {"customer":"c-7"}`, set: func(f *kagzi.RunFilter, v []string) error {
		// Numbers as written: a 19-digit id would not survive a float64.
		d := json.NewDecoder(strings.NewReader(v[0]))
		d.UseNumber()
		if err := d.Decode(&f.Attributes); err != nil || f.Attributes == nil || d.More() {
			return fmt.Errorf("%w: attributes %q are not a JSON object", kagzi.ErrInvalidArgument, v[0])
		}
		return nil
	}},
	{Name: "schedule", Label: "Schedule", Kind: "text", set: func(f *kagzi.RunFilter, v []string) error {
		f.ScheduleID = v[0]
		return nil
	}},
	{Name: "parent", Label: "Parent run", Kind: "text", Hint: "run id", set: func(f *kagzi.RunFilter, v []string) error {
		f.ParentRunID = v[0]
		return nil
	}},
	{Name: "created_after", Label: "Created after", Kind: "time", Hint: "UTC", set: func(f *kagzi.RunFilter, v []string) error {
		t, err := parseFormTime(v[0])
		f.CreatedAfter = t
		return err
	}},
	{Name: "created_before", Label: "Created before", Kind: "time", Hint: "UTC", set: func(f *kagzi.RunFilter, v []string) error {
		t, err := parseFormTime(v[0])
		f.CreatedBefore = t
		return err
	}},
}

// parseFormTime reads a datetime-local value (or RFC 3339) as UTC.
func parseFormTime(s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%w: %q is not a time (want 2006-01-02T15:04, UTC)", kagzi.ErrInvalidArgument, s)
}

// localInput is a time of the filter as a datetime-local input shows it, in UTC
// (the form's hint), with the input's step: a value in RFC 3339 ("…Z", "…+02:00") is
// not one the input takes, so the form showed it empty and submitting it dropped it.
// A value that is no time is left as it is (the page says why it is refused).
func localInput(v string) (value, step string) {
	t, err := parseFormTime(v)
	switch {
	case v == "" || err != nil:
		return v, "1"
	case t.Nanosecond() >= int(time.Millisecond):
		// The input holds milliseconds at most.
		return t.UTC().Format("2006-01-02T15:04:05.000"), "0.001"
	}
	return t.UTC().Format("2006-01-02T15:04:05"), "1"
}

// runFilter is a filter as the request gives it: the RunFilter, and the values of
// its fields for the form and the links.
type runFilter struct {
	kagzi.RunFilter
	Values url.Values // only the filter's fields
	Empty  bool
}

// parseRunFilter reads the filter fields of a request's form.
func parseRunFilter(r *http.Request) (runFilter, error) {
	_ = r.ParseForm()
	return filterOf(r.Form)
}

// filterOf reads the filter fields of a form (or of a filter an audit record holds).
func filterOf(form url.Values) (runFilter, error) {
	f := runFilter{Values: url.Values{}, Empty: true}
	for _, fld := range runFilterFields {
		var vals []string
		for _, v := range form[fld.Name] {
			if v = strings.TrimSpace(v); v != "" {
				vals = append(vals, v)
			}
		}
		if len(vals) == 0 {
			continue
		}
		if len(vals) > 1 && !fld.Multi {
			return f, fmt.Errorf("%w: filter %s takes one value, not %d (%s)", kagzi.ErrInvalidArgument,
				fld.Name, len(vals), strings.Join(vals, ", "))
		}
		if err := fld.set(&f.RunFilter, vals); err != nil {
			return f, err
		}
		f.Values[fld.Name] = vals
		f.Empty = false
	}
	return f, nil
}

// Describe says in words what the filter selects, for the bulk pages and the audit.
func (f runFilter) Describe() string {
	if f.Empty {
		return "every run"
	}
	var parts []string
	for _, fld := range runFilterFields {
		if v := f.Values[fld.Name]; len(v) > 0 {
			parts = append(parts, strings.ToLower(fld.Label)+" "+strings.Join(v, " or "))
		}
	}
	return "runs with " + strings.Join(parts, ", ")
}

// formField is a filter field with its current values, for the form.
type formField struct {
	filterField
	Value    string   // the first value ("" when none), for a time field: in its input's format
	Step     string   // a time field's step: "1" (seconds), "0.001" for a value with milliseconds
	Values   []string // every value, at least one (""): a text field has an input for each
	Checked  map[string]bool
	Statuses []kagzi.RunStatus
}

func (f runFilter) Form() []formField {
	out := make([]formField, 0, len(runFilterFields))
	for _, fld := range runFilterFields {
		ff := formField{filterField: fld, Value: f.Values.Get(fld.Name), Values: f.Values[fld.Name],
			Checked: map[string]bool{}}
		if len(ff.Values) == 0 {
			ff.Values = []string{""}
		}
		if fld.Kind == "time" {
			ff.Value, ff.Step = localInput(ff.Value)
		}
		if fld.Kind == "statuses" {
			ff.Statuses = runStatuses
			for _, v := range f.Values[fld.Name] {
				ff.Checked[v] = true
			}
		}
		out = append(out, ff)
	}
	return out
}

// Query is the filter as a query string.
func (f runFilter) Query() string { return f.Values.Encode() }

// Hidden lists the filter's values as name/value pairs, for a form's hidden fields.
func (f runFilter) Hidden() [][2]string {
	var out [][2]string
	for _, fld := range runFilterFields {
		for _, v := range f.Values[fld.Name] {
			out = append(out, [2]string{fld.Name, v})
		}
	}
	return out
}

func (d *runsData) refused() bool { return d.Error != "" }

type runsData struct {
	Filter     runFilter
	Runs       []kagzi.RunInfo
	Next       string // the query of the next page; "" on the last
	First      bool
	BulkCancel bool
	BulkRerun  bool
	Error      string
}

// runsPageSize is how many runs a page of the runs list holds.
const runsPageSize = 50

func (c *console) runs(q *req) (string, any, error) {
	d := &runsData{BulkCancel: c.can(q, ActionBulkCancel), BulkRerun: c.can(q, ActionBulkRerun)}
	f, err := parseRunFilter(q.r)
	d.Filter = f
	if err != nil {
		d.Error = err.Error()
		return "Runs", d, nil
	}
	f.PageSize, f.PageToken = runsPageSize, q.r.FormValue("page")
	d.First = f.PageToken == ""
	page, err := q.client.ListRuns(q.r.Context(), f.RunFilter)
	if err != nil {
		if isBadInput(err) {
			d.Error = err.Error()
			return "Runs", d, nil
		}
		return "", nil, err
	}
	d.Runs = page.Runs
	if page.NextPageToken != "" {
		v := url.Values{}
		for k, vals := range f.Values {
			v[k] = vals
		}
		v.Set("page", page.NextPageToken)
		d.Next = v.Encode()
	}
	return "Runs", d, nil
}
