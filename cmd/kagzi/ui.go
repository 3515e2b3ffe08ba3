package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/ui"
)

// serveUI serves the operator console (package ui) until interrupted. Like
// serve-admin, it refuses to serve an address that is not loopback without a token,
// unless --insecure says to. With a token, every request must carry it: as the
// password of HTTP Basic authentication (browsers ask for it; the user name is who
// the audit log records) or as "Authorization: Bearer <token>".
func (a *app) serveUI(ctx context.Context, args []string) error {
	fs := a.flagSet("ui")
	addr := fs.String("addr", "127.0.0.1:8080", "address to listen on")
	allNS := fs.Bool("all-namespaces", false, "serve every namespace (the console's namespace box switches)")
	namespaces := fs.String("namespaces", "", "more namespaces to serve, comma-separated")
	token := fs.String("token", "", "token callers must send (default $KAGZI_UI_TOKEN)")
	actions := fs.Bool("actions", false, "enable the console's actions: cancel, rerun, fork, signal, schedules, bulk")
	hide := fs.Bool("hide-payloads", false, "hide inputs, outputs, signal payloads and event values")
	certFile := fs.String("tls-cert", "", "TLS certificate file (PEM): serve HTTPS")
	keyFile := fs.String("tls-key", "", "TLS key file (PEM)")
	insecure := fs.Bool("insecure", false, "serve a non-loopback address without a token (anyone who reaches it can read)")
	if _, err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *allNS && *namespaces != "" {
		return usagef("ui: --all-namespaces and --namespaces exclude each other")
	}
	if (*certFile == "") != (*keyFile == "") {
		return usagef("ui: --tls-cert and --tls-key go together")
	}
	if *token == "" {
		*token = a.getenv("KAGZI_UI_TOKEN")
	}
	if raw := *token; raw != "" {
		// As read from a secret file: its newline is no part of the token.
		if *token = strings.TrimSpace(raw); *token == "" {
			return usagef("ui: the token is only white space")
		}
	}
	if !*insecure && *token == "" && !loopbackAddr(*addr) {
		return usagef("ui: refusing to serve %s without a token: it is not a loopback address, so anyone who "+
			"reaches it could read every run%s. Set a token ($KAGZI_UI_TOKEN or --token), listen on loopback "+
			"(--addr 127.0.0.1:PORT), or pass --insecure to serve it anyway", *addr, map[bool]string{true: " and act on it"}[*actions])
	}
	pool, client, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	extra, err := a.namespaceList("ui", pool, *namespaces)
	if err != nil {
		return err
	}
	opts := ui.Options{Actions: *actions, HidePayloads: *hide, Logger: a.logger(),
		Authorize: func(r *http.Request, acc ui.Access) (string, bool) {
			ok := acc.Namespace == a.namespace || *allNS || slices.Contains(extra, acc.Namespace)
			return caller(r), ok && (acc.Action == ui.ActionRead || *actions)
		}}
	if *allNS || len(extra) > 0 {
		opts.Namespaces = func(ns string) (*kagzi.Client, error) {
			return kagzi.NewClient(pool, kagzi.Config{Namespace: ns, Logger: a.logger()})
		}
	}
	var h http.Handler = ui.Handler(client, opts)
	if *token != "" {
		h = requireToken(*token, h)
	} else {
		fmt.Fprintln(a.stderr, "kagzi: warning: no token (set KAGZI_UI_TOKEN or --token); anyone who reaches the address can read"+
			map[bool]string{true: " and act"}[*actions])
	}
	return a.listenAndServe(ctx, *addr, *certFile, *keyFile, h)
}

// listenAndServe serves h on addr (HTTPS with a certificate) until ctx ends, then
// shuts down, waiting up to 5 s for requests in flight.
//
// The certificate and key are loaded before it listens, so that a missing or bad
// file fails the command before it says it is listening.
func (a *app) listenAndServe(ctx context.Context, addr, certFile, keyFile string, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	scheme := "http"
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return fmt.Errorf("ui: TLS certificate: %w", err)
		}
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		scheme = "https"
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stderr, "kagzi: console listening on %s://%s/ (namespace %s)\n", scheme, lis.Addr(), a.namespace)
	errc := make(chan error, 1)
	go func() {
		if certFile != "" {
			errc <- srv.ServeTLS(lis, "", "")
		} else {
			errc <- srv.Serve(lis)
		}
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	fmt.Fprintln(a.stderr, "kagzi: console stopped")
	return nil
}

// caller names who a request comes from, for the audit log: the user name of its
// Basic authentication, else its remote address.
func caller(r *http.Request) string {
	if user, _, ok := r.BasicAuth(); ok && user != "" {
		return user
	}
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	return "anonymous@" + host
}

// requireToken lets through the requests that carry the token (compared in constant
// time) as a Basic password or a Bearer token; it asks the others for Basic
// credentials, which browsers prompt for.
func requireToken(token string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := ""
		if _, pw, ok := r.BasicAuth(); ok {
			got = pw
		} else if scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "bearer") {
			got = strings.TrimSpace(tok)
		}
		h := sha256.Sum256([]byte(got))
		if got == "" || subtle.ConstantTimeCompare(h[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="kagzi console", charset="UTF-8"`)
			http.Error(w, "the console needs its token: as the password (any user name), or a Bearer token", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
