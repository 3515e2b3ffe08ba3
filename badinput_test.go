package kagzi_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi"
)

// Found by an outside audit of the API with bad values: each was a raw database
// error, a value silently not stored, or a run left RUNNING with nothing executing it.

func TestValuesTheDatabaseCannotHoldAreInvalidArguments(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("echo-text", func(ctx *kagzi.Context, s string) (string, error) { return s, nil })
	if _, err := kagzi.Start(ctx, e.client, wf, "a\x00b"); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("an input with a NUL character: %v, want ErrInvalidArgument", err)
	}
	if _, err := e.client.StartByName(ctx, "echo-text", json.RawMessage(`"a\u0000b"`)); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("a raw input with a NUL character: %v, want ErrInvalidArgument", err)
	}
	if _, err := kagzi.Start(ctx, e.client, wf, "x", kagzi.WithStartAt(time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC))); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Errorf("a start time past PostgreSQL's: %v, want ErrInvalidArgument", err)
	}
	for _, v := range []string{"v\x00", "v\xff", "v\x7f", strings.Repeat("v", 300)} {
		if _, err := kagzi.Start(ctx, e.client, wf, "x", kagzi.WithRunVersion(v)); !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("WithRunVersion(%q): %v, want ErrInvalidArgument", v, err)
		}
		if _, err := kagzi.StartMany(ctx, e.client, wf, []string{"x"}, kagzi.WithRunVersion(v)); !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("StartMany WithRunVersion(%q): %v, want ErrInvalidArgument", v, err)
		}
	}
	var n int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.runs`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d runs after refused starts, want none", n)
	}
}

func TestAnEventValueTheDatabaseRefusesIsAnErrorNotAValueSilentlyLost(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var setErr error
	wf := kagzi.Define("publisher", func(ctx *kagzi.Context, _ int) (string, error) {
		if err := ctx.SetEvent("good", "before"); err != nil {
			return "", err
		}
		setErr = ctx.SetEvent("bad", "a\x00b")
		return "done", nil
	})
	runID, _ := runToEnd(t, e, wf)
	if setErr == nil || !errors.Is(setErr, kagzi.ErrNonRetryable) {
		t.Fatalf("SetEvent of a value with a NUL character returned %v, want a non-retryable error", setErr)
	}
	if got, err := kagzi.GetEvent[string](ctx, e.client, runID, "good"); err != nil || got != "before" {
		t.Fatalf("the event set before: %q, %v", got, err)
	}
}

func TestASleepPastTheYear9999IsAnInvalidArgumentAndTheRunGoesOn(t *testing.T) {
	e := newEnv(t)
	wf := kagzi.Define("far-sleeper", func(ctx *kagzi.Context, _ int) (string, error) {
		err := ctx.SleepUntil("far", time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC))
		if !errors.Is(err, kagzi.ErrInvalidArgument) {
			return "", kagzi.NonRetryable(errors.New("SleepUntil year 300000 did not return ErrInvalidArgument"))
		}
		return "went on", nil
	})
	if _, out := runToEnd(t, e, wf); out != "went on" {
		t.Fatalf("the run's output: %q; want it to complete after the refused sleep", out)
	}
}

func TestAStepNameWithAHashIsRefusedSoItCannotSpellABranchsStepKey(t *testing.T) {
	e := newEnv(t)
	var refused error
	ran := false
	wf := kagzi.Define("spelling", func(ctx *kagzi.Context, _ int) (string, error) {
		b := kagzi.Go(ctx, "b", func(bc *kagzi.Context) (string, error) {
			return kagzi.Step(bc, "c", func(context.Context) (string, error) { return "from-branch", nil })
		})
		if _, err := b.Get(); err != nil {
			return "", err
		}
		// "b#1/c" + "#1" is the branch's step's key.
		_, refused = kagzi.Step(ctx, "b#1/c", func(context.Context) (string, error) { ran = true; return "mine", nil })
		return "done", nil
	})
	runToEnd(t, e, wf)
	if !errors.Is(refused, kagzi.ErrInvalidArgument) || ran {
		t.Fatalf("Step named \"b#1/c\": %v (body ran: %v), want ErrInvalidArgument before anything ran", refused, ran)
	}
}

func TestAStepOutputThatCannotBeRecordedFailsTheStepWithInvalidOutput(t *testing.T) {
	e := newEnv(t)
	var stepErr error
	wf := kagzi.Define("unencodable-step", func(ctx *kagzi.Context, _ int) (string, error) {
		_, stepErr = kagzi.Step(ctx, "inf", func(context.Context) (float64, error) { return math.Inf(1), nil })
		return "done", nil
	})
	runToEnd(t, e, wf)
	var se *kagzi.StepError
	if !errors.As(stepErr, &se) || se.Detail.Code != kagzi.CodeInvalidOutput || !se.Detail.NonRetryable {
		t.Fatalf("a step returning +Inf: %v, want a non-retryable StepError with code %s (as a workflow output's)", stepErr, kagzi.CodeInvalidOutput)
	}
}

// runToEnd runs wf once with input 1 on a worker of its own and returns the run's id
// and output once it completed.
func runToEnd(t *testing.T, e *env, wf *kagzi.Workflow[int, string]) (runID, out string) {
	t.Helper()
	runWorker(t, e.client, fastWorker(), wf)
	ctx := waitCtx(t)
	run, err := kagzi.Start(ctx, e.client, wf, 1)
	if err != nil {
		t.Fatal(err)
	}
	if out, err = run.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	return run.RunID, out
}

// Found from outside: IDReuseNever held only against later starts that passed it too.
func TestARunStartedWithIDReuseNeverKeepsItsIDFromStartsWithoutTheOption(t *testing.T) {
	e := newEnv(t)
	wf := kagzi.Define("kept-id", func(ctx *kagzi.Context, n int) (string, error) { return strconv.Itoa(n), nil })
	runWorker(t, e.client, fastWorker(), wf)
	ctx := waitCtx(t)
	first, err := kagzi.Start(ctx, e.client, wf, 1, kagzi.WithID("order-1"), kagzi.WithIDReuse(kagzi.IDReuseNever))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := kagzi.Start(ctx, e.client, wf, 2, kagzi.WithID("order-1"))
	if err != nil {
		t.Fatal(err)
	}
	byName, err := e.client.StartByName(ctx, "kept-id", 3, kagzi.WithID("order-1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		id     string
		exists bool
	}{{again.RunID, again.AlreadyExists}, {byName.RunID, byName.AlreadyExists}} {
		if r.id != first.RunID || !r.exists {
			t.Fatalf("a start of the id without the option: run %s (already exists %v), want the finished run %s", r.id, r.exists, first.RunID)
		}
	}
	// An id whose finished run did not ask for it is free again, as before.
	free, err := kagzi.Start(ctx, e.client, wf, 4, kagzi.WithID("order-2"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := free.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := kagzi.Start(ctx, e.client, wf, 5, kagzi.WithID("order-2"))
	if err != nil || next.AlreadyExists || next.RunID == free.RunID {
		t.Fatalf("a start of an id whose run finished without IDReuseNever: %+v, %v; want a new run", next, err)
	}
}

// Found from outside: starts of one workflow id that race, while a worker ends the
// run at once (an eager start ends in a millisecond), each looked for the id's run in a
// snapshot taken before the first one's run was inserted and ended, and each started
// the id: 16 concurrent starts of each of 40 ids with IDReuseNever gave 13-24 of them
// two or three runs. Every start of the id returns the one run.
func TestConcurrentStartsOfAnIDWithIDReuseNeverStartItOnceWhileItsRunEndsAtOnce(t *testing.T) {
	e := newEnv(t)
	wf := kagzi.Define("raced-id", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
	cfg := fastWorker()
	cfg.MaxConcurrent = 50
	runWorker(t, e.client, cfg, wf)
	ctx := waitCtx(t)
	const ids, starters = 30, 12
	for i := range ids {
		id := fmt.Sprintf("payment-%d", i)
		var wg sync.WaitGroup
		got := make([]string, starters)
		errs := make([]error, starters)
		for g := range starters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var r *kagzi.Run[int]
				r, errs[g] = kagzi.Start(ctx, e.client, wf, g, kagzi.WithID(id), kagzi.WithIDReuse(kagzi.IDReuseNever))
				if r != nil {
					got[g] = r.RunID
				}
			}()
		}
		wg.Wait()
		for g := range starters {
			if errs[g] != nil {
				t.Fatal(errs[g])
			}
			if got[g] != got[0] {
				t.Fatalf("%s: starters got runs %s and %s, want one run", id, got[0], got[g])
			}
		}
		if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE workflow_id = '`+id+`'`); n != 1 {
			t.Fatalf("%s: %d runs of the id, want 1", id, n)
		}
	}
}

