package kagzitest_test

import (
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
