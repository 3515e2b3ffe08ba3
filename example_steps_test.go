package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kagzi/kagzi"
)

func ExampleStep() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var calls atomic.Int32
	countdown := kagzi.Define("countdown", func(ctx *kagzi.Context, from int) ([]string, error) {
		var lines []string
		for i := from; i > 0; i-- {
			// The same name in a loop: keys "say#1", "say#2", ...
			line, err := kagzi.Step(ctx, "say", func(context.Context) (string, error) {
				calls.Add(1)
				return fmt.Sprint(i), nil
			})
			if err != nil {
				return nil, err
			}
			lines = append(lines, line)
		}
		// A sleep longer than MaxInProcessSleep releases the run; when it resumes, the
		// function runs again from the top and the steps above replay their outputs.
		if err := ctx.Sleep("pause", 300*time.Millisecond); err != nil {
			return nil, err
		}
		return append(lines, "liftoff"), nil
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, countdown)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, countdown, 3)
	out, _ := run.Wait(ctx)
	fmt.Println(out, "step bodies ran:", calls.Load())
	steps, _ := client.ListSteps(ctx, run.RunID)
	for _, s := range steps {
		fmt.Println(s.Key, s.Kind, s.Status)
	}
	// Output:
	// [3 2 1 liftoff] step bodies ran: 3
	// say#1 STEP COMPLETED
	// say#2 STEP COMPLETED
	// say#3 STEP COMPLETED
	// pause#1 SLEEP COMPLETED
}

func ExampleStep_retry() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var calls atomic.Int32
	fetch := kagzi.Define("fetch-rates", func(ctx *kagzi.Context, _ struct{}) (string, error) {
		return kagzi.Step(ctx, "call-api", func(context.Context) (string, error) {
			if calls.Add(1) < 3 {
				return "", errors.New("503 Service Unavailable")
			}
			return "EUR 1.08", nil
		}, kagzi.WithRetry(kagzi.Linear(5, 10*time.Millisecond))) // up to 5 attempts, 10ms apart
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, fetch)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, fetch, struct{}{})
	out, err := run.Wait(ctx)
	fmt.Println(out, err)

	// Every attempt is recorded, with its error.
	steps, _ := client.ListSteps(ctx, run.RunID)
	for _, a := range steps[0].Attempts {
		if a.Error != nil {
			fmt.Println(steps[0].Key, "attempt", a.Number, a.Status, a.Error.Message)
		} else {
			fmt.Println(steps[0].Key, "attempt", a.Number, a.Status)
		}
	}
	// Output:
	// EUR 1.08 <nil>
	// call-api#1 attempt 1 FAILED 503 Service Unavailable
	// call-api#1 attempt 2 FAILED 503 Service Unavailable
	// call-api#1 attempt 3 COMPLETED
}

func ExampleWithStepTimeout() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	lookup := kagzi.Define("lookup", func(ctx *kagzi.Context, _ struct{}) (string, error) {
		_, err := kagzi.Step(ctx, "slow-service", func(ctx context.Context) (string, error) {
			select { // a well-behaved step gives up when its context ends
			case <-time.After(time.Minute):
				return "answer", nil
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}, kagzi.WithStepTimeout(50*time.Millisecond), kagzi.WithRetry(kagzi.NoRetry()))
		if errors.Is(err, kagzi.ErrDeadlineExceeded) {
			return "fallback answer", nil
		}
		return "", err
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, lookup)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, lookup, struct{}{})
	out, _ := run.Wait(ctx)
	fmt.Println(out)
	steps, _ := client.ListSteps(ctx, run.RunID)
	a := steps[0].Attempts[0]
	fmt.Println(steps[0].Key, steps[0].Status, "attempt", a.Number, a.Status, a.Error.Code)
	// Output:
	// fallback answer
	// slow-service#1 FAILED attempt 1 TIMED_OUT DEADLINE_EXCEEDED
}

func ExampleExponential() {
	// 5 attempts in all: waits of 1s, 2s, 4s, 8s (capped at 30s), each spread by ±20%;
	// an error whose code is card_declined fails the step at once.
	charge := kagzi.Exponential(5).Initial(time.Second).Max(30 * time.Second).Jitter(0.2).NonRetryable("card_declined")
	fmt.Println(charge, "| valid:", charge.Err() == nil)

	// An invalid policy is rejected by the call that receives it (Step, Start of a
	// workflow defined with it, NewWorker) before anything runs.
	bad := kagzi.Exponential(3).Max(time.Second).Initial(time.Minute)
	fmt.Println(errors.Is(bad.Err(), kagzi.ErrInvalidArgument))

	fmt.Println(kagzi.DefaultRetry)
	fmt.Println(kagzi.Forever().MaxAttempts(), kagzi.NoRetry().MaxAttempts())
	// Output:
	// 5 attempts, 1s×2 up to 30s, jitter 0.2 | valid: true
	// true
	// 3 attempts, 1s×2 up to 5m0s, jitter 0.2
	// 0 1
}

func ExampleLinear() {
	// 4 attempts, 10 minutes apart, without jitter: a wait longer than the default
	// 5-minute cap raises the cap. While it waits, the run holds no worker slot.
	fmt.Println(kagzi.Linear(4, 10*time.Minute))
	// Output:
	// 4 attempts, 10m0s×1 up to 10m0s, jitter 0
}

