package kagzi_test

import (
	"errors"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

func TestListSignalsAndEventsPageThroughARunsSignalsAndEventsAndStayInTheNamespace(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("inbox", func(ctx *kagzi.Context, _ int) (string, error) {
		for _, k := range []string{"a", "b", "c"} {
			if err := ctx.SetEvent(k, k+"!"); err != nil {
				return "", err
			}
		}
		return kagzi.WaitSignal[string](ctx, "go", time.Minute)
	})
	run, err := kagzi.Start(ctx, e.client, wf, 0)
	if err != nil {
		t.Fatal(err)
	}
	// All three before the worker runs: with it running, the run could take "go" and
	// finish before the last one was sent (ErrRunFinished, seen once under load).
	for _, name := range []string{"other", "go", "other"} {
		if err := e.client.Signal(ctx, run.RunID, name, name); err != nil {
			t.Fatal(err)
		}
	}
	runWorker(t, e.client, fastWorker(), wf)
	if _, err := run.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	first, err := e.client.ListSignals(ctx, run.RunID, kagzi.ListOptions{PageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	rest, err := e.client.ListSignals(ctx, run.RunID, kagzi.ListOptions{PageSize: 2, PageToken: first.NextPageToken})
	if err != nil {
		t.Fatal(err)
	}
	all := append(first.Signals, rest.Signals...)
	if len(all) != 3 || rest.NextPageToken != "" || all[1].Name != "go" || all[1].ConsumedBy != "go#1" ||
		all[0].ConsumedBy != "" || string(all[2].Payload) != `"other"` {
		t.Fatalf("signals %+v (next %q)", all, rest.NextPageToken)
	}
	events, err := e.client.ListEvents(ctx, run.RunID, kagzi.ListOptions{PageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	more, err := e.client.ListEvents(ctx, run.RunID, kagzi.ListOptions{PageToken: events.NextPageToken})
	if err != nil {
		t.Fatal(err)
	}
	if len(events.Events) != 2 || len(more.Events) != 1 || more.Events[0].Key != "c" || string(more.Events[0].Value) != `"c!"` {
		t.Fatalf("events %+v then %+v", events, more)
	}
	other := newClient(t, e.pool, "elsewhere")
	if _, err := other.ListSignals(ctx, run.RunID, kagzi.ListOptions{}); !errors.Is(err, kagzi.ErrNotFound) {
		t.Fatalf("signals of another namespace's run: %v, want ErrNotFound", err)
	}
	if _, err := other.ListEvents(ctx, run.RunID, kagzi.ListOptions{}); !errors.Is(err, kagzi.ErrNotFound) {
		t.Fatalf("events of another namespace's run: %v, want ErrNotFound", err)
	}
}
