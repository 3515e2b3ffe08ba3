package kagziadmin_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
	kagziadmin "github.com/kagzi/kagzi/admin"
	"github.com/kagzi/kagzi/admin/adminpb"
)

// authority is a throwaway certificate authority.
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newAuthority(t *testing.T, name string) *authority {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &authority{cert: cert, key: key}
}

// issue signs a certificate for name (a server on 127.0.0.1, or a client).
func (a *authority) issue(t *testing.T, name string, server bool) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func (a *authority) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(a.cert)
	return p
}

func TestClientCertificatesAuthenticateAndLimitNamespacesOverMutualTLS(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	ca := newAuthority(t, "kagzi test CA")
	stranger := newAuthority(t, "someone else's CA")
	addr := serve(t, f.a,
		kagziadmin.WithNamespaces(kagziadmin.PoolClients(f.pool, kagzi.Config{Logger: quietLogger()})),
		kagziadmin.WithTLS(&tls.Config{
			Certificates: []tls.Certificate{ca.issue(t, "kagzi-admin", true)},
			ClientCAs:    ca.pool(),
			ClientAuth:   tls.VerifyClientCertIfGiven,
			MinVersion:   tls.VersionTLS12,
		}),
		kagziadmin.WithClientCertAuth(func(cert *x509.Certificate, namespace string) bool {
			return cert.Subject.CommonName == "dashboard" && (namespace == "" || namespace == nsA)
		}))

	connect := func(certs ...tls.Certificate) adminpb.AdminServiceClient {
		t.Helper()
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			RootCAs: ca.pool(), Certificates: certs, MinVersion: tls.VersionTLS12})))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return adminpb.NewAdminServiceClient(conn)
	}

	dashboard := connect(ca.issue(t, "dashboard", false))
	if _, err := dashboard.GetServerInfo(ctx, &adminpb.GetServerInfoRequest{}); err != nil {
		t.Fatal(err)
	}
	list, err := dashboard.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA})
	if err != nil || len(list.Workflows) != 8 {
		t.Fatalf("dashboard lists team-a: %v, %v", list, err)
	}
	_, err = dashboard.ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsB})
	wantCode(t, err, codes.PermissionDenied)

	_, err = connect().ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA})
	wantCode(t, err, codes.Unauthenticated)

	_, err = connect(ca.issue(t, "intruder", false)).ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA})
	wantCode(t, err, codes.PermissionDenied)

	// A certificate from an authority the server does not trust is not accepted: the
	// client does not present it (or the handshake fails).
	_, err = connect(stranger.issue(t, "dashboard", false)).ListWorkflows(ctx, &adminpb.ListWorkflowsRequest{Namespace: nsA})
	if code := status.Code(err); code != codes.Unauthenticated && code != codes.Unavailable {
		t.Fatalf("untrusted certificate: %v, want Unauthenticated or Unavailable", err)
	}
}

func TestNewAdminServerRejectsAnUnusableConfiguration(t *testing.T) {
	t.Parallel()
	// The pool connects lazily: nothing here reaches a database.
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	client := newClient(t, pool, nsA)
	for name, build := range map[string]func() (*kagziadmin.Server, error){
		"nil client": func() (*kagziadmin.Server, error) { return kagziadmin.NewAdminServer(nil) },
		"empty token": func() (*kagziadmin.Server, error) {
			return kagziadmin.NewAdminServer(client, kagziadmin.WithBearerToken(""))
		},
		"white-space token": func() (*kagziadmin.Server, error) {
			return kagziadmin.NewAdminServer(client, kagziadmin.WithBearerToken(" \n"))
		},
		"client certificates without TLS": func() (*kagziadmin.Server, error) {
			return kagziadmin.NewAdminServer(client, kagziadmin.WithClientCertAuth(nil))
		},
	} {
		if _, err := build(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
