package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

// maxAllPages bounds --all: at most this many pages of the given size.
const maxAllPages = 1000

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func (a *app) runsList(ctx context.Context, args []string) error {
	fs := a.flagSet("runs list")
	ff := registerRunFilter(fs)
	all := fs.Bool("all", false, "follow every page")
	if _, err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	f, err := ff.filter()
	if err != nil {
		return err
	}
	pool, client, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()

	var runs []kagzi.RunInfo
	next := ""
	for range maxAllPages {
		page, err := client.ListRuns(ctx, f)
		if err != nil {
			return refusedUnasked(fs.Name(), pool, err)
		}
		runs = append(runs, page.Runs...)
		next = page.NextPageToken
		if !*all || next == "" {
			break
		}
		f.PageToken = next
	}
	if a.json {
		out := struct {
			Runs          []runJSON `json:"runs"`
			NextPageToken string    `json:"next_page_token,omitempty"`
		}{Runs: []runJSON{}, NextPageToken: next}
		for i := range runs {
			out.Runs = append(out.Runs, runOf(&runs[i]))
		}
		return a.printJSON(out)
	}
	t := newTable(a.stdout, "RUN ID", "WORKFLOW ID", "TYPE", "STATUS", "ATTEMPT", "CREATED", "FINISHED", "ERROR")
	for _, r := range runs {
		t.row(r.RunID, short(r.WorkflowID, 40), r.WorkflowType, string(r.Status), fmt.Sprint(r.Attempt),
			when(r.CreatedAt), whenp(r.FinishedAt), short(detail(r.Error), 60))
	}
	t.flush()
	if next != "" {
		fmt.Fprintf(a.stderr, "more runs: --page-token %s\n", next)
	}
	return nil
}

func (a *app) runsShow(ctx context.Context, args []string) error {
	fs := a.flagSet("runs show")
	wfID := fs.String("workflow-id", "", "show the run of this workflow id instead")
	pos, err := a.parse(fs, args, 0, 1)
	if err != nil {
		return err
	}
	if (len(pos) == 1) == (*wfID != "") {
		return usagef("runs show takes a run id or --workflow-id, one of them")
	}
	pool, client, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	var run *kagzi.RunInfo
	if *wfID != "" {
		// A workflow id that is no valid name is a usage error; a run id that names no
		// run, malformed or unknown, is a failure (see the docs).
		run, err = client.GetRunByWorkflowID(ctx, *wfID)
		err = refusedUnasked(fs.Name(), pool, err)
	} else {
		run, err = client.GetRun(ctx, pos[0])
	}
	if err != nil {
		return notFound(err, "no such run in namespace "+a.namespace)
	}
	steps, err := client.ListSteps(ctx, run.RunID)
	if err != nil {
		return err
	}
	if a.json {
		out := struct {
			Run   runJSON    `json:"run"`
			Steps []stepJSON `json:"steps"`
		}{Run: runOf(run), Steps: []stepJSON{}}
		for i := range steps {
			out.Steps = append(out.Steps, stepOf(&steps[i]))
		}
		return a.printJSON(out)
	}
	a.printRun(run)
	a.printSteps(steps)
	return nil
}

