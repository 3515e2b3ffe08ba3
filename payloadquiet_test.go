package kagzi_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

// recordedErrors keeps the error texts the hooks see at the ends of executions.
type recordedErrors struct {
	kagzi.NopHooks
	mu    sync.Mutex
	texts []string
}

func (r *recordedErrors) ExecutionEnd(_ context.Context, e *kagzi.ExecutionEvent) {
	if e.Error != nil {
		r.mu.Lock()
		r.texts = append(r.texts, e.Error.Message)
		r.mu.Unlock()
	}
}

type dated struct {
	At time.Time `json:"at"`
}

// Payloads are not for error details, which are stored as they are and which hooks and
// spans see: an input or a signal that does not decode into its Go type fails with an
// error that says what did not fit where, without quoting the value (time.Time's parse
// error quoted it, and so did encoding/json's error for a number).
func TestAPayloadThatDoesNotDecodeFailsWithAnErrorThatDoesNotQuoteIt(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	hooks := &recordedErrors{}
	c, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	byInput := kagzi.Define("decodes-input", func(ctx *kagzi.Context, in dated) (int, error) { return 1, nil })
	bySignal := kagzi.Define("decodes-signal", func(ctx *kagzi.Context, _ int) (int, error) {
		at, err := kagzi.WaitSignal[time.Time](ctx, "at", time.Minute)
		return at.Year(), err
	})
	bySize := kagzi.Define("decodes-size", func(ctx *kagzi.Context, in uint8) (int, error) { return int(in), nil })
	runWorker(t, c, fastWorker(), byInput, bySignal, bySize)

	const secret = "4111-1111-1111-1111"
	var runs []string
	r, err := c.StartByName(ctx, byInput.Name(), map[string]string{"at": secret})
	if err != nil {
		t.Fatal(err)
	}
	runs = append(runs, r.RunID)
	r, err = c.StartByName(ctx, bySize.Name(), 41111111)
	if err != nil {
		t.Fatal(err)
	}
	runs = append(runs, r.RunID)
	waiting, err := kagzi.Start(ctx, c, bySignal, 0)
	if err != nil {
		t.Fatal(err)
	}
	runs = append(runs, waiting.RunID)
	if err := c.Signal(ctx, waiting.RunID, "at", secret); err != nil {
		t.Fatal(err)
	}
	for _, id := range runs {
		_, err := kagzi.RunOf[int](c, id).Wait(ctx)
		var we *kagzi.WorkflowError
		if !errors.As(err, &we) {
			t.Fatalf("run %s: %v, want a failure", id, err)
		}
		if strings.Contains(we.Detail.Message, "4111") || !strings.Contains(we.Detail.Message, "does not") {
			t.Errorf("run %s failed with %q: it quotes the payload, or does not say it does not decode", id, we.Detail.Message)
		}
		var stored string
		if err := e.pool.QueryRow(ctx, `SELECT error::text FROM kagzi.runs WHERE run_id = $1`, id).Scan(&stored); err != nil ||
			strings.Contains(stored, "4111") {
			t.Errorf("run %s's stored error quotes the payload: %s (%v)", id, stored, err)
		}
	}
	hooks.mu.Lock()
	defer hooks.mu.Unlock()
	for _, text := range hooks.texts {
		if strings.Contains(text, "4111") {
			t.Errorf("a hook saw the payload in an error: %q", text)
		}
	}
}

// email refuses a value without an @, in its own words.
type email string

func (e *email) UnmarshalJSON(b []byte) error {
	if !strings.Contains(string(b), "@") {
		return errors.New("an email address needs an @")
	}
	*e = email(b)
	return nil
}

// The error of an UnmarshalJSON of your own keeps its text: it is yours to keep clean.
func TestAnInputRefusedByItsOwnUnmarshalJSONFailsWithThatErrorsText(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	wf := kagzi.Define("decodes-email", func(ctx *kagzi.Context, in email) (int, error) { return 1, nil })
	runWorker(t, e.client, fastWorker(), wf)
	r, err := e.client.StartByName(ctx, wf.Name(), "nobody")
	if err != nil {
		t.Fatal(err)
	}
	_, err = kagzi.RunOf[int](e.client, r.RunID).Wait(ctx)
	var we *kagzi.WorkflowError
	if !errors.As(err, &we) || !strings.Contains(we.Detail.Message, "an email address needs an @") {
		t.Fatalf("%v, want the input's own error text", err)
	}
}
