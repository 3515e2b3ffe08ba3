package ui

import (
	"fmt"
	"html"
	"html/template"
	"strings"
	"time"
)

// svg builds an SVG image as markup. Every text and attribute value it is given is
// escaped; styles come from classes (the console's stylesheet), never from style
// attributes, which its Content-Security-Policy forbids.
type svg struct {
	b strings.Builder
}

func newSVG(w, h float64, class, label string) *svg {
	s := &svg{}
	fmt.Fprintf(&s.b, `<svg xmlns="http://www.w3.org/2000/svg" class="%s" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" role="img" aria-label="%s">`,
		html.EscapeString(class), w, h, w, h, html.EscapeString(label))
	return s
}

func (s *svg) rect(x, y, w, h float64, class, title string) {
	if w < 1 {
		w = 1
	}
	fmt.Fprintf(&s.b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" class="%s">`, x, y, w, h, html.EscapeString(class))
	if title != "" {
		fmt.Fprintf(&s.b, `<title>%s</title>`, html.EscapeString(title))
	}
	s.b.WriteString(`</rect>`)
}

func (s *svg) text(x, y float64, anchor, class, text string) {
	fmt.Fprintf(&s.b, `<text x="%.1f" y="%.1f" text-anchor="%s" class="%s">%s</text>`,
		x, y, anchor, html.EscapeString(class), html.EscapeString(text))
}

// textTitled is text with a title (a tooltip) when the title says more than it.
func (s *svg) textTitled(x, y float64, anchor, class, text, title string) {
	if title == text {
		s.text(x, y, anchor, class, text)
		return
	}
	fmt.Fprintf(&s.b, `<text x="%.1f" y="%.1f" text-anchor="%s" class="%s"><title>%s</title>%s</text>`,
		x, y, anchor, html.EscapeString(class), html.EscapeString(title), html.EscapeString(text))
}

func (s *svg) line(x1, y1, x2, y2 float64, class string) {
	fmt.Fprintf(&s.b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" class="%s"/>`, x1, y1, x2, y2, html.EscapeString(class))
}

func (s *svg) polyline(points []float64, class string) {
	var p strings.Builder
	for i := 0; i+1 < len(points); i += 2 {
		fmt.Fprintf(&p, "%.1f,%.1f ", points[i], points[i+1])
	}
	fmt.Fprintf(&s.b, `<polyline points="%s" class="%s"/>`, strings.TrimSpace(p.String()), html.EscapeString(class))
}

// link wraps what inner draws in a link to href (relative to the page's base).
func (s *svg) link(href string, inner func()) {
	fmt.Fprintf(&s.b, `<a href="%s">`, html.EscapeString(href))
	inner()
	s.b.WriteString(`</a>`)
}

func (s *svg) html() template.HTML {
	s.b.WriteString(`</svg>`)
	return template.HTML(s.b.String()) //nolint:gosec // built from escaped parts only
}

// series is one line of a per-minute chart.
type series struct {
	Name, Class string
	Counts      []int64 // one per minute, oldest first
}

// minuteChart draws series of per-minute counts ending at end (exclusive), a line
// each, with a y axis scaled to the largest count and a legend.
func minuteChart(end time.Time, minutes int, all []series) template.HTML {
	const w, h, left, right, top, bottom = 760.0, 220.0, 48.0, 12.0, 26.0, 28.0
	var peak int64 = 1
	for _, s := range all {
		for _, n := range s.Counts {
			peak = max(peak, n)
		}
	}
	peak = niceCeil(peak)
	s := newSVG(w, h, "chart", "runs started and finished per minute, last hour")
	plotW, plotH := w-left-right, h-top-bottom
	x := func(i int) float64 { return left + plotW*float64(i)/float64(max(minutes-1, 1)) }
	y := func(n int64) float64 { return top + plotH - plotH*float64(n)/float64(peak) }
	for _, frac := range []int64{0, 1, 2, 3, 4} {
		v := peak * frac / 4
		s.line(left, y(v), w-right, y(v), "grid")
		s.text(left-6, y(v)+4, "end", "axis", num(v))
	}
	for i := 0; i < minutes; i += 10 {
		t := end.Add(time.Duration(i-minutes) * time.Minute)
		s.text(x(i), h-8, "middle", "axis", t.UTC().Format("15:04"))
	}
	s.text(x(minutes-1), h-8, "middle", "axis", "now")
	for k, ser := range all {
		pts := make([]float64, 0, 2*len(ser.Counts))
		for i, n := range ser.Counts {
			pts = append(pts, x(i), y(n))
		}
		s.polyline(pts, "series "+ser.Class)
		for i, n := range ser.Counts {
			if n > 0 {
				t := end.Add(time.Duration(i-minutes) * time.Minute)
				s.rect(x(i)-2, y(n)-2, 4, 4, "dot "+ser.Class, fmt.Sprintf("%s %s: %s", t.UTC().Format("15:04"), ser.Name, num(n)))
			}
		}
		lx := left + 8 + float64(k)*130
		s.rect(lx, 8, 12, 4, "swatch "+ser.Class, "")
		s.text(lx+16, 14, "start", "legend", ser.Name)
	}
	return s.html()
}

// niceCeil rounds a positive count up to four times a step of 1, 2 or 5 times a
// power of ten, so that the chart's four grid lines fall on whole, round numbers.
func niceCeil(n int64) int64 {
	want := (n + 3) / 4
	for p := int64(1); ; p *= 10 {
		for _, m := range []int64{1, 2, 5} {
			if m*p >= want {
				return 4 * m * p
			}
		}
	}
}
