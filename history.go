package kagzi

import (
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/kagzi/kagzi/internal/store"
)

// history is what a run has recorded, as an execution replays it: the recorded steps
// by key, and by scope and position for the determinism check. It starts as what the
// claim loaded and grows with every step the execution records. Branches read and
// write it concurrently.
type history struct {
	mu sync.Mutex
	// steps holds pointers: a map's first entry allocates room for eight, and a
	// record is wide (a fresh run's first step cost a kilobyte).
	steps map[string]*store.StepRecord
	// at indexes the loaded steps by scope prefix + "@" + position, and maxPosition
	// holds the highest loaded position of each scope prefix.
	at          map[string]store.StepRecord
	maxPosition map[string]int
}

// newHistory takes over the steps a claim loaded.
func newHistory(steps map[string]store.StepRecord) *history {
	h := &history{steps: make(map[string]*store.StepRecord, len(steps))}
	if len(steps) == 0 {
		return h // a fresh run: at and maxPosition stay nil (read only)
	}
	h.at, h.maxPosition = map[string]store.StepRecord{}, map[string]int{}
	for key, rec := range steps {
		h.steps[key] = &rec
		if rec.Position == nil {
			continue
		}
		prefix := scopePrefixOf(key, rec.Name)
		h.at[prefix+"@"+strconv.Itoa(*rec.Position)] = rec
		h.maxPosition[prefix] = max(h.maxPosition[prefix], *rec.Position)
	}
	return h
}

// scopePrefixOf returns the scope prefix of a step key: the key without its
// "name#occurrence" part ("fetch#1/" for "fetch#1/get#2", "" at the top).
func scopePrefixOf(key, name string) string {
	base := key[:strings.LastIndexByte(key, '#')]
	return strings.TrimSuffix(base, name)
}

// get returns the recorded step of the key.
func (h *history) get(key string) (store.StepRecord, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if rec, ok := h.steps[key]; ok {
		return *rec, true
	}
	return store.StepRecord{}, false
}

// set records a step the execution has just written (or left to the run's end).
func (h *history) set(key string, rec store.StepRecord) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.steps[key] = &rec
}

// patched returns the answer the run already gave for the change changeID, at any
// of its Patched calls (false when any answered false: the run was in flight before
// the change), and whether it gave one.
func (h *history) patched(changeID string) (answer, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	answer = true
	for key, rec := range h.steps {
		if rec.Kind == KindPatch && rec.Name == changeID && key != aloneKey {
			ok = true
			answer = answer && string(rec.Output) == "true"
		}
	}
	return answer, ok
}

// fresh reports a run with no positioned history: nothing to check a call against.
func (h *history) fresh() bool { return len(h.at) == 0 }

// replaying reports whether the scope's loaded history goes past position pos: the
// code at pos runs under a history written before it, by older code perhaps (see
// Context.Patched).
func (h *history) replaying(prefix string, pos int) bool {
	return h.maxPosition[prefix] > pos
}

// check compares a call (name and kind, the key it got, at position pos of the scope
// prefix) with what the history holds at that position. It returns the detail of the
// failure when they differ (the code changed under the run), nil when they agree or
// the history holds nothing there.
func (h *history) check(prefix, key string, pos int, name string, kind StepKind, runID fmt.Stringer) *ErrorDetail {
	rec, ok := h.at[prefix+"@"+strconv.Itoa(pos)]
	if !ok || (rec.Name == name && rec.Kind == kind) {
		return nil
	}
	return &ErrorDetail{Code: CodeNonDeterministic, NonRetryable: true, Subject: key,
		Message: fmt.Sprintf("run %s is not deterministic: at position %d of scope %q its history has step %q (%s), "+
			"but the code now asks for %q (%s)", runID, pos, strings.TrimSuffix(prefix, "/"), rec.Name, rec.Kind, name, kind)}
}