// printRun prints a run's facts, one per line.
func (a *app) printRun(run *kagzi.RunInfo) {
	kv := newTable(a.stdout)
	kv.row("Run:", run.RunID)
	kv.row("Workflow ID:", run.WorkflowID)
	kv.row("Type:", run.WorkflowType)
	if run.Version != "" {
		kv.row("Version:", run.Version)
	}
	kv.row("Namespace:", run.Namespace)
	status := string(run.Status)
	if run.CancelRequested && !run.Status.Terminal() {
		status += " (cancel requested)"
	}
	kv.row("Status:", status)
	kv.row("Attempt:", fmt.Sprint(run.Attempt))
	if run.Takeovers > 0 {
		kv.row("Takeovers:", fmt.Sprintf("%d (taken over after its worker lost the lease)", run.Takeovers))
	}
	kv.row("Created:", when(run.CreatedAt))
	kv.row("Started:", whenp(run.StartedAt))
	kv.row("Finished:", whenp(run.FinishedAt))
	if run.ForkedFromRunID != "" {
		kv.row("Forked from:", run.ForkedFromRunID+" (at step "+run.ForkedFromStep+")")
	}
	if run.ContinuedFromRunID != "" {
		kv.row("Continued from:", run.ContinuedFromRunID)
	}
	if run.ContinuedAsRunID != "" {
		kv.row("Continued as:", run.ContinuedAsRunID+" (the run that took over its workflow id)")
	}
	if run.Priority != 0 {
		kv.row("Priority:", fmt.Sprint(run.Priority))
	}
	if run.ConcurrencyKey != "" {
		kv.row("Concurrency key:", run.ConcurrencyKey)
	}
	if run.DebounceKey != "" {
		kv.row("Debounce key:", run.DebounceKey)
	}
	switch run.Status {
	case kagzi.StatusPending, kagzi.StatusSleeping:
		kv.row("Next claim:", when(run.AvailableAt))
		if run.Hold != nil {
			kv.row("Held:", holdOf(run.Hold).String())
		}
	case kagzi.StatusRunning:
		kv.row("Worker:", run.LockedBy+" (lease until "+when(run.AvailableAt)+")")
	}
	if run.Deadline != nil {
		kv.row("Deadline:", whenp(run.Deadline))
	}
	if run.ScheduleID != "" {
		kv.row("Schedule:", run.ScheduleID+" (tick "+whenp(run.ScheduleTick)+")")
	}
	if run.ParentRunID != "" {
		kv.row("Parent:", run.ParentRunID+" (step "+run.ParentStepKey+")")
	}
	if len(run.Attributes) > 0 {
		b, _ := json.Marshal(run.Attributes)
		kv.row("Attributes:", short(string(b), 200))
	}
	kv.row("Input:", short(string(run.Input), 200))
	if len(run.Output) > 0 {
		kv.row("Output:", short(string(run.Output), 200))
	}
	if run.Error != nil {
		kv.row("Error:", run.Error.String())
	}
	kv.flush()
}

// printSteps prints a run's step timeline: each step, and each attempt of a step that
// failed at least once.
func (a *app) printSteps(steps []kagzi.StepInfo) {
	w := a.stdout
	fmt.Fprintf(w, "\nSteps (%d):\n", len(steps))
	if len(steps) == 0 {
		fmt.Fprintln(w, "  none recorded")
		return
	}
	t := newTable(w, "  STEP", "KIND", "STATUS", "STARTED", "DURATION", "DETAIL")
	for _, s := range steps {
		var started string
		var took string
		if n := len(s.Attempts); n > 0 {
			started = whenMilli(s.Attempts[0].StartedAt)
			took = duration(s.Attempts[n-1].FinishedAt.Sub(s.Attempts[0].StartedAt))
		} else {
			started = whenMilli(s.CreatedAt)
		}
		var info string
		switch {
		case s.Kind == kagzi.KindSleep && s.WakeAt != nil:
			info = "wakes " + whenMilli(*s.WakeAt)
		case s.Error != nil:
			info = detail(s.Error)
		case len(s.Output) > 0:
			info = "output " + short(string(s.Output), 60)
		}
		t.row("  "+s.Key, string(s.Kind), string(s.Status), started, orDash(took), info)
		if len(s.Attempts) > 1 || (len(s.Attempts) == 1 && s.Attempts[0].Status != kagzi.StepCompleted) {
			for _, at := range s.Attempts {
				t.row(fmt.Sprintf("    attempt %d", at.Number), "", string(at.Status), whenMilli(at.StartedAt),
					duration(at.FinishedAt.Sub(at.StartedAt)), detail(at.Error))
			}
		}
	}
	t.flush()
}

