package kagzitest_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/kagzitest"
)

// The workflow under test: a welcome email, 30 days of waiting, then a reminder
// unless the user became active meanwhile.
type User struct {
	ID    string
	Email string
}

var sentEmails []string // what the real email step would send; the test stubs it

var Onboarding = kagzi.Define("onboarding", func(ctx *kagzi.Context, u User) (string, error) {
	if _, err := kagzi.Step(ctx, "send-email", func(context.Context) (string, error) {
		sentEmails = append(sentEmails, "welcome "+u.Email)
		return "sent", nil
	}); err != nil {
		return "", err
	}
	if err := ctx.Sleep("wait", 30*24*time.Hour); err != nil {
		return "", err
	}
	active, err := kagzi.Step(ctx, "check-activity", func(context.Context) (bool, error) {
		return false, nil // the real one asks the users service
	})
	if err != nil {
		return "", err
	}
	if active {
		return "active", nil
	}
	if _, err := kagzi.Step(ctx, "send-email", func(context.Context) (string, error) {
		sentEmails = append(sentEmails, "reminder "+u.Email)
		return "sent", nil
	}); err != nil {
		return "", err
	}
	return "reminded", nil
})

// TestOnboardingRemindsAfterThirtyDays is the example of the package: it runs a
// workflow that sleeps 30 days, against a real database, in milliseconds.
func TestOnboardingRemindsAfterThirtyDays(t *testing.T) {
	t.Parallel()
	env := kagzitest.New(t, Onboarding)
	var stubbed atomic.Int32
	env.StubStep("send-email", func(ctx context.Context, attempt int) (any, error) {
		stubbed.Add(1) // no mail leaves the test
		return "sent", nil
	})

	began := time.Now()
	run := kagzitest.Start(env, Onboarding, User{ID: "u1", Email: "ada@example.com"})
	out, err := kagzitest.Wait(env, run)
	if err != nil || out != "reminded" {
		t.Fatalf("got %q, %v", out, err)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("30 days took %v of real time", took)
	}
	if ahead := env.Now().Sub(time.Now()); ahead < 30*24*time.Hour-time.Minute {
		t.Errorf("the Env's clock moved %v, want 30 days", ahead)
	}
	env.AssertSteps(run.RunID, "send-email#1", "wait#1", "check-activity#1", "send-email#2=COMPLETED*1")
	if stubbed.Load() != 2 || len(sentEmails) != 0 {
		t.Errorf("stub called %d times, real step %d times", stubbed.Load(), len(sentEmails))
	}
}

func TestStubbedStepDecidesTheBranch(t *testing.T) {
	t.Parallel()
	env := kagzitest.New(t, Onboarding)
	env.StubStep("send-email", func(context.Context, int) (any, error) { return "sent", nil })
	env.StubStep("check-activity", func(context.Context, int) (any, error) { return true, nil })
	out, err := kagzitest.Run(env, Onboarding, User{ID: "u2"})
	if err != nil || out != "active" {
		t.Fatalf("got %q, %v", out, err)
	}
	if env.Calls("send-email") != 1 || env.Calls("check-activity") != 1 {
		t.Fatalf("calls: send-email %d, check-activity %d", env.Calls("send-email"), env.Calls("check-activity"))
	}
}

var charge = kagzi.Define("charge", func(ctx *kagzi.Context, amount int) (string, error) {
	return kagzi.Step(ctx, "charge-card", func(context.Context) (string, error) {
		return "charged", nil
	}, kagzi.WithRetry(kagzi.Exponential(4).Initial(10*time.Minute).Max(time.Hour).Jitter(0)))
})

func TestFailedAttemptsRetryAfterTheirBackoffWithoutWaiting(t *testing.T) {
	t.Parallel()
	env := kagzitest.New(t, charge)
	env.FailStep("charge-card", 2, errors.New("card network down"))
	began := env.Now()
	run := kagzitest.Start(env, charge, 100)
	out, err := kagzitest.Wait(env, run)
	if err != nil || out != "charged" {
		t.Fatalf("got %q, %v", out, err)
	}
	// Backoffs of 10 and 20 minutes passed on the Env's clock.
	if skipped := env.Now().Sub(began); skipped < 30*time.Minute {
		t.Errorf("the clock moved %v, want the 30 minutes of backoff", skipped)
	}
	steps := env.Steps(run.RunID)
	if len(steps) != 1 || len(steps[0].Attempts) != 3 || steps[0].Attempts[0].Error.Message != "card network down" {
		t.Fatalf("steps %+v", steps)
	}

	env.FailStep("charge-card", 0, errors.New("card declined"))
	_, err = kagzitest.Run(env, charge, 200)
	var se *kagzi.WorkflowError
	if !errors.As(err, &se) || !errors.Is(err, kagzi.ErrWorkflowFailed) {
		t.Fatalf("got %v, want the run to fail after its 4 attempts", err)
	}
}