func ExampleNonRetryable() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var calls atomic.Int32
	validate := kagzi.Define("validate-card", func(ctx *kagzi.Context, number string) (string, error) {
		return kagzi.Step(ctx, "check", func(context.Context) (string, error) {
			calls.Add(1)
			if len(number) != 16 {
				// Another attempt cannot fix this: fail now, not after the policy's 3.
				return "", kagzi.NonRetryable(fmt.Errorf("card number has %d digits", len(number)))
			}
			return "ok", nil
		})
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, validate)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, validate, "4111")
	_, err := run.Wait(ctx)
	fmt.Println(errors.Is(err, kagzi.ErrWorkflowFailed), errors.Is(err, kagzi.ErrNonRetryable), "attempts:", calls.Load())
	var wfErr *kagzi.WorkflowError
	if errors.As(err, &wfErr) {
		fmt.Println(wfErr.Detail) // the step's recorded detail, unchanged
	}
	// Output:
	// true true attempts: 1
	// STEP_ERROR in check#1: card number has 4 digits
}

func ExampleError() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var calls atomic.Int32
	pay := kagzi.Define("pay", func(ctx *kagzi.Context, amount int) (string, error) {
		_, err := kagzi.Step(ctx, "charge", func(context.Context) (string, error) {
			if calls.Add(1) == 1 {
				// A rate limit: wait as long as the provider says, not the policy's backoff.
				return "", kagzi.RetryAfter(errors.New("429 Too Many Requests"), 20*time.Millisecond)
			}
			// *kagzi.Error sets the recorded code, message and metadata.
			return "", &kagzi.Error{Code: "card_declined", Message: "the card was declined",
				Metadata: map[string]string{"decline_code": "insufficient_funds"}}
		}, kagzi.WithRetry(kagzi.Exponential(5).NonRetryable("card_declined")))

		// Branch on the recorded code: a replay returns the same error, rebuilt from
		// the record, not the Go error the step function returned.
		if kagzi.ErrorCode(err) == "card_declined" {
			return "asked the customer for another card", nil
		}
		return "paid", err
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, pay)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, pay, 100)
	out, _ := run.Wait(ctx)
	fmt.Println(out)
	steps, _ := client.ListSteps(ctx, run.RunID)
	for _, a := range steps[0].Attempts {
		fmt.Println("attempt", a.Number, a.Status, a.Error)
	}
	fmt.Println(steps[0].Error.Metadata["decline_code"])
	// Output:
	// asked the customer for another card
	// attempt 1 FAILED STEP_ERROR in charge#1: 429 Too Many Requests
	// attempt 2 FAILED card_declined in charge#1: the card was declined
	// insufficient_funds
}

func ExampleStepError() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	sync := kagzi.Define("sync-crm", func(ctx *kagzi.Context, _ struct{}) (string, error) {
		_, err := kagzi.Step(ctx, "push", func(context.Context) (int, error) {
			return 0, errors.New("connection reset by peer")
		}, kagzi.WithRetry(kagzi.Linear(2, 10*time.Millisecond)))
		var se *kagzi.StepError // the step failed for good
		if errors.As(err, &se) {
			return fmt.Sprintf("%s failed after %d attempts: %s", se.Key, se.Attempts, se.Detail.Message), nil
		}
		return "pushed", err
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, sync)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, sync, struct{}{})
	out, _ := run.Wait(ctx)
	fmt.Println(out)
	// Output:
	// push#1 failed after 2 attempts: connection reset by peer
}

func ExampleContext_Sleep() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	reminder := kagzi.Define("reminder", func(ctx *kagzi.Context, who string) (string, error) {
		// Durable: the wake time is recorded, the run holds no worker slot while it
		// sleeps, and any worker resumes it at the wake time, even after a restart.
		if err := ctx.Sleep("wait-a-moment", 500*time.Millisecond); err != nil {
			return "", err
		}
		return kagzi.Step(ctx, "remind", func(context.Context) (string, error) {
			return "reminded " + who, nil
		})
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, reminder)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, reminder, "ada")
	fmt.Println("while asleep:", waitForStatus(ctx, client, run.RunID, kagzi.StatusSleeping))
	out, _ := run.Wait(ctx)
	fmt.Println(out)
	// Output:
	// while asleep: SLEEPING
	// reminded ada
}

func ExampleWithRunTimeout() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	trial := kagzi.Define("trial", func(ctx *kagzi.Context, user string) (string, error) {
		if err := ctx.Sleep("trial-period", 14*24*time.Hour); err != nil {
			return "", err
		}
		return "converted", nil
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, trial)
	go worker.Run(ctx)

	// The clock starts at Start; past it the run fails, whatever it is doing.
	run, _ := kagzi.Start(ctx, client, trial, "ada", kagzi.WithRunTimeout(300*time.Millisecond))
	_, err := run.Wait(ctx)
	fmt.Println(errors.Is(err, kagzi.ErrDeadlineExceeded), kagzi.ErrorCode(err))
	// Output:
	// true DEADLINE_EXCEEDED
}

func ExampleWithWorkflowRetry() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var loads atomic.Int32
	report := kagzi.Define("report", func(ctx *kagzi.Context, _ struct{}) (string, error) {
		rows, err := kagzi.Step(ctx, "load", func(context.Context) (int, error) {
			loads.Add(1)
			return 42, nil
		})
		if err != nil {
			return "", err
		}
		if ctx.Attempt() == 1 {
			// An error of the workflow itself (not a step's): the run is executed again
			// from the top per the workflow's policy, completed steps replayed.
			return "", errors.New("totals do not add up")
		}
		return fmt.Sprintf("%d rows on attempt %d", rows, ctx.Attempt()), nil
	}, kagzi.WithWorkflowRetry(kagzi.Linear(3, 10*time.Millisecond)))
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, report)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, report, struct{}{})
	out, _ := run.Wait(ctx)
	fmt.Println(out, "| the load step ran", loads.Load(), "time")
	// Output:
	// 42 rows on attempt 2 | the load step ran 1 time
}