func (a *app) runsCancel(ctx context.Context, args []string) error {
	fs := a.flagSet("runs cancel")
	pos, err := a.parse(fs, args, 1, 1)
	if err != nil {
		return err
	}
	pool, client, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := client.Cancel(ctx, pos[0]); err != nil {
		if errors.Is(err, kagzi.ErrRunFinished) {
			return fmt.Errorf("run %s already finished; nothing changed", pos[0])
		}
		return notFound(err, "no such run in namespace "+a.namespace)
	}
	run, err := client.GetRun(ctx, pos[0])
	if err != nil {
		return err
	}
	if a.json {
		return a.printJSON(runOf(run))
	}
	if run.Status == kagzi.StatusCancelled {
		fmt.Fprintf(a.stdout, "run %s CANCELLED\n", run.RunID)
	} else {
		fmt.Fprintf(a.stdout, "run %s is %s: cancel requested; its worker will end it CANCELLED\n", run.RunID, run.Status)
	}
	return nil
}

func (a *app) runsRerun(ctx context.Context, args []string) error {
	fs := a.flagSet("runs rerun")
	pos, err := a.parse(fs, args, 1, 1)
	if err != nil {
		return err
	}
	pool, client, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := client.Rerun(ctx, pos[0]); err != nil {
		return notFound(err, "no such run in namespace "+a.namespace)
	}
	run, err := client.GetRun(ctx, pos[0])
	if err != nil {
		return err
	}
	if a.json {
		return a.printJSON(runOf(run))
	}
	fmt.Fprintf(a.stdout, "run %s rerun (attempt %d, now %s); its completed steps will replay\n", run.RunID, run.Attempt, run.Status)
	return nil
}

func (a *app) runsFork(ctx context.Context, args []string) error {
	fs := a.flagSet("runs fork")
	input := fs.String("input", "", "the fork's input as JSON (default: the origin's)")
	pos, err := a.parse(fs, args, 2, 2)
	if err != nil {
		return err
	}
	var opts kagzi.ForkOptions
	if *input != "" {
		if !json.Valid([]byte(*input)) {
			return usagef("--input is not valid JSON")
		}
		opts.Input = json.RawMessage(*input)
	}
	pool, client, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	fork, err := client.Fork(ctx, pos[0], pos[1], opts)
	if err != nil {
		return notFound(err, "no such run in namespace "+a.namespace)
	}
	run, err := client.GetRun(ctx, fork.RunID)
	if err != nil {
		return err
	}
	if a.json {
		return a.printJSON(runOf(run))
	}
	fmt.Fprintf(a.stdout, "forked run %s from %s at step %s\n", run.RunID, pos[0], pos[1])
	return nil
}

// runFilterFlags are the flags of runs list that make its kagzi.RunFilter.
type runFilterFlags struct {
	statuses, types, wfID, prefix, schedule, parent, errorCode, after, before, token *string
	rootOnly, oldestFirst, payloads                                                  *bool
	limit                                                                            *int
	attrs                                                                            map[string]any
}

func registerRunFilter(fs *flag.FlagSet) *runFilterFlags {
	ff := &runFilterFlags{
		statuses:    fs.String("status", "", "statuses, comma-separated (PENDING,RUNNING,SLEEPING,COMPLETED,FAILED,CANCELLED)"),
		types:       workflowTypeFlag(fs, "workflow types, comma-separated"),
		wfID:        fs.String("workflow-id", "", "workflow id"),
		prefix:      fs.String("workflow-id-prefix", "", "workflow ids starting with this"),
		schedule:    fs.String("schedule", "", "schedule id"),
		parent:      fs.String("parent", "", "the children of this run id"),
		rootOnly:    fs.Bool("root-only", false, "runs that are no run's child"),
		errorCode:   fs.String("error-code", "", "FAILED runs whose error has this code"),
		after:       fs.String("created-after", "", "RFC 3339 time"),
		before:      fs.String("created-before", "", "RFC 3339 time"),
		oldestFirst: fs.Bool("oldest-first", false, "oldest runs first"),
		payloads:    fs.Bool("payloads", false, "include each run's input and output (JSON)"),
		limit:       fs.Int("limit", 50, "runs per page (1..1000)"),
		token:       fs.String("page-token", "", "continue a listing"),
		attrs:       map[string]any{},
	}
	fs.Func("attr", "key=value: runs whose attributes hold it (repeatable; value as JSON when it parses, else a string)",
		func(kv string) error {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return fmt.Errorf("want key=value, got %q", kv)
			}
			var value any = v
			if json.Valid([]byte(v)) {
				value = json.RawMessage(v) // as given: a 19-digit id would not survive a float64
			}
			ff.attrs[k] = value
			return nil
		})
	return ff
}

