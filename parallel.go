package kagzi

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
)

// kindBranch is the kind of a Go or Map item's call: it takes a position, but records
// no step of its own.
const kindBranch StepKind = "BRANCH"

// Future is the result of a branch started with Go. Get waits for it.
type Future[T any] struct {
	parent *Context
	done   chan struct{}
	out    T
	err    error
	// unwound: the branch's goroutine was unwound (the run is stopping here); Get
	// unwinds its caller too.
	unwound bool
}

// Go runs fn as a branch of the workflow, concurrently with the code that called it,
// and returns a Future for its result. Inside fn, Step, Sleep and further Go calls
// work as in the workflow function; their keys carry this call's key as a prefix
// ("fetch#1/get-user#1"), so they depend on call positions only, never on which
// branch finishes first. On a replay, completed steps inside the branch return their
// recorded outputs and only the unfinished ones run.
//
// While any branch runs, the run cannot be released: sleeps and retry backoffs wait
// in process. Call Get on every Future before the workflow function returns (the
// run's context is cancelled when it returns). Call Go and Get from the workflow
// function's goroutine or from a branch's, like Step.
func Go[T any](ctx *Context, name string, fn func(ctx *Context) (T, error)) *Future[T] {
	f := &Future[T]{parent: ctx, done: make(chan struct{})}
	key, pos, err := ctx.nextKey(name, kindBranch)
	if err == nil && fn == nil {
		err = invalidArgument("branch %q: nil function", name)
	}
	if err != nil {
		f.err = err
		close(f.done)
		return f
	}
	branch := ctx.branch(key, pos)
	go f.run(branch, fn)
	return f
}

// branch returns a Context for a branch whose keys are prefixed with key, started by
// the call at position pos of c's scope.
func (c *Context) branch(key string, pos int) *Context {
	bctx, cancel := context.WithCancelCause(c.Context)
	c.x.branches.Add(1)
	return &Context{Context: bctx, x: c.x, sc: &scope{prefix: key + "/", branch: true,
		counts: map[string]int{}, cancel: cancel, parent: c.sc, at: pos}}
}

func (f *Future[T]) run(branch *Context, fn func(*Context) (T, error)) {
	returned := false
	defer func() {
		if r := recover(); r != nil {
			f.err, returned = &panicError{value: r, stack: string(debug.Stack())}, true
		}
		if !returned {
			switch {
			case branch.x.ctx.Err() == nil && branch.Err() != nil:
				f.err = context.Cause(branch) // cancelled by a failed sibling: an error, not an unwind
			case branch.x.ctx.Err() == nil && branch.x.exitReason() == exitNone:
				// Unwound, and not by the engine (which records why first): the branch,
				// or a step body on its goroutine, called runtime.Goexit. A failure
				// of the branch, as a panic is.
				f.err = goexited(branch.x.goexitWhere())
			default:
				f.unwound = true
			}
		}
		branch.sc.ended.Store(true)
		branch.sc.cancel(nil)
		branch.x.branches.Add(-1)
		close(f.done)
	}()
	f.out, f.err = fn(branch)
	returned = true
}

// Get waits for the branch and returns its result. When the branch was unwound (the
// run was cancelled, lost its lease, passed its deadline, or the worker is shutting
// down), Get unwinds its caller too and does not return. A nil or zero Future (one
// Go did not return) is ErrInvalidArgument.
func (f *Future[T]) Get() (T, error) {
	if f == nil || f.done == nil {
		// Not made by Go: nothing would ever complete it.
		var zero T
		return zero, invalidArgument("Future.Get on a Future that Go did not return")
	}
	<-f.done
	if f.unwound {
		f.parent.checkAlive()
		f.parent.stop(f.parent.x.exitReason())
	}
	return f.out, f.err
}

// MapOption configures Map.
type MapOption func(*mapOptions)

type mapOptions struct {
	limit      int
	collectAll bool
}

// DefaultMapParallelism is how many items Map runs at once unless MaxParallel says otherwise.
const DefaultMapParallelism = 32

// MaxParallel bounds how many items Map runs at once (default DefaultMapParallelism).
func MaxParallel(n int) MapOption { return func(o *mapOptions) { o.limit = n } }

// CollectAll makes Map run every item even when some fail, and return all the
// results with a *ParallelError listing the failures. By default Map fails fast:
// the first error cancels the items still running (their interrupted attempts are
// not recorded) and is returned.
func CollectAll() MapOption { return func(o *mapOptions) { o.collectAll = true } }

// ParallelError reports the items of a Map that failed, by index.
type ParallelError struct {
	Errors map[int]error
}

// Error lists the failed items.
func (e *ParallelError) Error() string {
	return fmt.Sprintf("kagzi: %d parallel item(s) failed; first: %v", len(e.Errors), e.first())
}

// Unwrap returns the items' errors, for errors.Is and errors.As.
func (e *ParallelError) Unwrap() []error {
	errs := make([]error, 0, len(e.Errors))
	for _, i := range slices.Sorted(maps.Keys(e.Errors)) {
		errs = append(errs, e.Errors[i])
	}
	return errs
}

