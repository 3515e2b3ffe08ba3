// Package kagziadmin serves Kagzi's read-only admin API, the gRPC service
// kagzi.v1.AdminService (proto/kagzi/v1/admin.proto), over a *kagzi.Client, so that
// dashboards and tools in any language can see runs, steps, workers and schedules.
//
// It is optional and lives apart from the core: the kagzi package never imports gRPC,
// and workflows never need this server to run.
//
//	srv, err := kagziadmin.NewAdminServer(client,
//		kagziadmin.WithNamespaces(kagziadmin.PoolClients(pool, kagzi.Config{})),
//		kagziadmin.WithBearerToken(os.Getenv("KAGZI_ADMIN_TOKEN")))
//	lis, _ := net.Listen("tcp", "127.0.0.1:50051")
//	err = srv.Serve(ctx, lis) // until ctx is done, then stops gracefully
//
// # Namespaces
//
// Every request that reads tenant data names its namespace; a request without one is
// rejected with InvalidArgument, never answered from a default namespace. The server
// answers for the namespace of the client it was built with and, with WithNamespaces,
// for any namespace its ClientFactory accepts; the clients are created once per
// namespace and cached. Another namespace is PermissionDenied. A bearer token (or a
// client certificate) can be limited to some namespaces.
//
// # What the server registers
//
// Serve (or GRPCServer) gives a gRPC server with kagzi.v1.AdminService, the standard
// health service grpc.health.v1.Health (its status follows the database and the schema
// version, whoever serves it: see WithHealthInterval; it needs no credentials, so that
// probes work) and server reflection (it needs the same credentials as the admin
// RPCs). No RPC changes anything.
//
// # Errors
//
// Kagzi's errors map to gRPC codes: ErrNotFound is NotFound, ErrInvalidArgument
// (a malformed id, filter or page token) is InvalidArgument, ErrSchemaNotMigrated is
// FailedPrecondition, a closed pool or a database that cannot be reached or drops the
// connection (kagzi.ErrUnavailable) is Unavailable; missing or wrong credentials are
// Unauthenticated and a namespace the caller may not read is PermissionDenied.
package kagziadmin

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/admin/adminpb"
)

// APIVersion is the version of the admin API this package serves: its proto package.
const APIVersion = "kagzi.v1"

// maxCachedClients bounds the per-namespace client cache; past it, clients of new
// namespaces are created per request instead of kept.
const maxCachedClients = 1024

// ClientFactory returns the client that serves a namespace. The server calls it once
// per namespace and caches the client. Return an error wrapping ErrNamespaceNotServed
// to refuse a namespace (PermissionDenied), or one wrapping kagzi.ErrInvalidArgument
// for an invalid name (InvalidArgument).
type ClientFactory func(namespace string) (*kagzi.Client, error)

// ErrNamespaceNotServed is what a ClientFactory returns, wrapped, for a namespace it
// does not serve.
var ErrNamespaceNotServed = errors.New("kagziadmin: namespace not served")

// PoolClients returns a ClientFactory that serves any namespace with a client over
// pool, configured as cfg with cfg.Namespace replaced by the requested namespace.
func PoolClients(pool *pgxpool.Pool, cfg kagzi.Config) ClientFactory {
	return func(namespace string) (*kagzi.Client, error) {
		c := cfg
		c.Namespace = namespace
		return kagzi.NewClient(pool, c)
	}
}

// OnlyNamespaces returns a ClientFactory that serves the listed namespaces through f
// and refuses every other with ErrNamespaceNotServed.
func OnlyNamespaces(f ClientFactory, namespaces ...string) ClientFactory {
	allowed := make(map[string]bool, len(namespaces))
	for _, ns := range namespaces {
		allowed[ns] = true
	}
	return func(namespace string) (*kagzi.Client, error) {
		if !allowed[namespace] {
			return nil, fmt.Errorf("%w: %q", ErrNamespaceNotServed, namespace)
		}
		return f(namespace)
	}
}

// Option configures a Server.
type Option func(*options)

