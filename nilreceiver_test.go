package kagzi_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi"
)

// callEveryMethod calls each exported method of recv with zero arguments (a live
// context for a context.Context; a nil transaction, refused after the receiver) and
// returns, by method name, what it returned or
// that it panicked.
func callEveryMethod(recv any) map[string][]reflect.Value {
	got := map[string][]reflect.Value{}
	v := reflect.ValueOf(recv)
	ctxType := reflect.TypeFor[context.Context]()
	for i := range v.NumMethod() {
		m, name := v.Method(i), v.Type().Method(i).Name
		n := m.Type().NumIn()
		if m.Type().IsVariadic() {
			n-- // no options
		}
		args := make([]reflect.Value, n)
		for j := range n {
			if in := m.Type().In(j); in == ctxType {
				args[j] = reflect.ValueOf(context.Background())
			} else {
				args[j] = reflect.Zero(in)
			}
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					got[name] = []reflect.Value{reflect.ValueOf(panicked{r})}
				}
			}()
			got[name] = m.Call(args)
		}()
	}
	return got
}

// panicked is what a method that panicked returned, for callEveryMethod.
type panicked struct{ value any }

// fakeTx is a transaction that is not nil, for the calls that must refuse their
// client before they use it.
type fakeTx struct{ pgx.Tx }

// Found from outside: a nil or zero Client's methods panicked (Start only refused a
// nil one, and took a zero one for a client with a payload limit of 0 bytes), as did
// Run of a nil or zero Worker. Every method that can fail refuses them with
// ErrInvalidArgument saying to use NewClient or NewWorker; the others return their
// zero value. No database: nothing is sent.
func TestEveryMethodOfANilOrZeroClientOrWorkerRefusesItWithErrInvalidArgument(t *testing.T) {
	errorType := reflect.TypeFor[error]()
	for recvName, recv := range map[string]any{
		"nil Client": (*kagzi.Client)(nil), "zero Client": &kagzi.Client{},
		"nil Worker": (*kagzi.Worker)(nil), "zero Worker": &kagzi.Worker{},
	} {
		for method, out := range callEveryMethod(recv) {
			if len(out) == 1 && out[0].Type() == reflect.TypeFor[panicked]() {
				t.Errorf("%s.%s panicked: %v", recvName, method, out[0].Interface().(panicked).value)
				continue
			}
			if len(out) > 0 && out[len(out)-1].Type() == errorType {
				err, _ := out[len(out)-1].Interface().(error)
				if !errors.Is(err, kagzi.ErrInvalidArgument) || !strings.Contains(err.Error(), "nil or zero") {
					t.Errorf("%s.%s: %v, want ErrInvalidArgument for a nil or zero receiver", recvName, method, err)
				}
			}
			if method == "Health" {
				if h := out[0].Interface().(*kagzi.HealthReport); h.Healthy() || !strings.Contains(h.DatabaseError, "NewClient") {
					t.Errorf("%s.Health: %+v, want an unhealthy report saying to use NewClient", recvName, h)
				}
			}
		}
	}

	ctx := context.Background()
	wf := kagzi.Define("nil-client", func(ctx *kagzi.Context, n int) (int, error) { return n, nil })
	const runID = "01a21d53-9c23-72e7-9c0c-fce735a95203"
	for name, c := range map[string]*kagzi.Client{"nil Client": nil, "zero Client": {}} {
		for call, err := range map[string]error{
			"Start":         func() error { _, err := kagzi.Start(ctx, c, wf, 1); return err }(),
			"StartTx":       func() error { _, err := kagzi.StartTx(ctx, fakeTx{}, c, wf, 1); return err }(),
			"StartMany":     func() error { _, err := kagzi.StartMany(ctx, c, wf, []int{1}); return err }(),
			"NewWorker":     func() error { _, err := kagzi.NewWorker(c, kagzi.WorkerConfig{}, wf); return err }(),
			"RunOf.Wait":    func() error { _, err := kagzi.RunOf[int](c, runID).Wait(ctx); return err }(),
			"RunOfWorkflow": func() error { _, err := kagzi.RunOfWorkflow[int](ctx, c, "order-1"); return err }(),
			"GetEvent":      func() error { _, err := kagzi.GetEvent[json.RawMessage](ctx, c, runID, "e"); return err }(),
			"WaitEvent":     func() error { _, err := kagzi.WaitEvent[json.RawMessage](ctx, c, runID, "e", 0); return err }(),
		} {
			if !errors.Is(err, kagzi.ErrInvalidArgument) || !strings.Contains(err.Error(), "nil or zero") {
				t.Errorf("%s with a %s: %v, want ErrInvalidArgument for a nil or zero Client", call, name, err)
			}
		}
	}
}