var pipeline = kagzi.Define("pipeline", func(ctx *kagzi.Context, _ int) (int, error) {
	total := 0
	for _, name := range []string{"extract", "transform", "load"} {
		n, err := kagzi.Step(ctx, name, func(context.Context) (int, error) { return len(name), nil })
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
})

func TestACrashAtAStepResumesOnANewWorkerWithoutRerunningCompletedSteps(t *testing.T) {
	t.Parallel()
	env := kagzitest.New(t, pipeline)
	env.CrashAt("transform")
	run := kagzitest.Start(env, pipeline, 0)
	out, err := kagzitest.Wait(env, run)
	if err != nil || out != len("extract")+len("transform")+len("load") {
		t.Fatalf("got %d, %v", out, err)
	}
	if env.Restarts() != 1 {
		t.Fatalf("%d restarts, want 1", env.Restarts())
	}
	// extract ran once; transform began twice (the crash, then the real run); load once.
	if env.Calls("extract") != 1 || env.Calls("transform") != 2 || env.Calls("load") != 1 {
		t.Fatalf("calls: extract %d, transform %d, load %d", env.Calls("extract"), env.Calls("transform"), env.Calls("load"))
	}
	runID := run.RunID
	// The interrupted attempt is not recorded: each step completed in one attempt.
	env.AssertSteps(runID, "extract#1*1", "transform#1*1", "load#1=COMPLETED*1")
	info, err := env.Client.GetRun(context.Background(), runID)
	if err != nil || info.LockedBy != "" || info.Status != kagzi.StatusCompleted {
		t.Fatalf("run %+v, %v", info, err)
	}
}

var approval = kagzi.Define("approval", func(ctx *kagzi.Context, _ int) (string, error) {
	decision, err := kagzi.WaitSignal[string](ctx, "decision", 72*time.Hour)
	if errors.Is(err, kagzi.ErrSignalTimeout) {
		return "escalated", nil
	}
	return decision, err
})

func TestASignalTimeoutOfThreeDaysFiresAtOnce(t *testing.T) {
	t.Parallel()
	env := kagzitest.New(t, approval)
	out, err := kagzitest.Run(env, approval, 0)
	if err != nil || out != "escalated" {
		t.Fatalf("got %q, %v", out, err)
	}

	run := kagzitest.Start(env, approval, 1)
	if err := env.Client.Signal(context.Background(), run.RunID, "decision", "approved"); err != nil {
		t.Fatal(err)
	}
	if out, err := kagzitest.Wait(env, run); err != nil || out != "approved" {
		t.Fatalf("got %q, %v", out, err)
	}
}

var deadlined = kagzi.Define("deadlined", func(ctx *kagzi.Context, _ int) (int, error) {
	return 0, ctx.Sleep("forever", 365*24*time.Hour)
})

func TestARunDeadlineFiresBeforeALongerSleep(t *testing.T) {
	t.Parallel()
	env := kagzitest.New(t, deadlined)
	_, err := kagzitest.Run(env, deadlined, 0, kagzi.WithRunTimeout(48*time.Hour))
	if !errors.Is(err, kagzi.ErrDeadlineExceeded) {
		t.Fatalf("got %v, want the deadline", err)
	}
	if ahead := env.Now().Sub(time.Now()); ahead < 47*time.Hour || ahead > 49*time.Hour {
		t.Fatalf("the clock moved %v, want 48h", ahead)
	}
}

var report = kagzi.Define("nightly-report", func(ctx *kagzi.Context, team string) (string, error) {
	return "report for " + team, nil
})

func TestAdvanceFiresADailySchedule(t *testing.T) {
	t.Parallel()
	env := kagzitest.New(t, report)
	ctx := context.Background()
	if _, err := env.Client.CreateSchedule(ctx, kagzi.Schedule{ID: "nightly", WorkflowType: "nightly-report",
		Cron: "0 3 * * *", Input: "ops"}); err != nil {
		t.Fatal(err)
	}
	env.Advance(25 * time.Hour)
	deadline := time.Now().Add(10 * time.Second)
	for {
		page, err := env.Client.ListRuns(ctx, kagzi.RunFilter{ScheduleID: "nightly", Statuses: []kagzi.RunStatus{kagzi.StatusCompleted},
			IncludePayloads: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Runs) == 1 {
			if string(page.Runs[0].Output) != `"report for ops"` {
				t.Fatalf("output %s", page.Runs[0].Output)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the schedule did not fire after a day: %d runs", len(page.Runs))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exampleT stands in for a test's *testing.T in the Example functions below, which
// have none: in your tests, pass t.
type exampleT struct {
	testing.TB // not set: kagzitest calls only the methods below
	cleanups   []func()
}

func (t *exampleT) Helper()                        {}
func (t *exampleT) Cleanup(f func())               { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Errorf(format string, a ...any) { fmt.Printf(format+"\n", a...) }
func (t *exampleT) Fatalf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }
func (t *exampleT) finish() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}

func ExampleNew() {
	t := &exampleT{} // in a test: func TestOnboarding(t *testing.T) { ... }
	defer t.finish()

	// A database of the test's own, a client and a worker for the workflow.
	env := kagzitest.New(t, Onboarding)
	env.StubStep("send-email", func(ctx context.Context, attempt int) (any, error) {
		return "sent", nil // no mail leaves the test
	})

	run := kagzitest.Start(env, Onboarding, User{ID: "u1", Email: "ada@example.com"})
	out, err := kagzitest.Wait(env, run) // the 30-day Sleep inside takes milliseconds
	fmt.Println(out, err)
	fmt.Println(env.StepKeys(run.RunID))
	fmt.Println("the Env's clock moved 30 days:", env.Now().Sub(time.Now()) > 30*24*time.Hour-time.Minute)
	env.AssertSteps(run.RunID, "send-email#1", "wait#1", "check-activity#1", "send-email#2=COMPLETED*1")
	// Output:
	// reminded <nil>
	// [send-email#1 wait#1 check-activity#1 send-email#2]
	// the Env's clock moved 30 days: true
}

func ExampleEnv_CrashAt() {
	t := &exampleT{}
	defer t.finish()
	env := kagzitest.New(t, pipeline)

	// The worker dies when the transform step begins; a new worker resumes the run
	// and replays what completed.
	env.CrashAt("transform")
	out, err := kagzitest.Run(env, pipeline, 0)
	fmt.Println(out, err, "restarts:", env.Restarts())
	fmt.Println("extract", env.Calls("extract"), "transform", env.Calls("transform"), "load", env.Calls("load"))
	// Output:
	// 20 <nil> restarts: 1
	// extract 1 transform 2 load 1
}

func ExampleEnv_FailStep() {
	t := &exampleT{}
	defer t.finish()
	env := kagzitest.New(t, charge)

	// The first two attempts fail; the policy's 10- and 20-minute backoffs pass on the
	// Env's clock, not the wall clock.
	env.FailStep("charge-card", 2, errors.New("card network down"))
	run := kagzitest.Start(env, charge, 100)
	out, err := kagzitest.Wait(env, run)
	fmt.Println(out, err)
	for _, a := range env.Steps(run.RunID)[0].Attempts {
		fmt.Println("attempt", a.Number, a.Status)
	}
	// Output:
	// charged <nil>
	// attempt 1 FAILED
	// attempt 2 FAILED
	// attempt 3 COMPLETED
}

// Found from outside: ResumeSchedule computed the next tick on the real clock, three
// days behind the Env's, and the schedule back-filled a tick that came while paused.
func TestAResumeAfterAdvanceFiresNoTickOfThePause(t *testing.T) {
	t.Parallel()
	env := kagzitest.New(t, report)
	ctx := context.Background()
	if _, err := env.Client.CreateSchedule(ctx, kagzi.Schedule{ID: "nightly", WorkflowType: "nightly-report",
		Cron: "0 3 * * *", Input: "ops"}); err != nil {
		t.Fatal(err)
	}
	env.Advance(25 * time.Hour)
	runs := func() int {
		page, err := env.Client.ListRuns(ctx, kagzi.RunFilter{ScheduleID: "nightly"})
		if err != nil {
			t.Fatal(err)
		}
		return len(page.Runs)
	}
	for deadline := time.Now().Add(10 * time.Second); runs() != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the schedule did not fire after a day: %d runs", runs())
		}
	}
	before, err := env.Client.GetSchedule(ctx, "nightly")
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Client.PauseSchedule(ctx, "nightly"); err != nil {
		t.Fatal(err)
	}
	env.Advance(72 * time.Hour)
	if err := env.Client.ResumeSchedule(ctx, "nightly"); err != nil {
		t.Fatal(err)
	}
	info, err := env.Client.GetSchedule(ctx, "nightly")
	if err != nil {
		t.Fatal(err)
	}
	// (The first Advance may pass two 03:00 ticks, one of them skipped by MaxCatchup:
	// only the pause must skip none.)
	if info.NextFireAt == nil || !info.NextFireAt.After(env.Now()) || info.CatchupSkipped != before.CatchupSkipped {
		t.Fatalf("after the resume: next tick %v (the Env's time %v), %d skipped (%d before the pause); want a tick "+
			"to come, none skipped", info.NextFireAt, env.Now(), info.CatchupSkipped, before.CatchupSkipped)
	}
	time.Sleep(300 * time.Millisecond) // a tick of the pause would fire now
	if n := runs(); n != 1 {
		t.Fatalf("%d runs after the resume, want 1 (no tick of the pause)", n)
	}
}