type options struct {
	factory        ClientFactory
	tokens         []bearerToken
	certAuth       bool
	certAllow      func(cert *x509.Certificate, namespace string) bool
	tls            *tls.Config
	logger         *slog.Logger
	healthInterval time.Duration
	err            error
}

// WithNamespaces lets the server answer for namespaces other than its client's: the
// first request naming a namespace gets its client from f, which is then cached.
// Without it, the server answers for its client's namespace only.
func WithNamespaces(f ClientFactory) Option {
	return func(o *options) { o.factory = f }
}

// WithBearerToken requires callers to authenticate: a request is accepted when its
// "authorization" metadata is "Bearer <token>" for one of the tokens given with
// WithBearerToken (or, with WithClientCertAuth, when it presents an accepted client
// certificate). A token given with namespaces may read those namespaces only; one
// given without may read every namespace the server serves. Tokens are compared in
// constant time. White space around the token (the newline ending a secret file) is
// trimmed, as it is from the token a caller presents; a token of white space only is
// empty, and refused.
func WithBearerToken(token string, namespaces ...string) Option {
	return func(o *options) {
		token := strings.TrimSpace(token)
		if token == "" {
			o.err = errors.New("kagziadmin: empty bearer token")
			return
		}
		o.tokens = append(o.tokens, newBearerToken(token, namespaces))
	}
}

// WithClientCertAuth requires callers to authenticate with a client certificate that
// the server's TLS configuration verified (mutual TLS; see WithTLS, whose ClientAuth
// must ask for and verify client certificates against a ClientCAs pool). allow, when
// not nil, decides which namespaces the certificate's owner may read (namespace is ""
// for GetServerInfo and reflection, which read no tenant data).
func WithClientCertAuth(allow func(cert *x509.Certificate, namespace string) bool) Option {
	return func(o *options) {
		o.certAuth = true
		o.certAllow = allow
	}
}

// WithTLS serves over TLS with cfg (GRPCServer and Serve). Without it the server
// speaks plaintext gRPC: keep it on a private network or behind a TLS proxy.
func WithTLS(cfg *tls.Config) Option {
	return func(o *options) { o.tls = cfg }
}

// WithLogger sets the server's logger. Default: slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger = l }
}

// WithHealthInterval sets how often the database and the schema are checked for the
// standard health service: by Serve, every interval while it serves; on a gRPC
// server of GRPCServer or Register, by a Check when the last check is older than the
// interval, and every interval while a Watch stream is open. Default 10s.
func WithHealthInterval(d time.Duration) Option {
	return func(o *options) { o.healthInterval = d }
}

// Server implements kagzi.v1.AdminService over Kagzi clients. Create it with
// NewAdminServer; it is safe for concurrent use.
type Server struct {
	adminpb.UnimplementedAdminServiceServer

	base   *kagzi.Client
	opts   options
	health *health.Server

	// checking is held while the health is checked; checked is when it last was
	// (zero: stale) and watchers counts the open Watch streams (health.go).
	checking sync.Mutex
	checked  time.Time
	watchers int
	shutDown bool // Serve shut the health service down as it stopped

	mu      sync.Mutex
	clients map[string]*kagzi.Client
}

var _ adminpb.AdminServiceServer = (*Server)(nil)