// Found in review: a start in the caller's transaction took the id's lock and held it
// to the caller's commit, so starts of the id waited for it, and with them every start
// batched with one: with a transaction left open, every Start of the client stalled.
// A start in the caller's transaction takes no lock; other starts go on meanwhile.
func TestAStartInAnOpenTransactionHoldsUpNoOtherStart(t *testing.T) {
	e := newEnv(t)
	wf := kagzi.Define("held-id", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
	ctx := waitCtx(t)
	if _, err := kagzi.Start(ctx, e.client, wf, 0, kagzi.WithID("held")); err != nil {
		t.Fatal(err)
	}
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if r, err := kagzi.StartTx(ctx, tx, e.client, wf, 1, kagzi.WithID("held")); err != nil || !r.AlreadyExists {
		t.Fatalf("StartTx of the id: %+v, %v; want the run that holds it", r, err)
	}
	// The transaction stays open while other starts go.
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 9)
	for i := range 9 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var opts []kagzi.StartOption
			if i < 4 {
				opts = append(opts, kagzi.WithID("held"))
			}
			_, err := kagzi.Start(sctx, e.client, wf, i, opts...)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a start while a transaction that started the id stayed open: %v", err)
		}
	}
}

// Found from outside: a crafted page token past the years a run can have was taken
// (and gave another page), and an empty attribute filter matched no run.
func TestAPageTokenOutOfRangeIsRefusedAndAnEmptyAttributeFilterSelectsEveryRun(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("listed", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
	for i := range 2 {
		if _, err := kagzi.Start(ctx, e.client, wf, i); err != nil {
			t.Fatal(err)
		}
	}
	for _, raw := range []string{"-9223372036854775808/", "9223372036854775807/", "-62135596800000001/"} {
		tok := base64.RawURLEncoding.EncodeToString([]byte(raw + "0190c7a0-0000-7000-8000-000000000000"))
		if _, err := e.client.ListRuns(ctx, kagzi.RunFilter{PageToken: tok}); !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("a page token of %s: %v, want ErrInvalidArgument", raw, err)
		}
	}
	page, err := e.client.ListRuns(ctx, kagzi.RunFilter{Attributes: map[string]any{}})
	if err != nil || len(page.Runs) != 2 {
		t.Fatalf("an empty attribute filter: %v runs, %v; want both runs", page, err)
	}
}

