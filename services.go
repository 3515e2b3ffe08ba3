package kagzi

import (
	"context"
	"sync"
)

// A service is one of a worker's background loops: it runs until its context ends.
type service struct {
	name string
	run  func(ctx context.Context)
}

// services runs a worker's background loops, each on its own goroutine with its own
// context, and stops them in the reverse order of their start: what starts first
// (the committers, which every write of the others goes through) stops last.
type services struct {
	stops []func()
}

// start runs s until parent ends or stop is called. It returns a function that
// stops s alone, earlier than the others, and waits for it (stop does not stop
// it twice).
func (ss *services) start(parent context.Context, s service) (stop func()) {
	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.run(ctx)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	ss.stops = append(ss.stops, stop)
	return stop
}

// stop stops every service, the last started first, each waited for before the next.
func (ss *services) stop() {
	for i := len(ss.stops) - 1; i >= 0; i-- {
		ss.stops[i]()
	}
	ss.stops = nil
}
