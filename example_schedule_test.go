package kagzi_test

import (
	"context"
	"fmt"
	"time"

	"github.com/kagzi/kagzi"
)

type ReportConfig struct {
	Teams []string `json:"teams"`
}

// GenerateReport is the workflow the schedule below starts every morning.
var GenerateReport = kagzi.Define("generate-report", func(ctx *kagzi.Context, cfg ReportConfig) (string, error) {
	return kagzi.Step(ctx, "render", func(context.Context) (string, error) {
		return fmt.Sprintf("report for %v", cfg.Teams), nil
	})
})

func ExampleClient_CreateSchedule() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Every worker also fires due schedules; Postgres makes sure that each tick
	// starts exactly one run, however many processes run workers.
	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, GenerateReport)
	go worker.Run(ctx)

	schedule, err := client.CreateSchedule(ctx, kagzi.Schedule{
		ID:           "daily-report",
		WorkflowType: GenerateReport.Name(),
		Cron:         "0 6 * * *", // 06:00 every day…
		TimeZone:     "America/New_York",
		Input:        ReportConfig{Teams: []string{"ops"}},
		MaxCatchup:   7,                 // after downtime, fire the last 7 missed mornings
		Overlap:      kagzi.OverlapSkip, // never two reports at once
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ny, _ := time.LoadLocation("America/New_York")
	fmt.Println("next fire at", schedule.NextFireAt.In(ny).Format("15:04"), "New York time")

	// Fire one now, on top of the cron ticks.
	run, _ := client.TriggerSchedule(ctx, "daily-report")
	out, _ := run.Wait(ctx) // the output as JSON: the run was started by name
	fmt.Println(string(out))

	runs, _ := client.ListRuns(ctx, kagzi.RunFilter{ScheduleID: "daily-report"})
	fmt.Println("runs of the schedule:", len(runs.Runs))

	// A bad cron expression or time zone is rejected, and nothing is written.
	_, err = client.CreateSchedule(ctx, kagzi.Schedule{ID: "broken", WorkflowType: "x", Cron: "0 25 * * *"})
	fmt.Println(err)
	// Output:
	// next fire at 06:00 New York time
	// "report for [ops]"
	// runs of the schedule: 1
	// kagzi: invalid argument: schedule "broken": cron expression "0 25 * * *": end of range (25) above maximum (23): 25
}
