package kagzi

// Unit tests of the engine's pure parts: no database.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kagzi/kagzi/internal/store"
)

func baseStopped() stopped {
	return stopped{workflowType: "wf", attempt: 1, policy: Linear(3, time.Second), maxBytes: 100,
		maxTakeovers: 5, takeovers: 6}
}

func TestDecideEndsTheRunAsItsFunctionAndContextSay(t *testing.T) {
	nondet := &ErrorDetail{Code: CodeNonDeterministic, Message: "changed"}
	stepErr := &StepError{Key: "charge#1", Detail: ErrorDetail{Code: "card_declined", Message: "declined", Subject: "charge#1"}}
	cases := []struct {
		name   string
		change func(*stopped)
		want   ending
	}{
		{"completed", func(s *stopped) { s.res = result{returned: true, out: []byte(`1`)} },
			ending{kind: endFinish, status: StatusCompleted, output: []byte(`1`)}},
		{"output over the limit", func(s *stopped) { s.res = result{returned: true, out: make([]byte, 101)} },
			ending{kind: endFinish, status: StatusFailed, detail: &ErrorDetail{Code: CodeInvalidOutput, NonRetryable: true}}},
		{"suspended", func(s *stopped) { s.reason = exitSuspended }, ending{kind: endNothing, unwound: exitSuspended}},
		{"lease lost", func(s *stopped) { s.reason = exitLeaseLost }, ending{kind: endNothing, unwound: exitLeaseLost}},
		{"shutdown", func(s *stopped) { s.reason = exitShutdown }, ending{kind: endHandBack}},
		{"cancelled", func(s *stopped) { s.reason = exitCancelled }, ending{kind: endFinish, status: StatusCancelled}},
		{"returned an error because it was cancelled", func(s *stopped) {
			s.res, s.cause = result{returned: true, err: context.Canceled}, ErrCancelled
		}, ending{kind: endFinish, status: StatusCancelled}},
		{"returned an error because its lease was lost", func(s *stopped) {
			s.res, s.cause = result{returned: true, err: context.Canceled}, errLeaseLost
		}, ending{kind: endNothing, unwound: exitLeaseLost}},
		{"finished after its deadline", func(s *stopped) {
			s.res, s.cause = result{returned: true, out: []byte(`1`)}, errRunDeadline
		}, ending{kind: endFinish, status: StatusFailed, detail: &ErrorDetail{Code: CodeDeadlineExceeded, NonRetryable: true}}},
		{"deadline", func(s *stopped) { s.reason = exitDeadline },
			ending{kind: endFinish, status: StatusFailed, detail: &ErrorDetail{Code: CodeDeadlineExceeded, NonRetryable: true}}},
		{"taken over too often", func(s *stopped) { s.reason = exitRecoveryExhausted },
			ending{kind: endFinish, status: StatusFailed, detail: &ErrorDetail{Code: CodeRecoveryExhausted, NonRetryable: true}}},
		{"not deterministic", func(s *stopped) { s.reason, s.nondeterminism = exitNonDeterministic, nondet },
			ending{kind: endFinish, status: StatusFailed, detail: nondet}},
		{"failed, retried", func(s *stopped) { s.res = result{returned: true, err: errors.New("boom")} },
			ending{kind: endRetry, detail: &ErrorDetail{Code: CodeWorkflowError}, retryIn: time.Second}},
		{"failed, attempts exhausted", func(s *stopped) {
			s.res, s.attempt = result{returned: true, err: errors.New("boom")}, 3
		}, ending{kind: endFinish, status: StatusFailed, detail: &ErrorDetail{Code: CodeWorkflowError}}},
		{"failed non-retryably", func(s *stopped) { s.res = result{returned: true, err: NonRetryable(errors.New("no"))} },
			ending{kind: endFinish, status: StatusFailed, detail: &ErrorDetail{Code: CodeWorkflowError, NonRetryable: true}}},
		{"failed by a step: the step's detail, no workflow retry", func(s *stopped) {
			s.res = result{returned: true, err: fmt.Errorf("charging: %w", stepErr)}
		}, ending{kind: endFinish, status: StatusFailed, detail: &stepErr.Detail}},
		{"panicked", func(s *stopped) {
			s.res, s.policy = result{returned: true, err: &panicError{value: "oops", stack: "trace"}}, NoRetry()
		}, ending{kind: endFinish, status: StatusFailed, detail: &ErrorDetail{Code: CodePanic}}},
	}
	for _, c := range cases {
		s := baseStopped()
		c.change(&s)
		got := decide(s)
		if got.kind != c.want.kind || got.status != c.want.status || got.unwound != c.want.unwound ||
			string(got.output) != string(c.want.output) || got.retryIn != c.want.retryIn {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
			continue
		}
		if (got.detail == nil) != (c.want.detail == nil) {
			t.Errorf("%s: detail %+v, want %+v", c.name, got.detail, c.want.detail)
			continue
		}
		if d := got.detail; d != nil && (d.Code != c.want.detail.Code || d.NonRetryable != c.want.detail.NonRetryable ||
			(c.want.detail.Subject != "" && d.Subject != c.want.detail.Subject)) {
			t.Errorf("%s: detail %+v, want %+v", c.name, *d, *c.want.detail)
		}
	}
}

