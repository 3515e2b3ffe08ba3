package main

import (
	"context"
	"fmt"
	"time"

	"github.com/kagzi/kagzi"
)

// limits runs "kagzi limits list|get|set|delete".
func (a *app) limits(ctx context.Context, sub string, args []string) error {
	switch sub {
	case "list":
		return a.limitsList(ctx, args)
	case "get", "show":
		return a.limitsGet(ctx, args)
	case "set":
		return a.limitsSet(ctx, args)
	case "delete":
		return a.limitsDelete(ctx, args)
	}
	return usagef("limits: want list, get, set or delete, got %q", sub)
}

func (a *app) limitsList(ctx context.Context, args []string) error {
	fs := a.flagSet("limits list")
	if _, err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	pool, client, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	all, err := client.ListLimits(ctx)
	if err != nil {
		return err
	}
	if a.json {
		out := struct {
			Limits []kagzi.Limits `json:"limits"`
		}{Limits: []kagzi.Limits{}}
		for i := range all {
			out.Limits = append(out.Limits, limitsOf(&all[i]))
		}
		return a.printJSON(out)
	}
	a.printLimits(all...)
	return nil
}

func (a *app) limitsGet(ctx context.Context, args []string) error {
	fs := a.flagSet("limits get")
	pos, err := a.parse(fs, args, 1, 1)
	if err != nil {
		return err
	}
	pool, client, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	l, err := client.GetLimits(ctx, pos[0])
	if err != nil {
		// A TYPE that is no valid name is a usage error (exit 2), refused before asking.
		return notFound(refusedUnasked(fs.Name(), pool, err), "workflow type "+pos[0]+" has no limits in namespace "+a.namespace)
	}
	if a.json {
		return a.printJSON(limitsOf(l))
	}
	a.printLimits(*l)
	return nil
}

func (a *app) limitsSet(ctx context.Context, args []string) error {
	fs := a.flagSet("limits set")
	var l kagzi.Limits
	fs.IntVar(&l.Concurrency, "concurrency", 0, "most runs of the type executing at once")
	fs.IntVar(&l.KeyConcurrency, "key-concurrency", 0, "most runs of one concurrency key started and not finished")
	fs.IntVar(&l.Rate, "rate", 0, "most runs of the type beginning to execute per --rate-period")
	fs.DurationVar(&l.RatePeriod, "rate-period", 0, "the period of --rate (e.g. 1s, 1m)")
	fs.IntVar(&l.KeyRate, "key-rate", 0, "most runs of one key first starting per --key-rate-period")
	fs.DurationVar(&l.KeyRatePeriod, "key-rate-period", 0, "the period of --key-rate")
	pos, err := a.parse(fs, args, 1, 1)
	if err != nil {
		return err
	}
	l.WorkflowType = pos[0]
	pool, client, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	set, err := client.SetLimits(ctx, l)
	if err != nil {
		// A TYPE that is no valid name, or a limit the library refuses before asking
		// (a negative one, a rate without its period), is a usage error (exit 2).
		return refusedUnasked(fs.Name(), pool, err)
	}
	if a.json {
		return a.printJSON(limitsOf(set))
	}
	a.printLimits(*set)
	return nil
}

func (a *app) limitsDelete(ctx context.Context, args []string) error {
	fs := a.flagSet("limits delete")
	pos, err := a.parse(fs, args, 1, 1)
	if err != nil {
		return err
	}
	pool, client, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := client.DeleteLimits(ctx, pos[0]); err != nil {
		// A TYPE that is no valid name is a usage error (exit 2), refused before asking.
		return notFound(refusedUnasked(fs.Name(), pool, err), "workflow type "+pos[0]+" has no limits in namespace "+a.namespace)
	}
	if a.json {
		return a.printJSON(struct {
			Deleted string `json:"deleted"`
		}{pos[0]})
	}
	fmt.Fprintf(a.stdout, "limits of %s deleted\n", pos[0])
	return nil
}

func (a *app) printLimits(all ...kagzi.Limits) {
	t := newTable(a.stdout, "WORKFLOW TYPE", "CONCURRENCY", "KEY CONCURRENCY", "RATE", "KEY RATE", "UPDATED")
	for _, l := range all {
		t.row(l.WorkflowType, count(l.Concurrency), count(l.KeyConcurrency), rate(l.Rate, l.RatePeriod),
			rate(l.KeyRate, l.KeyRatePeriod), when(l.UpdatedAt))
	}
	t.flush()
}

func count(n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

func rate(n int, per time.Duration) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%d/%v", n, per)
}
