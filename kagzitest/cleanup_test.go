package kagzitest_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/kagzitest"
)

var greeter = kagzi.Define("greeter", func(ctx *kagzi.Context, name string) (string, error) {
	return kagzi.Step(ctx, "greet", func(context.Context) (string, error) { return "hello " + name, nil })
})

// kagziGoroutines returns the stacks of the process's goroutines that run Kagzi's
// code, the tests' own left out.
func kagziGoroutines() []string {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	for n == len(buf) {
		buf = make([]byte, 2*len(buf))
		n = runtime.Stack(buf, true)
	}
	var found []string
	for g := range strings.SplitSeq(string(buf[:n]), "\n\n") {
		if strings.Contains(g, "github.com/kagzi/kagzi") && !strings.Contains(g, "kagzitest_test.") {
			found = append(found, g)
		}
	}
	return found
}

// listeners counts the goroutines in a client's LISTEN loop, each of which holds (or
// retries to open) a connection outside the pool.
func listeners(stacks []string) int {
	n := 0
	for _, g := range stacks {
		if strings.Contains(g, "internal/notifier.(*Notifier).listen(") {
			n++
		}
	}
	return n
}

// Found from outside: each Env's client went on listening after the test, for the
// 30 seconds a client's connection lingers, retrying against the database the Env
// had dropped. Not parallel: it looks at the process's goroutines, while the
// parallel tests wait for the sequential ones to end.
func TestAnEnvsCleanupLeavesNoListenerNorAnyOtherGoroutineOfKagziBehind(t *testing.T) {
	if left := kagziGoroutines(); len(left) > 0 {
		t.Fatalf("Kagzi's goroutines run before the Env, the test cannot tell the Env's:\n%s", strings.Join(left, "\n\n"))
	}
	t.Run("env", func(t *testing.T) {
		env := kagzitest.New(t, greeter)
		if out, err := kagzitest.Run(env, greeter, "you"); err != nil || out != "hello you" {
			t.Fatalf("got %q, %v", out, err)
		}
		// Concurrent starts, which share commits through goroutines of the client's.
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() {
				if _, err := kagzi.Start(context.Background(), env.Client, greeter, fmt.Sprint(i)); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if n := listeners(kagziGoroutines()); n == 0 {
			t.Fatal("no listener goroutine while the Env runs: the test cannot see one left behind")
		}
	})
	if left := kagziGoroutines(); len(left) > 0 {
		t.Fatalf("%d goroutines of Kagzi (%d listening) left after the Env's cleanup:\n%s",
			len(left), listeners(left), strings.Join(left, "\n\n"))
	}
}