func TestDecideMarksACodeThePolicyListsNonRetryable(t *testing.T) {
	s := baseStopped()
	s.policy = Attempts(5).NonRetryable("fraud")
	s.res = result{returned: true, err: &Error{Code: "fraud", Message: "flagged"}}
	got := decide(s)
	if got.kind != endFinish || got.status != StatusFailed || got.detail.Code != "fraud" || !got.detail.NonRetryable {
		t.Fatalf("got %+v (%+v), want FAILED with fraud marked NonRetryable", got, got.detail)
	}
}

func TestStepKeysNumberOccurrencesByNameAndPositionsByCallInAScope(t *testing.T) {
	root := &scope{counts: map[string]int{}}
	branch := &scope{prefix: "fetch#1/", counts: map[string]int{}}
	var got []string
	for _, n := range []string{"send", "send", "wait", "send"} {
		key, pos := root.next(n)
		got = append(got, fmt.Sprint(key, "@", pos))
	}
	key, pos := branch.next("get")
	got = append(got, fmt.Sprint(key, "@", pos))
	want := "send#1@1 send#2@2 wait#1@3 send#3@4 fetch#1/get#1@1"
	if strings.Join(got, " ") != want {
		t.Fatalf("keys %v, want %s", got, want)
	}
	h := newHistory(map[string]store.StepRecord{})
	patch, replaying := root.nextPatch("new-order", h)
	if patch != "new-order#patch1" || replaying {
		t.Fatalf("patch key %q (replaying %t), want new-order#patch1 on a fresh history", patch, replaying)
	}
	if _, pos := root.next("after"); pos != 5 {
		t.Fatalf("a Patched took a position: the next call is at %d, want 5", pos)
	}
}

func TestHistoryFindsTheStepOfAScopesPositionAndFlagsAnotherCall(t *testing.T) {
	one, two := 1, 2
	h := newHistory(map[string]store.StepRecord{
		"charge#1":           {Name: "charge", Kind: KindStep, Position: &one},
		"fetch#1/get-user#1": {Name: "get-user", Kind: KindStep, Position: &one},
		"nap#1":              {Name: "nap", Kind: KindSleep, Position: &two},
	})
	id := uuid.New()
	if h.fresh() {
		t.Fatal("a history with positioned steps is not fresh")
	}
	if d := h.check("", "charge#1", 1, "charge", KindStep, id); d != nil {
		t.Fatalf("the same call at the same position was flagged: %+v", d)
	}
	if d := h.check("fetch#1/", "get-user#1", 1, "get-user", KindStep, id); d != nil {
		t.Fatalf("a branch's own step was flagged: %+v", d)
	}
	d := h.check("", "reserve#1", 1, "reserve", KindStep, id)
	if d == nil || d.Code != CodeNonDeterministic || !strings.Contains(d.Message, `history has step "charge"`) {
		t.Fatalf("another step at a recorded position: %+v, want NON_DETERMINISTIC naming both", d)
	}
	if d := h.check("", "nap#1", 2, "nap", KindStep, id); d == nil {
		t.Fatal("a step where the history has a sleep of the same name was not flagged")
	}
	if d := h.check("", "later#1", 3, "later", KindStep, id); d != nil {
		t.Fatalf("a call past the history was flagged: %+v", d)
	}
	if !h.replaying("", 1) || h.replaying("", 2) {
		t.Fatal("replaying: the root's history goes past position 1, not past 2")
	}
}

