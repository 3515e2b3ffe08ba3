package ui

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/kagzi/kagzi"
)

// funcs are the templates' helpers. There is no query-escaping helper: html/template
// escapes a value inserted in a URL's query itself, so a helper's escapes were
// escaped again ("billing/charge" became billing%252Fcharge); a query string built
// in Go goes through qs.
var funcs = template.FuncMap{
	"ts":    ts,
	"tsms":  tsMilli,
	"tsp":   func(t *time.Time) string { return tsPtr(t) },
	"ago":   ago,
	"agop":  func(t *time.Time) string { return agoPtr(t) },
	"dur":   dur,
	"short": short,
	"path":  url.PathEscape,
	// linkable: a name may be a path segment of a link (see dotSegment).
	"linkable": func(name string) bool { return !dotSegment(name) },
	"lower":    strings.ToLower,
	"join":     strings.Join,
	"count":    count,
	"num":      num,
	"sizeOf":   func(b []byte) string { return size(len(b)) },
	"jsonStr":  func(v any) string { b, _ := json.Marshal(v); return string(b) },
	"took":     took,
	// errCell and errBox: an error message's excerpt, in a table's cell and in a
	// run's error box (see excerpt, and the errcell and errfull templates).
	"errCell": func(s string) excerpt { return cut(s, cellErrChars, cellErrLines) },
	"errBox":  func(s string) excerpt { return cut(s, boxErrChars, boxErrLines) },
	"qs":      qs,
	"deref": func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	},
	"dict": func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	},
}

// qs joins query strings (already encoded: url.Values.Encode) into "?a=1&b=2", ""
// when all are empty. It returns a template.URL: html/template would escape the
// "=" and "&" of a query string inserted in an href.
func qs(parts ...string) template.URL {
	var keep []string
	for _, p := range parts {
		if p != "" {
			keep = append(keep, p)
		}
	}
	if len(keep) == 0 {
		return ""
	}
	return template.URL("?" + strings.Join(keep, "&")) //nolint:gosec // encoded query strings only
}

// took is how long a finished run took from its start to its end.
func took(r kagzi.RunInfo) string {
	if r.FinishedAt == nil {
		return ""
	}
	return dur(r.FinishedAt.Sub(r.CreatedAt))
}

// ts formats a time in UTC to the second.
func ts(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// tsMilli formats a time in UTC to the millisecond: a bulk action's cutoff, between
// runs created within one second.
func tsMilli(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000Z") }

func tsPtr(t *time.Time) string {
	if t == nil {
		return "—"
	}
	return ts(*t)
}

// ago says how long ago (or, for a future time, in how long) t is.
func ago(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	d := time.Since(t)
	if d < 0 {
		return "in " + dur(-d)
	}
	return dur(d) + " ago"
}

func agoPtr(t *time.Time) string {
	if t == nil {
		return "—"
	}
	return ago(*t)
}

// dur formats a duration with two significant units at most: "850ms", "4.2s",
// "3m 12s", "5h 02m", "3d 4h".
func dur(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm %02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh %02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd %dh", int(d.Hours())/24, int(d.Hours())%24)
}

// short is the last 12 characters of a run id: UUIDv7s of one period share their
// beginning.
func short(id string) string {
	if len(id) > 12 {
		return "…" + id[len(id)-12:]
	}
	return id
}

// num formats an integer with thousands separators.
func num(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// capped is a count read from a bounded range: AtLeast when the range was cut.
type capped struct {
	N       int64
	AtLeast bool
}

// count formats a capped count: "1,204" or "≥ 5,000".
func count(c capped) string {
	if c.AtLeast {
		return "≥ " + num(c.N)
	}
	return num(c.N)
}

func size(n int) string {
	switch {
	case n < 1024:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/1024)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// maxShownPayload is the most of a payload a page shows.
const maxShownPayload = 64 << 10

// payload is a payload as a page shows it: indented JSON, cut at maxShownPayload, or
// only its size when payloads are hidden.
type payload struct {
	Text   string
	Size   string
	Hidden bool
	Empty  bool
}

func (c *console) payload(b []byte) payload {
	if len(b) == 0 || string(b) == "null" {
		return payload{Empty: true}
	}
	p := payload{Size: size(len(b)), Hidden: c.opts.HidePayloads}
	if p.Hidden {
		return p
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		out.Reset()
		out.Write(b)
	}
	p.Text = out.String()
	if len(p.Text) > maxShownPayload {
		p.Text = p.Text[:maxShownPayload] + "\n… (cut: " + p.Size + " in all)"
	}
	return p
}

// The most of an error message a page shows at first: in a table's cell (the runs
// list, a step's attempts and error) and in a run's error box. Messages are not
// bounded (an application's error may carry a response body or a whole stack); a
// longer one shows its beginning, with the whole message one click away.
const (
	cellErrChars, cellErrLines = 240, 3
	boxErrChars, boxErrLines   = 1000, 12
)

// excerpt is a long text as a page shows it: its beginning (Short), and, when that is
// not all of it (Cut), the whole text and its size.
type excerpt struct {
	Short, Full, Size string
	Cut               bool
}

// cut is the excerpt of s made of its first chars characters and lines lines at most.
func cut(s string, chars, lines int) excerpt {
	e := excerpt{Short: s, Full: s}
	n, nl := 0, 0
	for i, r := range s {
		if n == chars || (r == '\n' && nl+1 == lines) {
			e.Short, e.Cut, e.Size = strings.TrimRight(s[:i], " \t\r\n")+" …", true, size(len(s))
			break
		}
		n++
		if r == '\n' {
			nl++
		}
	}
	return e
}