// filter is the kagzi.RunFilter the flags ask for.
func (ff *runFilterFlags) filter() (kagzi.RunFilter, error) {
	f := kagzi.RunFilter{WorkflowTypes: splitList(*ff.types), WorkflowID: *ff.wfID, WorkflowIDPrefix: *ff.prefix,
		ScheduleID: *ff.schedule, ParentRunID: *ff.parent, RootOnly: *ff.rootOnly, ErrorCode: *ff.errorCode,
		OldestFirst: *ff.oldestFirst, IncludePayloads: *ff.payloads, PageToken: *ff.token}
	var err error
	if f.PageSize, err = pageSize(*ff.limit); err != nil {
		return kagzi.RunFilter{}, err
	}
	if len(ff.attrs) > 0 {
		f.Attributes = ff.attrs
	}
	for _, s := range splitList(*ff.statuses) {
		st := kagzi.RunStatus(strings.ToUpper(s))
		if !slices.Contains(runStatuses, st) {
			return f, usagef("--status: unknown run status %q (want %s)", s, joinStatuses(runStatuses))
		}
		f.Statuses = append(f.Statuses, st)
	}
	if f.ParentRunID != "" {
		if _, err := uuid.Parse(f.ParentRunID); err != nil {
			return f, usagef("--parent: run id %q is not a UUID", f.ParentRunID)
		}
		if f.RootOnly {
			return f, usagef("--root-only and --parent exclude each other: a child is no root")
		}
	}
	for _, tf := range []struct {
		flag, val string
		dst       *time.Time
	}{{"--created-after", *ff.after, &f.CreatedAfter}, {"--created-before", *ff.before, &f.CreatedBefore}} {
		if tf.val == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, tf.val)
		if err != nil {
			return f, usagef("%s: %v", tf.flag, err)
		}
		*tf.dst = t
	}
	return f, nil
}

// runStatuses are the statuses --status takes.
var runStatuses = []kagzi.RunStatus{kagzi.StatusPending, kagzi.StatusRunning, kagzi.StatusSleeping,
	kagzi.StatusCompleted, kagzi.StatusFailed, kagzi.StatusCancelled}

func joinStatuses[S ~string](all []S) string {
	names := make([]string, len(all))
	for i, s := range all {
		names[i] = string(s)
	}
	return strings.Join(names, ",")
}

// refusedUnasked makes err a usage error (exit 2) when the library refused the
// command's flags as invalid before it asked the database anything (the pool never
// gave out a connection): a malformed --page-token, a workflow type or id that is
// no valid name, and the like. An error the database answered stays a failure
// (exit 1).
func refusedUnasked(cmd string, pool *pgxpool.Pool, err error) error {
	if errors.Is(err, kagzi.ErrInvalidArgument) && pool.Stat().AcquireCount() == 0 {
		return usagef("%s: %s", cmd, strings.TrimPrefix(err.Error(), "kagzi: "))
	}
	return err
}

// notFound rewords ErrNotFound for people; other errors pass.
func notFound(err error, msg string) error {
	if errors.Is(err, kagzi.ErrNotFound) {
		return fmt.Errorf("%s (%w)", msg, err)
	}
	return err
}
