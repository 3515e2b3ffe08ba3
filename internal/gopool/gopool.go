// Package gopool runs functions on goroutines that stay for the next function.
//
// A worker runs each claimed run on goroutines of its own. New goroutines start with
// a small stack, and a workflow's call depth (the step, the JSON codec, pgx) grows it
// by copying, several times, for every run: a few percent of a busy worker's CPU. A
// kept goroutine keeps its grown stack for the next run, waiting for it above a deep
// frame (see Pool.wait), so that garbage collections do not shrink it meanwhile: an
// idle goroutine holds up to 32 KB of stack until it exits (and a function that
// needs more than 24 KB still has its stack grown again at each run).
package gopool

import (
	"sync"
	"sync/atomic"
	"time"
)

// Pool hands functions to idle goroutines, starting new ones when none is idle. A
// goroutine idle for longer than the pool's idle time, or when the pool is closed,
// exits. There is no limit on the goroutines: the caller bounds the work.
type Pool struct {
	work chan func()
	idle time.Duration
	// idling counts the goroutines waiting for work; spawned, those started.
	idling  atomic.Int32
	spawned atomic.Int64

	closeOnce sync.Once
	closed    chan struct{}
}

// New returns a pool whose goroutines exit after idle without work.
func New(idle time.Duration) *Pool {
	return &Pool{work: make(chan func()), idle: idle, closed: make(chan struct{})}
}

// Go runs f on an idle goroutine of the pool, or on a new one, and returns at once.
// If f ends its goroutine (runtime.Goexit), the goroutine is not reused.
func (p *Pool) Go(f func()) {
	select {
	case p.work <- f:
	default:
		p.spawned.Add(1)
		go p.run(f)
	}
}

// Close makes idle goroutines exit now, and busy ones when their function returns.
// Go still works after Close, on a new goroutine each time.
func (p *Pool) Close() {
	p.closeOnce.Do(func() { close(p.closed) })
}

func (p *Pool) run(f func()) {
	// The reserve is a frame under every function and every wait of this goroutine
	// (see wait): made once, not zeroed again for each function (8 KB cleared at
	// each hand-off was 5% of a busy worker's CPU).
	var reserve [stackReserve]byte
	keep(&reserve)
	p.loop(f)
}

// loop runs f, then each function handed to this goroutine, until it is to exit.
//
//go:noinline
func (p *Pool) loop(f func()) {
	var idle *time.Timer
	for {
		f()
		if idle == nil {
			idle = time.NewTimer(p.idle)
		} else {
			idle.Reset(p.idle)
		}
		p.idling.Add(1)
		var ok bool
		if f, ok = p.wait(idle); !ok {
			return
		}
	}
}

// stackReserve is the stack under the functions and waits of a goroutine of the pool
// (see wait).
const stackReserve = 8 << 10

// wait waits for the next function (ok false: the goroutine is to exit). The garbage
// collector halves the stack of a goroutine that uses less than a quarter of it, and a
// goroutine waiting in a shallow frame uses almost none: at every collection (tens a
// second on a busy worker) the idle goroutines' grown stacks were halved, and the next
// run grew them again by copying, a tenth of the worker's CPU. A goroutine of the pool
// waits above the stackReserve bytes of run's frame, and so keeps a stack of up to four
// times the reserve.
func (p *Pool) wait(idle *time.Timer) (f func(), ok bool) {
	select {
	case f = <-p.work:
		p.idling.Add(-1)
		return f, true
	case <-idle.C:
		p.idling.Add(-1)
		return nil, false
	case <-p.closed:
		p.idling.Add(-1)
		idle.Stop()
		return nil, false
	}
}

// keep makes the compiler keep a reserve frame it would otherwise drop.
//
//go:noinline
func keep(b *[stackReserve]byte) { b[0] = 1 }
