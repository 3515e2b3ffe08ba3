package kagzi

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Workflow is a workflow definition: a Go function registered under a name, its
// workflow type. Create one with Define, usually as a package-level variable, then
// start runs of it with Start and run them with a Worker that registers it.
type Workflow[In, Out any] struct {
	name    string
	version string
	fn      func(*Context, In) (Out, error)
	retry   Retry
	err     error
}

// DefineOption configures a workflow definition.
type DefineOption func(*workflowOptions)

type workflowOptions struct {
	retry   Retry
	version string
}

// WithVersion gives the definition a version. A run records the version it started
// with, and a worker claims only runs of the versions it registered, so old and new
// code run side by side during a deploy: the old workers finish the old runs. Without
// it the version is "". Start of a typed workflow records its version; StartByName
// records the version given by WithRunVersion, else the version of the most recently
// started live worker of that type, else none (the first worker to claim the run
// pins its own).
func WithVersion(v string) DefineOption { return func(o *workflowOptions) { o.version = v } }

// WithWorkflowRetry sets the workflow's retry policy. It applies to each of its steps
// that names none, and to the run as a whole: a run whose function returns an error
// (other than a step's final StepError, which had its own attempts) or panics is
// executed again from the top after the policy's backoff, its completed steps
// replayed, until the policy gives up and the run ends FAILED. Without it, the
// worker's DefaultRetry applies, else the library's DefaultRetry.
func WithWorkflowRetry(r Retry) DefineOption { return func(o *workflowOptions) { o.retry = r } }

// Define defines a workflow of the given type name. The input and output are
// stored JSON-encoded, so In and Out must round-trip through encoding/json.
//
// A name that is empty, longer than 255 bytes or contains control characters, or a
// nil fn, makes the definition invalid: Start and NewWorker then return an error
// wrapping ErrInvalidArgument. A Workflow not made by Define (a zero value, such as a
// variable or struct field never assigned Define's result) is refused the same way.
func Define[In, Out any](name string, fn func(ctx *Context, input In) (Out, error), opts ...DefineOption) *Workflow[In, Out] {
	var o workflowOptions
	nilOption := false
	for _, opt := range opts {
		if opt == nil {
			nilOption = true
			continue
		}
		opt(&o)
	}
	w := &Workflow[In, Out]{name: name, fn: fn, retry: o.retry, version: o.version}
	if err := validName("workflow type", name); err != nil {
		w.err = err
	} else if nilOption {
		w.err = invalidArgument("workflow %q: nil DefineOption", name)
	} else if fn == nil {
		w.err = invalidArgument("workflow %q has a nil function", name)
	} else if err := validVersion(o.version); err != nil {
		w.err = fmt.Errorf("workflow %q: %w", name, err)
	} else if err := o.retry.Err(); err != nil {
		w.err = fmt.Errorf("workflow %q: %w", name, err)
	}
	return w
}

// validVersion checks a version (WithVersion, WithRunVersion): at most 255 bytes of
// UTF-8 without control characters; "" is no version.
func validVersion(v string) error {
	if len(v) > 255 || !utf8.ValidString(v) || strings.ContainsFunc(v, unicode.IsControl) {
		return invalidArgument("invalid version %q: at most 255 bytes of UTF-8 without control characters", v)
	}
	return nil
}

// invalid returns why the definition cannot be started or registered (nil: it can):
// a nil *Workflow, a zero Workflow that Define did not make, or what Define found
// wrong. Its errors wrap ErrInvalidArgument.
func (w *Workflow[In, Out]) invalid() error {
	switch {
	case w == nil:
		return invalidArgument("nil workflow")
	case w.err != nil:
		return w.err
	case w.fn == nil: // Define refuses a nil fn in err: this Workflow is a zero value
		return invalidArgument("a zero Workflow, not made by Define: make workflow definitions with Define")
	}
	return nil
}

// Name returns the workflow type.
func (w *Workflow[In, Out]) Name() string { return w.name }

// Version returns the definition's version ("" without WithVersion).
func (w *Workflow[In, Out]) Version() string { return w.version }

// Definition is any workflow defined with Define, whatever its input and output
// types. NewWorker takes a list of them.
type Definition interface {
	// Name returns the workflow type.
	Name() string
	definition() *definition
}

// definition is a workflow with its types erased, as a worker runs it.
type definition struct {
	name    string
	version string
	err     error
	retry   Retry
	// run decodes the input, calls the workflow function and encodes its output.
	run func(ctx *Context, input []byte) ([]byte, error)
}

func (w *Workflow[In, Out]) definition() *definition {
	if err := w.invalid(); err != nil { // a typed nil *Workflow in a Definition, a zero Workflow
		return &definition{err: err}
	}
	return &definition{name: w.name, version: w.version, retry: w.retry, run: func(ctx *Context, input []byte) ([]byte, error) {
		var in In
		if err := unmarshalQuiet(input, &in); err != nil {
			return nil, &detailError{detail: ErrorDetail{
				Code:         CodeInvalidInput,
				NonRetryable: true,
				Subject:      w.name,
				Message: fmt.Sprintf("input of run %s does not decode into %s: %v",
					ctx.RunID(), typeName[In](), err),
			}}
		}
		out, err := w.fn(ctx, in)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(out)
		if err != nil {
			return nil, &detailError{detail: ErrorDetail{
				Code:         CodeInvalidOutput,
				NonRetryable: true,
				Subject:      w.name,
				Message:      fmt.Sprintf("output of run %s (%s) does not encode as JSON: %v", ctx.RunID(), typeName[Out](), err),
			}}
		}
		return b, nil
	}}
}

func typeName[T any]() string {
	return reflect.TypeOf((*T)(nil)).Elem().String()
}