// Found from outside: StartMany dropped WithIDReuse and took an unknown value.
func TestStartManyKeepsIDReuseNeverAndRefusesAnUnknownIDReuse(t *testing.T) {
	e := newEnv(t)
	wf := kagzi.Define("many-kept", func(ctx *kagzi.Context, n int) (string, error) { return strconv.Itoa(n), nil })
	runWorker(t, e.client, fastWorker(), wf)
	ctx := waitCtx(t)
	if _, err := kagzi.StartMany(ctx, e.client, wf, []int{1}, kagzi.WithIDReuse(kagzi.IDReuse(99))); !errors.Is(err, kagzi.ErrInvalidArgument) {
		t.Fatalf("StartMany with IDReuse(99): %v, want ErrInvalidArgument", err)
	}
	runs, err := kagzi.StartMany(ctx, e.client, wf, []int{1}, kagzi.WithIDReuse(kagzi.IDReuseNever))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := runs[0].Wait(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := kagzi.Start(ctx, e.client, wf, 2, kagzi.WithID(runs[0].WorkflowID))
	if err != nil || !again.AlreadyExists || again.RunID != runs[0].RunID {
		t.Fatalf("a start of the finished run's id: %+v, %v; want that run (IDReuseNever)", again, err)
	}
}

// Found from outside: a NUL character reached the database where nothing checked for
// it. A workflow's error or panic quoting one was never recorded (the run was taken
// over and executed again until RECOVERY_EXHAUSTED); a step's output with one was
// returned as a success and failed the next step with a raw driver error.
func TestAWorkflowErrorOrPanicQuotingANULCharacterFailsTheRunOnceWithTheErrorRecorded(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var executions atomic.Int32
	wf := kagzi.Define("nul-failure", func(ctx *kagzi.Context, mode string) (string, error) {
		executions.Add(1)
		switch mode {
		case "panic":
			panic("bad \x00 input")
		case "detail":
			return "", &kagzi.Error{Code: "UPSTREAM\x00", Message: "m\x00", NonRetryable: true,
				Metadata: map[string]string{"k\x00": "v\x00"}}
		}
		return "", kagzi.NonRetryable(errors.New("bad record \x00 from upstream"))
	})
	runWorker(t, e.client, fastWorker(), wf)
	for _, mode := range []string{"error", "panic", "detail"} {
		executions.Store(0)
		run, err := kagzi.Start(ctx, e.client, wf, mode)
		if err != nil {
			t.Fatal(err)
		}
		_, err = run.Wait(ctx)
		var we *kagzi.WorkflowError
		if !errors.As(err, &we) {
			t.Fatalf("%s: Wait: %v, want the run's failure", mode, err)
		}
		if we.Detail.Code == kagzi.CodeRecoveryExhausted || strings.Contains(we.Detail.Message, "\x00") {
			t.Fatalf("%s: recorded failure %+v, want the workflow's own error with its NUL replaced", mode, we.Detail)
		}
		if mode == "panic" && we.Detail.Code != kagzi.CodePanic {
			t.Fatalf("panic: recorded code %s, want %s", we.Detail.Code, kagzi.CodePanic)
		}
		if mode == "detail" && (we.Detail.Code != "UPSTREAM\uFFFD" || we.Detail.Metadata["k\uFFFD"] != "v\uFFFD") {
			t.Fatalf("detail: recorded %+v", we.Detail)
		}
		if mode != "detail" && !strings.Contains(we.Detail.Message, "\uFFFD") {
			t.Fatalf("%s: recorded message %q, want the text with U+FFFD for the NUL", mode, we.Detail.Message)
		}
		if n := executions.Load(); mode != "panic" && n != 1 { // a panic is retried as its policy says
			t.Fatalf("%s: the workflow executed %d times, want once", mode, n)
		}
	}
}

func TestAStepOutputWithANULCharacterFailsTheStepItselfWithInvalidOutput(t *testing.T) {
	e := newEnv(t)
	var stepErr, attrErr error
	wf := kagzi.Define("nul-step", func(ctx *kagzi.Context, _ int) (string, error) {
		_, stepErr = kagzi.Step(ctx, "s", func(context.Context) (string, error) { return "a\x00b", nil })
		attrErr = ctx.SetAttributes(map[string]any{"note": "a\x00b"})
		return kagzi.Step(ctx, "t", func(context.Context) (string, error) { return "after", nil })
	})
	runID, out := runToEnd(t, e, wf)
	var se *kagzi.StepError
	if !errors.As(stepErr, &se) || se.Detail.Code != kagzi.CodeInvalidOutput || !se.Detail.NonRetryable {
		t.Fatalf("a step returning a NUL character: %v, want a non-retryable StepError with code %s", stepErr, kagzi.CodeInvalidOutput)
	}
	if !errors.Is(attrErr, kagzi.ErrInvalidArgument) || !errors.Is(attrErr, kagzi.ErrNonRetryable) {
		t.Fatalf("SetAttributes with a NUL character: %v, want ErrInvalidArgument and NonRetryable", attrErr)
	}
	if out != "after" {
		t.Fatalf("output %q", out)
	}
	steps, err := e.client.ListSteps(waitCtx(t), runID)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]kagzi.StepStatus{}
	for _, s := range steps {
		got[s.Name] = s.Status
	}
	if got["s"] != kagzi.StepFailed || got["t"] != kagzi.StepCompleted {
		t.Fatalf("recorded steps %v, want s FAILED and t COMPLETED", got)
	}
	info, err := e.client.GetRun(waitCtx(t), runID)
	if err != nil || info.Attributes != nil {
		t.Fatalf("attributes after a refused SetAttributes: %v, %v", info.Attributes, err)
	}
}

