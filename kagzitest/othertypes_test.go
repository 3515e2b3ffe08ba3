package kagzitest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/kagzitest"
)

// Found from outside: a run of a type no worker of the Env registers (a child another
// service runs, left out of kagzitest.New) is PENDING and due, and the Env counted
// it as claimable for ever: no time was skipped, neither that run's own deadline
// (which fires on a run not yet started) nor another run's sleep, and Wait gave up
// after Options.Timeout.

var otherServiceWorkflow = kagzi.Define("other-service", func(ctx *kagzi.Context, _ int) (int, error) { return 1, nil })

var childWithDeadline = kagzi.Define("child-with-deadline", func(ctx *kagzi.Context, _ int) (int, error) {
	c, err := kagzi.StartChild(ctx, "notify", otherServiceWorkflow, 0, kagzi.WithRunTimeout(time.Hour))
	if err != nil {
		return 0, err
	}
	if _, err := c.Get(); errors.Is(err, kagzi.ErrDeadlineExceeded) {
		return -1, nil // the other service did not answer within the hour
	} else if err != nil {
		return 0, err
	}
	return 1, nil
})

func TestTheDeadlineOfAChildNoWorkerOfTheEnvRunsIsSkippedTo(t *testing.T) {
	t.Parallel()
	env := kagzitest.NewWithOptions(t, kagzitest.Options{Timeout: 10 * time.Second}, childWithDeadline)
	out, err := kagzitest.Run(env, childWithDeadline, 0)
	if err != nil || out != -1 {
		t.Fatalf("got %d, %v; want -1 (the child's 1-hour deadline passed on the Env's clock)", out, err)
	}
}

var fireAndForgetChild = kagzi.Define("fire-and-forget-child", func(ctx *kagzi.Context, _ int) (string, error) {
	if _, err := kagzi.StartChild(ctx, "notify", otherServiceWorkflow, 0); err != nil {
		return "", err
	}
	if err := ctx.Sleep("month", 30*24*time.Hour); err != nil {
		return "", err
	}
	return "slept", nil
})

func TestAPendingRunOfATypeNoWorkerOfTheEnvRunsDoesNotStopItsTime(t *testing.T) {
	t.Parallel()
	env := kagzitest.NewWithOptions(t, kagzitest.Options{Timeout: 10 * time.Second}, fireAndForgetChild)
	out, err := kagzitest.Run(env, fireAndForgetChild, 0)
	if err != nil || out != "slept" {
		t.Fatalf("got %q, %v; want the 30-day sleep skipped", out, err)
	}
}

// Found in review: a run of the Env's type pinned to a version no worker of the Env
// runs is due for ever, and the Env counted it as claimable: no time was skipped.
var versionedSleeper = kagzi.Define("versioned-sleeper", func(ctx *kagzi.Context, _ int) (string, error) {
	if err := ctx.Sleep("month", 30*24*time.Hour); err != nil {
		return "", err
	}
	return "slept", nil
}, kagzi.WithVersion("v2"))

func TestARunPinnedToAVersionNoWorkerRunsDoesNotStopTheEnvsTime(t *testing.T) {
	t.Parallel()
	env := kagzitest.NewWithOptions(t, kagzitest.Options{Timeout: 5 * time.Second}, versionedSleeper)
	ctx := context.Background()
	if _, err := kagzi.Start(ctx, env.Client, versionedSleeper, 0, kagzi.WithRunVersion("v1")); err != nil {
		t.Fatal(err)
	}
	out, err := kagzitest.Run(env, versionedSleeper, 0)
	if err != nil || out != "slept" {
		t.Fatalf("got %q, %v; want the 30-day sleep skipped", out, err)
	}
}

// Found in review of the change above: when the other service's type runs on a worker
// of the test's own (or of a second Env in the namespace), its due child is about to
// be claimed, and the Env must not skip past the child's deadline meanwhile.
var serviceChild = kagzi.Define("service-child", func(ctx *kagzi.Context, _ int) (int, error) { return 1, nil })

var parentOfServiceChild = kagzi.Define("parent-of-service-child", func(ctx *kagzi.Context, _ int) (int, error) {
	c, err := kagzi.StartChild(ctx, "notify", serviceChild, 0, kagzi.WithDelay(time.Minute), kagzi.WithRunTimeout(time.Hour))
	if err != nil {
		return 0, err
	}
	if _, err := c.Get(); errors.Is(err, kagzi.ErrDeadlineExceeded) {
		return -1, nil
	} else if err != nil {
		return 0, err
	}
	return 1, nil
})

func TestADueChildAWorkerOfTheTestRunsIsClaimedBeforeItsDeadlineIsSkippedTo(t *testing.T) {
	env := kagzitest.NewWithOptions(t, kagzitest.Options{Timeout: 10 * time.Second}, parentOfServiceChild)
	w, err := kagzi.NewWorker(env.Client, kagzi.WorkerConfig{ID: "other-service"}, serviceChild)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	bad := 0
	for i := 0; i < 150; i++ {
		out, err := kagzitest.Run(env, parentOfServiceChild, i)
		if err != nil {
			t.Fatal(err)
		}
		if out != 1 {
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("%d of 150 children timed out (the Env skipped an hour while their worker was about to claim them)", bad)
	}
}

func TestADueChildAnotherEnvOfTheNamespaceRunsIsClaimedBeforeItsDeadlineIsSkippedTo(t *testing.T) {
	a := kagzitest.NewWithOptions(t, kagzitest.Options{Timeout: 10 * time.Second}, parentOfServiceChild)
	kagzitest.NewWithOptions(t, kagzitest.Options{Pool: a.Pool, Namespace: a.Client.Namespace()}, serviceChild)
	bad := 0
	for i := 0; i < 150; i++ {
		out, err := kagzitest.Run(a, parentOfServiceChild, i)
		if err != nil {
			t.Fatal(err)
		}
		if out != 1 {
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("%d of 150 children timed out", bad)
	}
}
