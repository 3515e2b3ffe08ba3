// Package gopool runs functions on goroutines that stay for the next function.
//
// A worker runs each claimed run on goroutines of its own. New goroutines start with
// a small stack, and a workflow's call depth (the step, the JSON codec, pgx) grows it
// by copying, several times, for every run: a few percent of a busy worker's CPU. A
// kept goroutine keeps its grown stack for the next run.
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
	var idle *time.Timer
	for {
		f()
		if idle == nil {
			idle = time.NewTimer(p.idle)
		} else {
			idle.Reset(p.idle)
		}
		p.idling.Add(1)
		select {
		case f = <-p.work:
			p.idling.Add(-1)
		case <-idle.C:
			p.idling.Add(-1)
			return
		case <-p.closed:
			p.idling.Add(-1)
			idle.Stop()
			return
		}
	}
}