// A start option PostgreSQL cannot store (a start time or deadline past its
// timestamps' range) is refused before anything is sent: inside the caller's
// transaction, a statement the database refused would abort it and lose the caller's
// own writes (found from outside: StartTx with WithStartAt in year 295000).
func TestAStartTimeOrDeadlinePastTheDatabasesRangeLeavesTheCallersTransactionUsable(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("echo-in-tx", func(ctx *kagzi.Context, s string) (string, error) { return s, nil })
	if _, err := e.pool.Exec(ctx, `CREATE TABLE orders (id int)`); err != nil {
		t.Fatal(err)
	}
	far := time.Date(295000, 1, 1, 0, 0, 0, 0, time.UTC)
	for name, opt := range map[string]kagzi.StartOption{
		"WithStartAt": kagzi.WithStartAt(far), "WithDeadline": kagzi.WithDeadline(far),
		"WithStartAt in year 10000": kagzi.WithStartAt(time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)),
		"WithStartAt before year 1": kagzi.WithStartAt(time.Date(-5000, 1, 1, 0, 0, 0, 0, time.UTC)),
	} {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES (1)`); err != nil {
			t.Fatal(err)
		}
		if _, err := kagzi.StartTx(ctx, tx, e.client, wf, "x", opt); !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES (2)`); err != nil {
			t.Errorf("%s: the caller's transaction after the refused start: %v", name, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Errorf("%s: commit: %v", name, err)
		}
	}
	var orders, runs int
	if err := e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM kagzi.runs)`).Scan(&orders, &runs); err != nil {
		t.Fatal(err)
	}
	if orders != 8 || runs != 0 {
		t.Fatalf("%d of the caller's rows and %d runs committed, want 8 and none", orders, runs)
	}
}

// A Workflow not made by Define (a variable or struct field never assigned) is refused
// as Define("", nil) is: found from outside, Start stored runs of workflow type "" and
// a worker registered it, then panicked on its nil function at the claim.
func TestAZeroWorkflowIsRefusedByStartStartTxStartManyStartChildAndNewWorker(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	var zero kagzi.Workflow[string, string]
	var holder struct {
		Flow kagzi.Workflow[string, string]
	}
	for name, wf := range map[string]*kagzi.Workflow[string, string]{"a zero variable": &zero, "a zero field": &holder.Flow} {
		if _, err := kagzi.Start(ctx, e.client, wf, "x"); !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("Start of %s: %v, want ErrInvalidArgument", name, err)
		}
		if _, err := kagzi.StartMany(ctx, e.client, wf, []string{"x"}); !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("StartMany of %s: %v, want ErrInvalidArgument", name, err)
		}
		if _, err := kagzi.NewWorker(e.client, fastWorker(), wf); !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("NewWorker of %s: %v, want ErrInvalidArgument", name, err)
		}
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kagzi.StartTx(ctx, tx, e.client, wf, "x"); !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("StartTx of %s: %v, want ErrInvalidArgument", name, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var childErr error
	parent := kagzi.Define("zero-child-parent", func(ctx *kagzi.Context, _ int) (string, error) {
		_, childErr = kagzi.StartChild(ctx, "child", &zero, "x")
		return "done", nil
	})
	runToEnd(t, e, parent)
	if !errors.Is(childErr, kagzi.ErrInvalidArgument) {
		t.Errorf("StartChild of a zero Workflow: %v, want ErrInvalidArgument", childErr)
	}
	var n int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM kagzi.runs WHERE workflow_type <> 'zero-child-parent'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d runs of a zero Workflow stored, want none", n)
	}
}

// encoding/json passes the bytes of a json.RawMessage (or a MarshalJSON's result)
// through unchecked, so a payload may hold bytes that are not UTF-8, which
// PostgreSQL refuses. They are refused before anything is sent, as a NUL character
// is: found from outside, StartByNameTx, StartTx and SignalTx sent them, and the
// database's refusal aborted the caller's transaction with its own rows.
func TestBytesThatAreNotUTF8AreRefusedBeforeAnythingIsSentAndTheCallersTransactionStaysUsable(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	bad := json.RawMessage("{\"note\":\"\xff\"}")
	raw := kagzi.Define("raw-utf8", func(ctx *kagzi.Context, in json.RawMessage) (string, error) { return "", nil })
	target, err := e.client.StartByName(ctx, "raw-utf8", json.RawMessage(`{"note":"ok"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `CREATE TABLE orders (id int)`); err != nil {
		t.Fatal(err)
	}
	inTx := map[string]func(tx pgx.Tx) error{
		"StartByNameTx": func(tx pgx.Tx) error { _, err := e.client.StartByNameTx(ctx, tx, "raw-utf8", bad); return err },
		"StartTx":       func(tx pgx.Tx) error { _, err := kagzi.StartTx(ctx, tx, e.client, raw, bad); return err },
		"SignalTx":      func(tx pgx.Tx) error { return e.client.SignalTx(ctx, tx, target.RunID, "go", bad) },
		"StartTx WithAttributes": func(tx pgx.Tx) error {
			_, err := kagzi.StartTx(ctx, tx, e.client, raw, json.RawMessage(`{}`), kagzi.WithAttributes(map[string]any{"a": bad}))
			return err
		},
	}
	for name, call := range inTx {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES (1)`); err != nil {
			t.Fatal(err)
		}
		if err := call(tx); !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES (2)`); err != nil {
			t.Errorf("%s: the caller's transaction after the refused call: %v", name, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Errorf("%s: commit: %v", name, err)
		}
	}
	outside := map[string]func() error{
		"StartByName": func() error { _, err := e.client.StartByName(ctx, "raw-utf8", bad); return err },
		"Start":       func() error { _, err := kagzi.Start(ctx, e.client, raw, bad); return err },
		"StartMany":   func() error { _, err := kagzi.StartMany(ctx, e.client, raw, []json.RawMessage{bad}); return err },
		"Signal":      func() error { return e.client.Signal(ctx, target.RunID, "go", bad) },
		"CreateSchedule": func() error {
			_, err := e.client.CreateSchedule(ctx, kagzi.Schedule{ID: "s", WorkflowType: "raw-utf8", Cron: "0 * * * *", Input: bad})
			return err
		},
		"ListRuns by attribute": func() error {
			_, err := e.client.ListRuns(ctx, kagzi.RunFilter{Attributes: map[string]any{"a": bad}})
			return err
		},
	}
	for name, call := range outside {
		if err := call(); !errors.Is(err, kagzi.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	var orders, runs, signals, schedules int
	if err := e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM kagzi.runs),
		(SELECT count(*) FROM kagzi.signals), (SELECT count(*) FROM kagzi.schedules)`).Scan(&orders, &runs, &signals, &schedules); err != nil {
		t.Fatal(err)
	}
	if orders != 2*len(inTx) || runs != 1 || signals != 0 || schedules != 0 {
		t.Fatalf("%d of the caller's rows, %d runs, %d signals and %d schedules committed, want %d, 1 (the signals' target), none and none",
			orders, runs, signals, schedules, 2*len(inTx))
	}
}

// A workflow's own payloads with bytes that are not UTF-8 fail where they are made,
// as those with a NUL character do: a step's output the step (INVALID_OUTPUT), an
// event its SetEvent, the run's output the run (INVALID_OUTPUT), none of them retried.
func TestBytesThatAreNotUTF8InAWorkflowsPayloadsFailTheStepTheEventOrTheRunWithInvalidOutput(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	bad := json.RawMessage("\"\xff\"")
	var stepErr, eventErr error
	wf := kagzi.Define("raw-utf8-out", func(ctx *kagzi.Context, _ int) (json.RawMessage, error) {
		_, stepErr = kagzi.Step(ctx, "s", func(context.Context) (json.RawMessage, error) { return bad, nil })
		eventErr = ctx.SetEvent("e", bad)
		return bad, nil
	})
	runWorker(t, e.client, fastWorker(), wf)
	run, err := kagzi.Start(ctx, e.client, wf, 1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	var we *kagzi.WorkflowError
	if !errors.As(err, &we) || we.Detail.Code != kagzi.CodeInvalidOutput {
		t.Fatalf("a run whose output is not UTF-8: %v, want a WorkflowError with code %s", err, kagzi.CodeInvalidOutput)
	}
	var se *kagzi.StepError
	if !errors.As(stepErr, &se) || se.Detail.Code != kagzi.CodeInvalidOutput || !se.Detail.NonRetryable {
		t.Errorf("a step whose output is not UTF-8: %v, want a non-retryable StepError with code %s", stepErr, kagzi.CodeInvalidOutput)
	}
	if !errors.Is(eventErr, kagzi.ErrInvalidArgument) || !errors.Is(eventErr, kagzi.ErrNonRetryable) {
		t.Errorf("SetEvent of a value that is not UTF-8: %v, want ErrInvalidArgument and NonRetryable", eventErr)
	}
	info, err := e.client.GetRun(ctx, run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if info.Attempt != 1 {
		t.Errorf("the run ended at attempt %d, want 1", info.Attempt)
	}
}