func TestErrorsAreClassifiedIntoTheDetailTheyRecord(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want ErrorDetail
	}{
		{"plain", errors.New("boom"), ErrorDetail{Code: CodeStepError, Message: "boom", Subject: "s#1"}},
		{"non-retryable", NonRetryable(errors.New("no")), ErrorDetail{Code: CodeStepError, Message: "no", Subject: "s#1", NonRetryable: true}},
		{"coded", fmt.Errorf("wrapped: %w", &Error{Code: "rate_limited", Message: "slow down", RetryAfter: time.Minute}),
			ErrorDetail{Code: "rate_limited", Message: "wrapped: slow down", Subject: "s#1", RetryAfter: time.Minute}},
		{"panic", &panicError{value: "oops", stack: "trace"},
			ErrorDetail{Code: CodePanic, Message: "panic: oops", Subject: "s#1", Metadata: map[string]string{"stack": "trace"}}},
		{"a step's error keeps its detail", &StepError{Key: "k#1", Detail: ErrorDetail{Code: "x", Message: "m", Subject: "k#1"}},
			ErrorDetail{Code: "x", Message: "m", Subject: "k#1"}},
	}
	for _, c := range cases {
		got := failureDetail(c.err, CodeStepError, "s#1")
		if fmt.Sprint(got) != fmt.Sprint(c.want) || got.NonRetryable != c.want.NonRetryable ||
			got.RetryAfter != c.want.RetryAfter || fmt.Sprint(got.Metadata) != fmt.Sprint(c.want.Metadata) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	if d := stepDetail(errors.New("late"), true, "s#1"); d.Code != CodeDeadlineExceeded {
		t.Errorf("a timed-out attempt: code %s, want DEADLINE_EXCEEDED", d.Code)
	}
	for cause, want := range map[error]exitReason{errLeaseLost: exitLeaseLost, errShutdown: exitShutdown,
		errRunDeadline: exitDeadline, errRecoveryExhausted: exitRecoveryExhausted, ErrCancelled: exitCancelled} {
		if got := reasonFor(cause); got != want {
			t.Errorf("reasonFor(%v) = %d, want %d", cause, got, want)
		}
	}
}

