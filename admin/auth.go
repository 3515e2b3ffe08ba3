package kagziadmin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

type bearerToken struct {
	hash       [sha256.Size]byte
	namespaces map[string]bool // nil: every namespace
}

func newBearerToken(token string, namespaces []string) bearerToken {
	t := bearerToken{hash: sha256.Sum256([]byte(token))}
	if len(namespaces) > 0 {
		t.namespaces = make(map[string]bool, len(namespaces))
		for _, ns := range namespaces {
			t.namespaces[ns] = true
		}
	}
	return t
}

// caller is who a request authenticated as.
type caller struct {
	token *bearerToken      // authenticated by a bearer token
	cert  *x509.Certificate // authenticated by a verified client certificate
}

type callerKey struct{}

// authRequired reports whether the server asks callers for credentials.
func (s *Server) authRequired() bool { return len(s.opts.tokens) > 0 || s.opts.certAuth }

// authenticate finds who the request comes from: a bearer token in its metadata, or a
// verified client certificate of its TLS connection.
func (s *Server) authenticate(ctx context.Context) (*caller, error) {
	if c, ok := ctx.Value(callerKey{}).(*caller); ok {
		return c, nil
	}
	if !s.authRequired() {
		return &caller{}, nil
	}
	if len(s.opts.tokens) > 0 {
		md, _ := metadata.FromIncomingContext(ctx)
		for _, v := range md.Get("authorization") {
			scheme, tok, ok := strings.Cut(v, " ")
			if !ok || !strings.EqualFold(scheme, "bearer") {
				continue
			}
			h := sha256.Sum256([]byte(strings.TrimSpace(tok)))
			for i := range s.opts.tokens {
				if subtle.ConstantTimeCompare(h[:], s.opts.tokens[i].hash[:]) == 1 {
					return &caller{token: &s.opts.tokens[i]}, nil
				}
			}
		}
	}
	if s.opts.certAuth {
		if p, ok := peer.FromContext(ctx); ok {
			if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 &&
				len(ti.State.VerifiedChains[0]) > 0 {
				return &caller{cert: ti.State.VerifiedChains[0][0]}, nil
			}
		}
	}
	return nil, status.Error(codes.Unauthenticated,
		"missing or invalid credentials: send \"authorization: Bearer <token>\" or a client certificate the server trusts")
}

// authorize checks that the request's caller may read namespace ("" for requests that
// read no tenant data).
func (s *Server) authorize(ctx context.Context, namespace string) error {
	c, err := s.authenticate(ctx)
	if err != nil {
		return err
	}
	switch {
	case c.token != nil && c.token.namespaces != nil && namespace != "" && !c.token.namespaces[namespace]:
		return status.Errorf(codes.PermissionDenied, "this token may not read namespace %q", namespace)
	case c.cert != nil && s.opts.certAllow != nil && !s.opts.certAllow(c.cert, namespace):
		return status.Errorf(codes.PermissionDenied, "client certificate %q may not read namespace %q",
			c.cert.Subject.CommonName, namespace)
	}
	return nil
}

// exempt reports the methods that need no credentials: the standard health service,
// so that load balancers and orchestrators can probe the server.
func exempt(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/"+healthpb.Health_ServiceDesc.ServiceName+"/")
}

// UnaryInterceptor authenticates unary calls (see WithBearerToken and
// WithClientCertAuth) before their handler runs. GRPCServer and Serve install it.
func (s *Server) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if exempt(info.FullMethod) {
			return handler(ctx, req)
		}
		c, err := s.authenticate(ctx)
		if err != nil {
			return nil, err
		}
		return handler(context.WithValue(ctx, callerKey{}, c), req)
	}
}

// StreamInterceptor authenticates streaming calls (server reflection) before their
// handler runs. GRPCServer and Serve install it.
func (s *Server) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if exempt(info.FullMethod) {
			return handler(srv, ss)
		}
		if err := s.authorize(ss.Context(), ""); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}
