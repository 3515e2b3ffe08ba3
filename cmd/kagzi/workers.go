package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kagzi/kagzi"
)

// workerStatuses are the statuses --status takes.
var workerStatuses = []kagzi.WorkerStatus{kagzi.WorkerOnline, kagzi.WorkerDraining, kagzi.WorkerOffline}

func (a *app) workersList(ctx context.Context, args []string) error {
	fs := a.flagSet("workers list")
	statuses := fs.String("status", "", "statuses, comma-separated (ONLINE,DRAINING,OFFLINE)")
	typ := workflowTypeFlag(fs, "keep the workers that registered this workflow type")
	limit := fs.Int("limit", 50, "workers per page (1..1000)")
	token := fs.String("page-token", "", "continue a listing")
	if _, err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	size, err := pageSize(*limit)
	if err != nil {
		return err
	}
	f := kagzi.WorkerFilter{WorkflowType: *typ, PageSize: size, PageToken: *token}
	for _, s := range splitList(*statuses) {
		st := kagzi.WorkerStatus(strings.ToUpper(s))
		if !slices.Contains(workerStatuses, st) {
			return usagef("--status: unknown worker status %q (want %s)", s, joinStatuses(workerStatuses))
		}
		f.Statuses = append(f.Statuses, st)
	}
	pool, client, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	page, err := client.ListWorkers(ctx, f)
	if err != nil {
		return refusedUnasked(fs.Name(), pool, err)
	}
	if a.json {
		out := struct {
			Workers       []workerJSON `json:"workers"`
			NextPageToken string       `json:"next_page_token,omitempty"`
		}{Workers: []workerJSON{}, NextPageToken: page.NextPageToken}
		for i := range page.Workers {
			out.Workers = append(out.Workers, workerOf(&page.Workers[i]))
		}
		return a.printJSON(out)
	}
	t := newTable(a.stdout, "WORKER ID", "STATUS", "HOST", "PID", "VERSION", "TYPES", "ACTIVE", "COMPLETED",
		"FAILED", "LAST HEARTBEAT", "LABELS")
	for _, w := range page.Workers {
		beat := when(w.LastHeartbeatAt)
		if w.Status != kagzi.WorkerOffline && !w.LastHeartbeatAt.IsZero() {
			beat += fmt.Sprintf(" (%s ago)", time.Since(w.LastHeartbeatAt).Round(time.Second))
		}
		t.row(w.ID, string(w.Status), w.Hostname, fmt.Sprint(w.PID), w.Version,
			short(strings.Join(w.WorkflowTypes, ","), 40), fmt.Sprintf("%d/%d", w.ActiveRuns, w.MaxConcurrent),
			fmt.Sprint(w.CompletedTotal), fmt.Sprint(w.FailedTotal), beat, orDash(labels(w.Labels)))
	}
	t.flush()
	if page.NextPageToken != "" {
		fmt.Fprintf(a.stderr, "more workers: --page-token %s\n", page.NextPageToken)
	}
	return nil
}
