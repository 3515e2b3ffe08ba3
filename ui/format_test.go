package ui

import (
	"strings"
	"testing"
)

func TestAnExcerptIsTheMessagesFirstCharactersAndLinesWithTheWholeMessageWhenCut(t *testing.T) {
	for _, c := range []struct {
		name, in, short string
		cut             bool
	}{
		{"short", "boom", "boom", false},
		{"exactly at the bound", strings.Repeat("x", 10), strings.Repeat("x", 10), false},
		{"too many characters", strings.Repeat("x", 11), strings.Repeat("x", 10) + " …", true},
		{"too many lines", "a\nb\nc\nd", "a\nb\nc …", true},
		{"lines at the bound", "a\nb\nc", "a\nb\nc", false},
		{"characters, not bytes", strings.Repeat("é", 12), strings.Repeat("é", 10) + " …", true},
		{"cut before white space", "12345 789\n1234", "12345 789 …", true},
	} {
		e := cut(c.in, 10, 3)
		if e.Short != c.short || e.Cut != c.cut || e.Full != c.in || (e.Cut && e.Size == "") {
			t.Errorf("%s: cut(%q) = %+v, want %q, cut %v, with the whole message", c.name, c.in, e, c.short, c.cut)
		}
	}
}