func (e *ParallelError) first() error {
	if errs := e.Unwrap(); len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// Map runs fn for every item as a branch (see Go), at most MaxParallel at once, and
// returns the outputs in the items' order. Item i's keys are prefixed with its own
// key ("resize#3/..."), taken in the items' order before any item starts. A replay
// after a crash runs only the items' steps that had not completed.
//
// By default the first error cancels the items still running and is returned
// (fail-fast); with CollectAll every item runs and the failures come back in a
// *ParallelError.
func Map[In, Out any](ctx *Context, name string, items []In, fn func(ctx *Context, item In) (Out, error), opts ...MapOption) ([]Out, error) {
	if err := ctx.usable("Map", name); err != nil {
		return nil, err
	}
	o := mapOptions{limit: DefaultMapParallelism}
	for _, opt := range opts {
		if opt == nil {
			return nil, invalidArgument("map %q: nil MapOption", name)
		}
		opt(&o)
	}
	if o.limit < 1 {
		return nil, invalidArgument("map %q: MaxParallel %d; it must be at least 1", name, o.limit)
	}
	if fn == nil {
		return nil, invalidArgument("map %q: nil function", name)
	}
	keys := make([]string, len(items))
	positions := make([]int, len(items))
	for i := range items {
		key, pos, err := ctx.nextKey(name, kindBranch)
		if err != nil {
			return nil, err
		}
		keys[i], positions[i] = key, pos
	}
	m := &mapping{sem: make(chan struct{}, o.limit), failFast: !o.collectAll}
	futures := make([]*Future[Out], len(items))
	for i, item := range items {
		futures[i] = &Future[Out]{parent: ctx, done: make(chan struct{})}
		branch := m.add(ctx.branch(keys[i], positions[i]))
		go m.runItem(branch, func() {
			futures[i].run(branch, func(c *Context) (Out, error) {
				c.checkAlive() // cancelled while waiting for a slot
				out, err := fn(c, item)
				if err != nil {
					m.fail(c)
				}
				return out, err
			})
		})
	}
	return mapResults(futures, o.collectAll)
}

// mapping is what the branches of one Map share: the slots (MaxParallel) and, to
// fail fast, every branch, so that the first failure cancels the others.
type mapping struct {
	sem      chan struct{}
	failFast bool
	mu       sync.Mutex
	branches []*Context
	failed   bool
}

func (m *mapping) add(branch *Context) *Context {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.branches = append(m.branches, branch)
	return branch
}

// runItem runs an item's branch once a slot is free, or at once when the branch is
// cancelled while it waits (it then stops at once).
func (m *mapping) runItem(branch *Context, run func()) {
	select {
	case m.sem <- struct{}{}:
		defer func() { <-m.sem }()
	case <-branch.Done():
	}
	run()
}

// fail cancels every other branch after the first failure, when the Map fails fast.
func (m *mapping) fail(c *Context) {
	if !m.failFast {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failed {
		return
	}
	m.failed = true
	for _, b := range m.branches {
		if b != c {
			b.sc.cancel(errBranchCancelled)
		}
	}
}

// mapResults waits for every item and returns the outputs in order, with the first
// error (by index) that is not a cancel by a sibling, or with every error collected.
func mapResults[Out any](futures []*Future[Out], collectAll bool) ([]Out, error) {
	outs := make([]Out, len(futures))
	var first error
	firstIndex := len(futures)
	perr := &ParallelError{Errors: map[int]error{}}
	for i, f := range futures {
		out, err := f.Get()
		outs[i] = out
		if err == nil {
			continue
		}
		perr.Errors[i] = err
		if !errors.Is(err, errBranchCancelled) && i < firstIndex {
			first, firstIndex = err, i
		}
	}
	switch {
	case len(perr.Errors) == 0:
		return outs, nil
	case collectAll:
		return outs, perr
	case first == nil:
		return outs, perr.first()
	}
	return outs, first
}

// Race runs the functions concurrently as one step and returns the first success; the
// others' contexts are cancelled and their results discarded. When all fail, the step
// fails with their errors joined (and is retried per its policy, unless one of them is
// NonRetryable, which the joined error then is). The winner's output is recorded as the
// step's, so a replay returns the same winner.
func Race[T any](ctx *Context, name string, fns []func(context.Context) (T, error), opts ...StepOption) (T, error) {
	if len(fns) == 0 {
		var zero T
		return zero, invalidArgument("race %q: no functions", name)
	}
	if i := slices.IndexFunc(fns, func(f func(context.Context) (T, error)) bool { return f == nil }); i >= 0 {
		var zero T
		return zero, invalidArgument("race %q: function %d is nil", name, i)
	}
	return Step(ctx, name, func(c context.Context) (T, error) {
		rctx, cancel := context.WithCancel(c)
		defer cancel()
		type result struct {
			out T
			err error
		}
		results := make(chan result, len(fns))
		for i, fn := range fns {
			go func() {
				sent := false
				defer func() {
					if r := recover(); r != nil {
						results <- result{err: fmt.Errorf("racer %d: %w", i, &panicError{value: r, stack: string(debug.Stack())})}
					} else if !sent {
						results <- result{err: fmt.Errorf("racer %d: %w", i, goexited("a racer"))}
					}
				}()
				out, err := fn(rctx)
				if err != nil {
					err = fmt.Errorf("racer %s: %w", strconv.Itoa(i), err)
				}
				sent = true
				results <- result{out, err}
			}()
		}
		var errs []error
		for range fns {
			r := <-results
			if r.err == nil {
				return r.out, nil
			}
			errs = append(errs, r.err)
		}
		var zero T
		return zero, errors.Join(errs...)
	}, opts...)
}