// NewAdminServer returns a server that answers for client's namespace, and for more
// namespaces with WithNamespaces. It connects nothing yet.
func NewAdminServer(client *kagzi.Client, opts ...Option) (*Server, error) {
	if client == nil {
		return nil, errors.New("kagziadmin: nil client")
	}
	s := &Server{base: client, clients: map[string]*kagzi.Client{client.Namespace(): client}}
	for _, opt := range opts {
		opt(&s.opts)
	}
	if s.opts.err != nil {
		return nil, s.opts.err
	}
	if s.opts.logger == nil {
		s.opts.logger = slog.Default()
	}
	if s.opts.healthInterval <= 0 {
		s.opts.healthInterval = 10 * time.Second
	}
	if s.opts.certAuth && s.opts.tls == nil {
		return nil, errors.New("kagziadmin: WithClientCertAuth needs WithTLS (mutual TLS)")
	}
	s.health = health.NewServer()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(adminpb.AdminService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	return s, nil
}

// Register registers the admin service, the standard health service and server
// reflection on g. A server built by hand must also be given UnaryInterceptor and
// StreamInterceptor for reflection to require credentials; the admin RPCs check them
// in any case.
func (s *Server) Register(g *grpc.Server) {
	adminpb.RegisterAdminServiceServer(g, s)
	healthpb.RegisterHealthServer(g, healthService{s.health, s})
	reflection.Register(g)
}

// GRPCServer returns a new gRPC server with the server's TLS credentials and
// authentication interceptors, and everything Register registers. extra options are
// appended (more interceptors chain after authentication).
func (s *Server) GRPCServer(extra ...grpc.ServerOption) *grpc.Server {
	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(s.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(s.StreamInterceptor()),
	}
	if s.opts.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.opts.tls)))
	}
	g := grpc.NewServer(append(opts, extra...)...)
	s.Register(g)
	return g
}

// Serve serves the admin API on lis until ctx is done, then stops gracefully (waiting
// up to 5 seconds for RPCs in flight) and returns nil. While it serves, it checks the
// database and the schema every health interval and reports the result through the
// standard health service. A Server may Serve again after Serve returned.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	s.resumeHealth()
	g := s.GRPCServer()
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		s.watchHealth(ctx, done, true)
		s.checking.Lock()
		s.health.Shutdown() // NOT_SERVING to the watchers while the server stops
		s.shutDown = true
		s.checking.Unlock()
		finished := make(chan struct{})
		go func() { g.GracefulStop(); close(finished) }()
		select {
		case <-finished:
		case <-time.After(5 * time.Second):
			g.Stop()
		}
	}()
	err := g.Serve(lis)
	close(done)
	<-stopped
	s.resumeHealth() // for another Serve or a GRPCServer: the next look checks again
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// client returns the client of the request's namespace once the caller may read it.
func (s *Server) client(ctx context.Context, namespace string) (*kagzi.Client, error) {
	if namespace == "" {
		return nil, status.Error(codes.InvalidArgument,
			"namespace is required: the admin API never assumes one")
	}
	if err := s.authorize(ctx, namespace); err != nil {
		return nil, err
	}
	s.mu.Lock()
	c, ok := s.clients[namespace]
	s.mu.Unlock()
	if ok {
		return c, nil
	}
	if s.opts.factory == nil {
		return nil, status.Errorf(codes.PermissionDenied,
			"namespace %q is not served by this admin server (it serves %q)", namespace, s.base.Namespace())
	}
	c, err := s.opts.factory(namespace)
	switch {
	case errors.Is(err, ErrNamespaceNotServed):
		return nil, status.Errorf(codes.PermissionDenied, "namespace %q is not served by this admin server", namespace)
	case err != nil:
		return nil, toStatus(err)
	case c == nil || c.Namespace() != namespace:
		return nil, status.Errorf(codes.Internal, "client factory returned no client for namespace %q", namespace)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if cached, ok := s.clients[namespace]; ok {
		return cached, nil
	}
	if len(s.clients) < maxCachedClients {
		s.clients[namespace] = c
	}
	return c, nil
}

// toStatus maps an error of the kagzi package to a gRPC status error.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var code codes.Code
	switch {
	case errors.Is(err, kagzi.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, kagzi.ErrInvalidArgument):
		code = codes.InvalidArgument
	case errors.Is(err, kagzi.ErrAlreadyExists):
		code = codes.AlreadyExists
	case errors.Is(err, kagzi.ErrSchemaNotMigrated):
		code = codes.FailedPrecondition
	case errors.Is(err, kagzi.ErrClosed), errors.Is(err, kagzi.ErrUnavailable):
		// ErrUnavailable before DeadlineExceeded: a connection attempt that timed out
		// is the database's unavailability, whoever set the deadline.
		code = codes.Unavailable
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	default:
		code = codes.Internal
	}
	return status.Error(code, err.Error())
}
