package kagzi_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kagzi/kagzi"
)

// bookTrip books a flight, a hotel and a car, and undoes what it booked when a
// booking fails. cancelHotel is the hotel's compensation.
func bookTrip(cancelHotel func(context.Context) error) *kagzi.Workflow[string, string] {
	book := func(what string, err error) func(context.Context) (string, error) {
		return func(context.Context) (string, error) {
			if err != nil {
				return "", err
			}
			fmt.Println("booked", what)
			return what + "-42", nil
		}
	}
	return kagzi.Define("book-trip", func(ctx *kagzi.Context, traveller string) (string, error) {
		saga := kagzi.NewSaga(ctx)
		flight, err := kagzi.Step(ctx, "book-flight", book("flight", nil))
		if err != nil {
			return "", saga.Compensate(err) // nothing booked yet: nothing to undo
		}
		// Registered once the booking completed; a replay registers it again.
		err = saga.Add("cancel-flight", func(context.Context) error {
			fmt.Println("cancelled", flight)
			return nil
		}, kagzi.WithRetry(kagzi.Forever().Initial(10*time.Millisecond))) // compensations deserve patience
		if err != nil {
			return "", err
		}
		if _, err := kagzi.Step(ctx, "book-hotel", book("hotel", nil)); err != nil {
			return "", saga.Compensate(err)
		}
		if err := saga.Add("cancel-hotel", cancelHotel, kagzi.WithRetry(kagzi.Linear(2, 10*time.Millisecond))); err != nil {
			return "", err
		}
		noCars := &kagzi.Error{Code: "no_cars", Message: "no car left", NonRetryable: true}
		if _, err := kagzi.Step(ctx, "book-car", book("car", noCars)); err != nil {
			return "", saga.Compensate(err) // cancel-hotel, then cancel-flight
		}
		return "trip booked for " + traveller, nil
	})
}

func ExampleSaga() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	trip := bookTrip(func(context.Context) error {
		fmt.Println("cancelled hotel-42")
		return nil
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, trip)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, trip, "ada")
	_, err := run.Wait(ctx)
	// The run failed with the failure that started the compensation, not retried.
	var wfErr *kagzi.WorkflowError
	if errors.As(err, &wfErr) {
		fmt.Println(wfErr.Detail, "| non-retryable:", wfErr.Detail.NonRetryable)
		fmt.Println("compensated:", wfErr.Detail.Metadata["compensated"])
	}
	// Each compensation is a step of its own, recorded like any other.
	steps, _ := client.ListSteps(ctx, run.RunID)
	for _, s := range steps {
		fmt.Println(s.Key, s.Status)
	}
	// Output:
	// booked flight
	// booked hotel
	// cancelled hotel-42
	// cancelled flight-42
	// no_cars in book-car#1: no car left | non-retryable: true
	// compensated: ["cancel-hotel","cancel-flight"]
	// book-flight#1 COMPLETED
	// book-hotel#1 COMPLETED
	// book-car#1 FAILED
	// compensate/cancel-hotel#1 COMPLETED
	// compensate/cancel-flight#1 COMPLETED
}

func ExampleSagaError() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The hotel's compensation fails for good (2 attempts); the flight's still runs.
	trip := bookTrip(func(context.Context) error {
		return &kagzi.Error{Code: "hotel_unreachable", Message: "the hotel does not answer"}
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, trip)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, trip, "ada")
	_, err := run.Wait(ctx)
	fmt.Println(errors.Is(err, kagzi.ErrCompensationFailed), kagzi.ErrorCode(err))
	var wfErr *kagzi.WorkflowError
	if errors.As(err, &wfErr) {
		d := wfErr.Detail
		fmt.Println("subject:", d.Subject)
		fmt.Println("cause:", d.Metadata["cause_code"], "in", d.Metadata["cause_subject"])
		fmt.Println("failed:", d.Metadata["failed"], "compensated:", d.Metadata["compensated"])
	}
	// Output:
	// booked flight
	// booked hotel
	// cancelled flight-42
	// true COMPENSATION_FAILED
	// subject: compensate/cancel-hotel#1
	// cause: no_cars in book-car#1
	// failed: ["cancel-hotel"] compensated: ["cancel-flight"]
}

// Inside the workflow, Compensate's *SagaError tells the cause and how each
// compensation went; errors.As finds the cause's *StepError.
func ExampleSaga_Compensate() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	transfer := kagzi.Define("transfer", func(ctx *kagzi.Context, amount int) (string, error) {
		saga := kagzi.NewSaga(ctx)
		if _, err := kagzi.Step(ctx, "debit", func(context.Context) (int, error) { return amount, nil }); err != nil {
			return "", saga.Compensate(err)
		}
		if err := saga.Add("refund", func(context.Context) error { return nil }); err != nil {
			return "", err
		}
		_, err := kagzi.Step(ctx, "credit", func(context.Context) (int, error) {
			return 0, kagzi.NonRetryable(errors.New("account closed"))
		})
		if err == nil {
			return "done", nil
		}
		err = saga.Compensate(err)
		var se *kagzi.SagaError
		var stepErr *kagzi.StepError
		if errors.As(err, &se) && errors.As(err, &stepErr) {
			return fmt.Sprintf("%s failed (%s); compensated %v, %d failed",
				stepErr.Key, stepErr.Detail.Message, se.Compensated, len(se.Failed)), nil
		}
		return "", err
	})
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, transfer)
	go worker.Run(ctx)

	run, _ := kagzi.Start(ctx, client, transfer, 100)
	out, _ := run.Wait(ctx)
	fmt.Println(out)
	// Output:
	// credit#1 failed (account closed); compensated [refund], 0 failed
}