// A fenced write is tried again only for a failure that passes: a lost connection,
// the attempt's own timeout, a serialization failure. An answer of the database (a
// step already recorded, a row not found) or a value it refuses is final: retried,
// a write that found its step recorded by its own first try (whose answer the
// connection lost) was retried for as long as the heartbeats kept the lease.
func TestOnlyFailuresThatPassAreTriedAgain(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{io.ErrUnexpectedEOF, true},
		{fmt.Errorf("write: %w", io.EOF), true},
		{&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, true},
		{context.DeadlineExceeded, true},
		{fmt.Errorf("batch: %w", context.Canceled), true},
		{&pgconn.PgError{Code: "40001"}, true},
		{&pgconn.PgError{Code: "40P01"}, true},
		{&pgconn.PgError{Code: "57P01"}, true},
		{&pgconn.PgError{Code: "53300"}, true},
		{store.ErrStepRecorded, false},
		{fmt.Errorf("record: %w", store.ErrStepRecorded), false},
		{store.ErrNotFound, false},
		{store.ErrActiveRunExists, false},
		{&pgconn.PgError{Code: "23505"}, false},
		{&pgconn.PgError{Code: "22P02"}, false},
		{errors.New("json: unsupported value"), false},
	} {
		if got := transient(c.err); got != c.want {
			t.Errorf("transient(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func testClaimLoop() *claimLoop {
	w := &Worker{cfg: WorkerConfig{PollInterval: time.Hour, LeaseDuration: 10 * time.Second}}
	return &claimLoop{w: w, timer: time.NewTimer(time.Hour)}
}

func TestAFireTheClaimLoopHasNotTakenIsNotPushedBackByALaterTime(t *testing.T) {
	l := testClaimLoop()
	l.setTimer(time.Now().Add(-time.Millisecond)) // due: the timer fires at once
	time.Sleep(20 * time.Millisecond)             // ...and the loop, busy, has not taken it
	l.setTimer(time.Now().Add(time.Hour))         // a later time announced meanwhile
	select {
	case <-l.timer.C:
	case <-time.After(5 * time.Second):
		t.Fatal("the due fire was discarded for a time an hour away")
	}
}

func TestATimeTheTimerLetGoBeforeTheAnswerMakesTheNextClaimAskAgain(t *testing.T) {
	l := testClaimLoop()
	now := time.Now()
	l.askedAt, l.answer = now, now.Add(5*time.Second)
	l.setTimer(l.answer)
	if !l.answerStands() {
		t.Fatal("a fresh answer does not stand")
	}
	l.setTimer(now.Add(time.Second)) // an earlier announced time replaces the answer's on the timer
	if !l.answerStands() {
		t.Fatal("the answer fell when its own time made way for an earlier one")
	}
	l.setTimer(now.Add(2 * time.Second)) // a later one, before the answer's: the timer lets it go
	if l.answerStands() {
		t.Fatal("the answer stands though the timer let go of a time before it: that run would wait for the answer's time")
	}
	l.forgot = false
	l.setTimer(now.Add(6 * time.Second)) // after the answer: the answer's time comes first anyway
	if !l.answerStands() {
		t.Fatal("a time after the answer's made the answer fall")
	}
	l.askedAt = now.Add(-time.Minute) // a lease taken since could expire before the answer
	if l.answerStands() {
		t.Fatal("an answer older than a lease stands")
	}
}

func TestAnIdleWorkerLooksForDeadWorkersLessOftenUntilWorkOrABusyPeerShowsUp(t *testing.T) {
	w := &Worker{cfg: WorkerConfig{ReapInterval: 500 * time.Millisecond, HeartbeatInterval: 3 * time.Second}}
	l := &liveness{w: w}
	now := time.Now()
	fast, slow := w.cfg.ReapInterval, IdleReapFactor*w.cfg.ReapInterval

	w.sawWork.Store(now.Add(-time.Second).UnixNano()) // a run a second ago
	if got := l.reapEvery(now); got != fast {
		t.Fatalf("a worker that saw work a second ago looks every %v, want %v", got, fast)
	}
	w.sawWork.Store(now.Add(-4 * time.Second).UnixNano()) // nothing for longer than a heartbeat
	if got := l.reapEvery(now); got != slow {
		t.Fatalf("an idle worker looks every %v, want %v", got, slow)
	}
	l.busy = true // the last look saw another worker with runs in hand
	if got := l.reapEvery(now); got != fast {
		t.Fatalf("an idle worker whose peer holds runs looks every %v, want %v", got, fast)
	}
}

// An execution whose run this worker claimed again (its claim lost in a crash of the
// database) ends without freeing a slot: the new execution holds the run's. It was
// counted finishing and never uncounted, and the worker claimed one run more than
// MaxConcurrent for good.
func TestAnExecutionReplacedByANewClaimOfItsRunFreesNoSlotWhenItEnds(t *testing.T) {
	w := &Worker{cfg: WorkerConfig{MaxConcurrent: 2}, active: map[uuid.UUID]*execution{},
		finishingHolders: map[uuid.UUID]struct{}{}, slotFree: make(chan struct{}, 1)}
	id := uuid.New()
	old := &execution{run: store.ClaimedRun{Fence: store.Fence{RunID: id, Epoch: 1}, HoldsSlot: true},
		cancel: func(error) {}}
	w.active[id] = old
	// The run is claimed again while old goes on (start, when old is not finishing).
	again := &execution{run: store.ClaimedRun{Fence: store.Fence{RunID: id, Epoch: 1}, HoldsSlot: true},
		cancel: func(error) {}}
	w.active[id] = again
	if got := w.freeSlots(); got != 1 {
		t.Fatalf("free slots with the run claimed again: %d, want 1", got)
	}
	// old's function returns; its end is refused (lease lost) and it is done.
	w.releaseSlot(old, false)
	w.executionDone(old)
	if got := w.freeSlots(); got != 1 || w.finishing != 0 || len(w.finishingHolders) != 0 {
		t.Fatalf("after the replaced execution ended: %d free slots, %d finishing, %d finishing holders; want 1, 0, 0",
			got, w.finishing, len(w.finishingHolders))
	}
	// The run's own execution still frees its slot as it ends.
	w.releaseSlot(again, false)
	if got := w.freeSlots(); got != 2 {
		t.Fatalf("free slots once the run's execution is finishing: %d, want 2", got)
	}
	w.executionDone(again)
	if got := w.freeSlots(); got != 2 || w.finishing != 0 || len(w.finishingHolders) != 0 {
		t.Fatalf("after the run's execution ended: %d free slots, %d finishing, %d holders; want 2, 0, 0", got,
			w.finishing, len(w.finishingHolders))
	}
}

// A wait's new look due after the looker's sleep ends does not wake it: each wake reads
// every pending look, and with a wake per new look thousands of waits cost a quadratic
// amount of work. A look due before the sleep ends wakes it; the last look dropped
// ends it.
func TestOnlyALookDueBeforeTheLookersSleepEndsWakesIt(t *testing.T) {
	c := &Client{}
	ls := &c.looks
	state := func() (scans int, sleepUntil time.Time, running bool) {
		ls.mu.Lock()
		defer ls.mu.Unlock()
		return ls.scans, ls.sleepUntil, ls.running
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("waited 10 s for %s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	looks := []*runLook{c.lookAt(uuid.New(), time.Hour)}
	waitFor("the looker to sleep", func() bool { _, until, _ := state(); return !until.IsZero() })
	for i := range 1000 {
		looks = append(looks, c.lookAt(uuid.New(), time.Hour+time.Duration(i+1)*time.Millisecond))
	}
	time.Sleep(20 * time.Millisecond)
	if scans, _, _ := state(); scans != 1 {
		t.Fatalf("the looker read its pending looks %d times for 1,000 looks due after its sleep, want once", scans)
	}
	looks = append(looks, c.lookAt(uuid.New(), 30*time.Minute))
	waitFor("the earlier look to wake the looker", func() bool {
		scans, until, _ := state()
		return scans == 2 && !until.IsZero() && time.Until(until) < 31*time.Minute
	})
	for _, l := range looks {
		c.dropLook(l)
	}
	waitFor("the looker to end once no look is pending", func() bool { _, _, running := state(); return !running })
}

// A read that lost its connection wrote nothing: its UnavailableError says so, and
// does not say it may have committed.
func TestAReadThatLostItsConnectionIsUnavailableAndWroteNothing(t *testing.T) {
	err := readError("kagzi: get run r", io.ErrUnexpectedEOF)
	var u *UnavailableError
	if !errors.As(err, &u) || u.MayHaveCommitted || !strings.Contains(err.Error(), "a read: nothing was written") {
		t.Fatalf("a read's lost connection: %v (%+v), want an *UnavailableError of a read that did not commit", err, u)
	}
	if err := readError("kagzi: get run r", store.ErrNotFound); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a read of nothing: %v, want ErrNotFound", err)
	}
}

// Found in review: a json.RawMessage with a lone surrogate escape is valid JSON and
// valid UTF-8, but jsonb refuses it (22P02) for the whole statement, aborting the
// caller's transaction. It is refused before anything is sent.
func TestALoneSurrogateEscapeIsRefusedAndAPairIsNot(t *testing.T) {
	for in, want := range map[string]bool{
		`"\ud800"`:             true,
		`"\udc00"`:             true,
		`"\ud800\u0041"`:       true,
		`"a\ud800"`:            true,
		`"\ud83d\ude00"`:       false,
		`"\\ud800"`:            false, // an escaped backslash, then text
		`"\\\ud800"`:           true,
		`{"k":"\u00e9","v":1}`: false,
		`"plain"`:              false,
	} {
		if got := jsonHasLoneSurrogate([]byte(in)); got != want {
			t.Errorf("jsonHasLoneSurrogate(%s) = %v, want %v", in, got, want)
		}
		if err := storableJSON("input", []byte(in)); (err != nil) != want || (err != nil && !errors.Is(err, ErrInvalidArgument)) {
			t.Errorf("storableJSON(%s) = %v, want refused %v with ErrInvalidArgument", in, err, want)
		}
	}
}

func TestOnlyARunTakenOverAfterItsExecutionAloneIsExhausted(t *testing.T) {
	mark := func(alone bool, takeovers int, epoch, reaped int64) map[string]store.StepRecord {
		out, _ := json.Marshal(aloneMark{Alone: alone, Takeovers: takeovers, Epoch: epoch, Reaped: reaped})
		return map[string]store.StepRecord{aloneKey: {Name: aloneKey, Kind: KindPatch, Status: StepCompleted, Output: out}}
	}
	run := func(takeovers int, epoch int64, steps map[string]store.StepRecord) store.ClaimedRun {
		r := store.ClaimedRun{Takeovers: takeovers, Steps: steps}
		r.Epoch = epoch
		return r
	}
	for _, c := range []struct {
		name string
		run  store.ClaimedRun
		want bool
	}{
		{"taken over past the limit, never alone", run(2, 9, nil), false},
		{"taken over once after running alone (its lease passed)", run(2, 4, mark(true, 1, 3, 0)), true},
		{"taken over once after running alone (reaped, then claimed)", run(2, 5, mark(true, 1, 3, 4)), true},
		{"taken over from a claim that never ran it, after it ran alone", run(2, 5, mark(true, 1, 3, 0)), false},
		{"reaped from a claim that never ran it, after it ran alone", run(2, 6, mark(true, 1, 3, 5)), false},
		{"taken over twice since running alone", run(3, 5, mark(true, 1, 3, 0)), false},
		{"taken over after its window alone ended", run(2, 4, mark(false, 1, 3, 0)), false},
		{"taken over more than twice the limit plus one", run(4, 20, nil), true},
	} {
		if got := exhausted(c.run, 1); got != c.want {
			t.Errorf("%s: exhausted %v, want %v", c.name, got, c.want)
		}
	}
	if exhausted(run(50, 60, nil), -1) {
		t.Error("a run is exhausted with no limit")
	}
	if !clearedAlone(run(1, 4, mark(true, 1, 3, 0))) || clearedAlone(run(1, 4, mark(false, 1, 3, 0))) {
		t.Error("a run that ran alone at its count and was not taken over since is cleared; one whose window ended is not")
	}
}

// A run waiting ahead for a slot (a suspect started beside one included) that the
// worker claims again (its lease ran out while it waited) is dropped from the runs
// ahead: it neither starts beside the run's new execution nor hides a taken slot.
func TestARunWaitingAheadThatIsClaimedAgainIsDroppedFromTheRunsAhead(t *testing.T) {
	for _, suspect := range []bool{false, true} {
		w := &Worker{cfg: WorkerConfig{MaxConcurrent: 1}, active: map[uuid.UUID]*execution{},
			finishingHolders: map[uuid.UUID]struct{}{}, slotFree: make(chan struct{}, 1)}
		id := uuid.New()
		newX := func(epoch int64) *execution {
			return &execution{run: store.ClaimedRun{Fence: store.Fence{RunID: id, Epoch: epoch}},
				rt: &runtime{}, ctx: context.Background(), cancel: func(error) {}}
		}
		old := newX(1)
		old.ahead, old.suspect = true, suspect
		w.active[id], w.ahead = old, []*execution{old}
		again := newX(2)
		w.mu.Lock()
		w.addActiveLocked(again)
		taken := w.slotsTakenLocked()
		w.mu.Unlock()
		if len(w.ahead) != 0 || w.active[id] != again || taken != 1 {
			t.Fatalf("suspect %v: %d runs ahead, the new execution active: %v, %d slots taken; want 0, true, 1",
				suspect, len(w.ahead), w.active[id] == again, taken)
		}
	}
}
