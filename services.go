package kagzi

import "context"

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

// start runs s until parent ends or stop is called.
func (ss *services) start(parent context.Context, s service) {
	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.run(ctx)
	}()
	ss.stops = append(ss.stops, func() {
		cancel()
		<-done
	})
}

// stop stops every service, the last started first, each waited for before the next.
func (ss *services) stop() {
	for i := len(ss.stops) - 1; i >= 0; i-- {
		ss.stops[i]()
	}
	ss.stops = nil
}
