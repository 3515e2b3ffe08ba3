package main

import (
	"context"
	"fmt"

	"github.com/kagzi/kagzi"
)

func (a *app) schedulesList(ctx context.Context, args []string) error {
	fs := a.flagSet("schedules list")
	typ := workflowTypeFlag(fs, "keep the schedules of this workflow type")
	paused := fs.Bool("paused", false, "keep paused schedules only")
	active := fs.Bool("active", false, "keep active schedules only")
	limit := fs.Int("limit", 50, "schedules per page (1..1000)")
	token := fs.String("page-token", "", "continue a listing")
	if _, err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	size, err := pageSize(*limit)
	if err != nil {
		return err
	}
	f := kagzi.ScheduleFilter{WorkflowType: *typ, PageSize: size, PageToken: *token}
	switch {
	case *paused && *active:
		return usagef("schedules list: --paused and --active exclude each other")
	case *paused:
		f.Paused = paused
	case *active:
		no := false
		f.Paused = &no
	}
	pool, client, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	page, err := client.ListSchedules(ctx, f)
	if err != nil {
		return refusedUnasked(fs.Name(), pool, err)
	}
	if a.json {
		out := struct {
			Schedules     []kagzi.ScheduleInfo `json:"schedules"`
			NextPageToken string               `json:"next_page_token,omitempty"`
		}{Schedules: []kagzi.ScheduleInfo{}, NextPageToken: page.NextPageToken}
		for i := range page.Schedules {
			out.Schedules = append(out.Schedules, scheduleOf(&page.Schedules[i]))
		}
		return a.printJSON(out)
	}
	t := newTable(a.stdout, "SCHEDULE ID", "WORKFLOW", "CRON", "TIME ZONE", "STATE", "OVERLAP", "NEXT FIRE", "LAST FIRED", "LAST RUN")
	for _, s := range page.Schedules {
		t.row(s.ID, s.WorkflowType, s.Cron, s.TimeZone, state(s.Paused), s.Overlap.String(), whenp(s.NextFireAt),
			whenp(s.LastFiredAt), orDash(s.LastRunID))
	}
	t.flush()
	if page.NextPageToken != "" {
		fmt.Fprintf(a.stderr, "more schedules: --page-token %s\n", page.NextPageToken)
	}
	return nil
}

func state(paused bool) string {
	if paused {
		return "PAUSED"
	}
	return "ACTIVE"
}

// scheduleAction runs schedules show, pause, resume and trigger.
func (a *app) scheduleAction(ctx context.Context, action string, args []string) error {
	fs := a.flagSet("schedules " + action)
	pos, err := a.parse(fs, args, 1, 1)
	if err != nil {
		return err
	}
	id := pos[0]
	pool, client, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	missing := "no such schedule in namespace " + a.namespace
	switch action {
	case "pause":
		err = client.PauseSchedule(ctx, id)
	case "resume":
		err = client.ResumeSchedule(ctx, id)
	case "trigger":
		run, err := client.TriggerSchedule(ctx, id)
		if err != nil {
			return notFound(refusedUnasked(fs.Name(), pool, err), missing)
		}
		if a.json {
			return a.printJSON(map[string]string{"schedule_id": id, "run_id": run.RunID, "workflow_id": run.WorkflowID,
				"workflow_type": run.WorkflowType})
		}
		fmt.Fprintf(a.stdout, "schedule %s triggered: run %s (workflow id %s)\n", id, run.RunID, run.WorkflowID)
		return nil
	}
	if err != nil {
		return notFound(refusedUnasked(fs.Name(), pool, err), missing)
	}
	s, err := client.GetSchedule(ctx, id)
	if err != nil {
		// An id that is no valid name is a usage error (exit 2), refused before asking.
		return notFound(refusedUnasked(fs.Name(), pool, err), missing)
	}
	if a.json {
		return a.printJSON(scheduleOf(s))
	}
	if action != "show" {
		fmt.Fprintf(a.stdout, "schedule %s %s\n", id, state(s.Paused))
		return nil
	}
	kv := newTable(a.stdout)
	kv.row("Schedule:", s.ID)
	kv.row("Namespace:", s.Namespace)
	kv.row("Workflow type:", s.WorkflowType)
	cron := s.Cron
	if s.Seconds {
		cron += " (with seconds)"
	}
	kv.row("Cron:", cron)
	kv.row("Time zone:", s.TimeZone)
	kv.row("State:", state(s.Paused))
	kv.row("Overlap:", s.Overlap.String())
	kv.row("Max catch-up:", fmt.Sprint(s.MaxCatchup))
	kv.row("Next fire:", whenp(s.NextFireAt))
	kv.row("Last fired:", whenp(s.LastFiredAt))
	kv.row("Last run:", orDash(s.LastRunID))
	if s.BufferedTick != nil {
		kv.row("Buffered tick:", whenp(s.BufferedTick))
	}
	kv.row("Skipped:", fmt.Sprintf("%d by catch-up, %d by overlap", s.CatchupSkipped, s.OverlapSkipped))
	kv.row("Input:", short(string(s.Input), 200))
	kv.row("Created:", when(s.CreatedAt))
	kv.row("Updated:", when(s.UpdatedAt))
	kv.flush()
	return nil
}
