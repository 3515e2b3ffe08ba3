package kagziadmin

import (
	"context"
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	adminpb "github.com/kagzi/kagzi/admin/adminpb"
)

// The standard health service's status follows the database and the schema version,
// whoever serves it: Serve checks every health interval; on a server from GRPCServer
// or Register, a Check looks again when the last look is older than the interval,
// and the looks go on every interval while a Watch stream is open.

// healthService is the standard health service with looks made on demand.
type healthService struct {
	*health.Server
	s *Server
}

// Check answers with the status of the last look, looking again first when it is
// older than the health interval.
func (h healthService) Check(ctx context.Context, in *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	// The look is the service's, not the caller's: a probe that gives up sooner (a
	// 1 s probe timeout) or cancels must not record the database as down for everyone.
	h.s.freshHealth(context.WithoutCancel(ctx))
	return h.Server.Check(ctx, in)
}

// Watch streams the status; while any Watch stream is open, the server looks every
// health interval.
func (h healthService) Watch(in *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	h.s.checking.Lock()
	h.s.watchers++
	first := h.s.watchers == 1
	h.s.checking.Unlock()
	defer func() {
		h.s.checking.Lock()
		h.s.watchers--
		h.s.checking.Unlock()
	}()
	if first {
		go h.s.watchHealth(context.Background(), nil, false)
	}
	return h.Server.Watch(in, stream)
}

// freshHealth looks at the database and the schema unless the last look is more
// recent than the health interval.
func (s *Server) freshHealth(ctx context.Context) {
	s.checking.Lock()
	defer s.checking.Unlock()
	if s.shutDown || time.Since(s.checked) < s.opts.healthInterval {
		return
	}
	s.checkHealthLocked(ctx)
}

// resumeHealth makes the health service follow the looks again after Serve shut it
// down, and makes the last look stale.
func (s *Server) resumeHealth() {
	s.checking.Lock()
	defer s.checking.Unlock()
	if s.shutDown {
		s.health.Resume()
		s.shutDown = false
	}
	s.checked = time.Time{}
}

// watchHealth looks every health interval until ctx is done or done is closed:
// Serve's looks (serving), made whether or not the last look is recent; or a Watch
// stream's (done nil), made when the last look is stale, until no stream is open.
func (s *Server) watchHealth(ctx context.Context, done <-chan struct{}, serving bool) {
	t := time.NewTicker(s.opts.healthInterval)
	defer t.Stop()
	for {
		if serving {
			s.checking.Lock()
			if !s.shutDown {
				s.checkHealthLocked(ctx)
			}
			s.checking.Unlock()
		} else {
			s.checking.Lock()
			watched := s.watchers > 0
			s.checking.Unlock()
			if !watched {
				return
			}
			s.freshHealth(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-done:
			return
		case <-t.C:
		}
	}
}

// checkHealthLocked looks at the database and the schema and sets the health
// service's status; s.checking is held.
func (s *Server) checkHealthLocked(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	h := s.base.Health(cctx)
	st := healthpb.HealthCheckResponse_SERVING
	if !h.DatabaseOK || !h.SchemaCurrent && !h.SchemaNewer {
		st = healthpb.HealthCheckResponse_NOT_SERVING
		if ctx.Err() == nil {
			s.opts.logger.Warn("kagziadmin: not serving", "database_ok", h.DatabaseOK,
				"database_error", h.DatabaseError, "schema_version", h.SchemaVersion,
				"latest_schema_version", h.LatestSchemaVersion)
		}
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(adminpb.AdminService_ServiceDesc.ServiceName, st)
	s.checked = time.Now()
}
