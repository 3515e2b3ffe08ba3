package gopool

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// goroutineID returns the id of the calling goroutine.
func goroutineID() uint64 {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	buf = bytes.TrimPrefix(buf, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(buf[:bytes.IndexByte(buf, ' ')]), 10, 64)
	return id
}

// runOn runs f through the pool and returns the id of the goroutine it ran on.
func runOn(p *Pool, f func()) uint64 {
	ids := make(chan uint64, 1)
	p.Go(func() {
		defer func() { ids <- goroutineID() }()
		f()
	})
	return <-ids
}

// waitIdle waits until n goroutines of the pool wait for work.
func waitIdle(t *testing.T, p *Pool, n int32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p.idling.Load() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines wait for work, want %d", p.idling.Load(), n)
		}
		runtime.Gosched()
	}
}

func TestFunctionsRunOneAfterAnotherReuseTheGoroutineLeftIdle(t *testing.T) {
	p := New(time.Minute)
	defer p.Close()
	const n = 50
	ids := map[uint64]bool{}
	for range n {
		ids[runOn(p, func() {})] = true
		waitIdle(t, p, int32(p.spawned.Load())) // all of them
		time.Sleep(time.Millisecond)            // into its wait for work
	}
	// A goroutine counts itself idle just before it waits: a function handed over in
	// that instant gets a new one. Without reuse, each function would.
	if s := p.spawned.Load(); s > n/10 || len(ids) != int(s) {
		t.Fatalf("%d functions run one after another started %d goroutines (%d seen), want at most %d",
			n, s, len(ids), n/10)
	}
}

func TestBusyGoroutinesDoNotHoldBackNewFunctions(t *testing.T) {
	p := New(time.Minute)
	defer p.Close()
	release := make(chan struct{})
	started := make(chan struct{}, 3)
	for range 3 {
		p.Go(func() {
			started <- struct{}{}
			<-release
		})
	}
	for range 3 {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("a function waited for another to return")
		}
	}
	close(release)
}

func TestAFunctionThatEndsItsGoroutineDoesNotStopThePool(t *testing.T) {
	p := New(time.Minute)
	defer p.Close()
	exited := runOn(p, runtime.Goexit)
	if next := runOn(p, func() {}); next == exited {
		t.Fatalf("ran on goroutine %d, which had exited", next)
	}
}

func TestIdleGoroutinesExitAfterTheIdleTimeAndOnClose(t *testing.T) {
	for _, c := range []struct {
		name  string
		idle  time.Duration
		close bool
	}{{"idle time", 10 * time.Millisecond, false}, {"close", time.Hour, true}} {
		t.Run(c.name, func(t *testing.T) {
			p := New(c.idle)
			defer p.Close()
			before := runtime.NumGoroutine()
			runOn(p, func() {})
			if c.close {
				p.Close()
			}
			deadline := time.Now().Add(10 * time.Second)
			for runtime.NumGoroutine() > before {
				if time.Now().After(deadline) {
					t.Fatalf("%d goroutines, want %d: the idle one did not exit", runtime.NumGoroutine(), before)
				}
				time.Sleep(time.Millisecond)
			}
			if id := runOn(p, func() {}); id == 0 {
				t.Fatal("no goroutine ran the function after the idle one exited")
			}
		})
	}
}

// deep uses about n KB of stack.
//
//go:noinline
func deep(n int) byte {
	var frame [1 << 10]byte
	frame[n%len(frame)] = byte(n)
	if n <= 1 {
		return frame[0]
	}
	return deep(n-1) + frame[n%len(frame)]
}

// BenchmarkDeepRunsBetweenCollections runs, per op, 100 functions that need 16 KB (or
// 24 KB) of stack at once on the pool's goroutines, then collects garbage (a busy
// worker collects tens of times a second): a goroutine waiting in a shallow frame had
// its stack halved at each collection and grown again by copying at its next run. The
// reserve under the functions keeps stacks for functions of up to 24 KB; the 24 KB
// case shows the edge, where the stack is grown again at each run (before the reserve
// moved under the functions it kept up to 32 KB, and cleared 8 KB at each wait).
func BenchmarkDeepRunsBetweenCollections(b *testing.B) {
	for _, kb := range []int{16, 24} {
		b.Run(strconv.Itoa(kb)+"KB", func(b *testing.B) {
			p := New(time.Minute)
			defer p.Close()
			var wg sync.WaitGroup
			for range b.N {
				for range 100 {
					wg.Add(1)
					p.Go(func() { deep(kb); wg.Done() })
				}
				wg.Wait()
				runtime.GC()
			}
		})
	}
}
