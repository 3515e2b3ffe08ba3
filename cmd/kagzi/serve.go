package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/kagzi/kagzi"
	kagziadmin "github.com/kagzi/kagzi/admin"
)

// serveAdmin serves the read-only admin gRPC API until interrupted. It refuses to
// serve an address that is not loopback (see loopbackAddr) in plaintext without
// authentication, unless --insecure says to.
func (a *app) serveAdmin(ctx context.Context, args []string) error {
	fs := a.flagSet("serve-admin")
	addr := fs.String("addr", "127.0.0.1:50051", "address to listen on")
	allNS := fs.Bool("all-namespaces", false, "serve every namespace (each request names its own)")
	namespaces := fs.String("namespaces", "", "more namespaces to serve, comma-separated")
	token := fs.String("token", "", "bearer token callers must send (default $KAGZI_ADMIN_TOKEN)")
	certFile := fs.String("tls-cert", "", "TLS certificate file (PEM)")
	keyFile := fs.String("tls-key", "", "TLS key file (PEM)")
	clientCA := fs.String("client-ca", "", "accept client certificates signed by this CA (PEM): mutual TLS")
	insecure := fs.Bool("insecure", false, "serve a non-loopback address without a token or TLS (anyone who reaches it can read)")
	if _, err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *allNS && *namespaces != "" {
		return usagef("serve-admin: --all-namespaces and --namespaces exclude each other")
	}
	if (*certFile == "") != (*keyFile == "") {
		return usagef("serve-admin: --tls-cert and --tls-key go together")
	}
	if *clientCA != "" && *certFile == "" {
		return usagef("serve-admin: --client-ca needs --tls-cert and --tls-key")
	}
	if *token == "" {
		*token = a.getenv("KAGZI_ADMIN_TOKEN")
	}
	if *token != "" && strings.TrimSpace(*token) == "" {
		return usagef("serve-admin: the bearer token (--token or $KAGZI_ADMIN_TOKEN) is blank")
	}
	if !*insecure && *token == "" && *certFile == "" && !loopbackAddr(*addr) {
		return usagef("serve-admin: refusing to serve %s in plaintext without authentication: it is not a loopback "+
			"address, so anyone who reaches it could read every run. Set a bearer token ($KAGZI_ADMIN_TOKEN or --token), "+
			"serve TLS (--tls-cert and --tls-key, with --client-ca for client certificates), listen on loopback "+
			"(--addr 127.0.0.1:PORT), or pass --insecure to serve it anyway", *addr)
	}

	pool, client, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	logger := a.logger()
	opts := []kagziadmin.Option{kagziadmin.WithLogger(logger)}
	factory := kagziadmin.PoolClients(pool, kagzi.Config{Logger: logger})
	switch {
	case *allNS:
		opts = append(opts, kagziadmin.WithNamespaces(factory))
	case *namespaces != "":
		list, err := a.namespaceList("serve-admin", pool, *namespaces)
		if err != nil {
			return err
		}
		opts = append(opts, kagziadmin.WithNamespaces(kagziadmin.OnlyNamespaces(factory, list...)))
	}
	if *token != "" {
		opts = append(opts, kagziadmin.WithBearerToken(*token))
	}
	if *certFile != "" {
		tlsOpts, err := tlsOptions(*certFile, *keyFile, *clientCA)
		if err != nil {
			return err
		}
		opts = append(opts, tlsOpts...)
	}
	if *token == "" && *clientCA == "" {
		fmt.Fprintln(a.stderr, "kagzi: warning: no authentication (set KAGZI_ADMIN_TOKEN or --client-ca); anyone who reaches the address can read")
	}
	srv, err := kagziadmin.NewAdminServer(client, opts...)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	served := a.namespace
	switch {
	case *allNS:
		served = "every namespace"
	case *namespaces != "":
		served += "," + *namespaces
	}
	fmt.Fprintf(a.stderr, "kagzi: admin API kagzi.v1.AdminService listening on %s (namespaces: %s)\n", lis.Addr(), served)
	if err := srv.Serve(ctx, lis); err != nil {
		return err
	}
	fmt.Fprintln(a.stderr, "kagzi: admin API stopped")
	return nil
}

// loopbackAddr reports whether addr (host:port) listens on loopback only: its host is
// "localhost" or an address of 127.0.0.0/8 or ::1. An empty host (":8080") means
// every interface, and any other name may resolve to anything: not loopback.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// tlsOptions are the admin server's options to serve TLS with the certificate and
// key files, and, with a client CA file, to accept client certificates it signed.
func tlsOptions(certFile, keyFile, clientCA string) ([]kagziadmin.Option, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("TLS: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	var opts []kagziadmin.Option
	if clientCA != "" {
		pem, err := os.ReadFile(clientCA)
		if err != nil {
			return nil, fmt.Errorf("client CA: %w", err)
		}
		cas := x509.NewCertPool()
		if !cas.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client CA: no certificate in %s", clientCA)
		}
		cfg.ClientCAs = cas
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
		opts = append(opts, kagziadmin.WithClientCertAuth(nil))
	}
	return append(opts, kagziadmin.WithTLS(cfg)), nil
}
