package main_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kagzi/kagzi/internal/testdb"
)

// serveUI starts `kagzi ui args...` on the database dbURL with the extra environment,
// waits until it listens and returns the console's URL. It is killed when the test ends.
func serveUI(t *testing.T, dbURL string, extraEnv []string, args ...string) (url, printed string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, binary, append([]string{"ui"}, args...)...)
	cmd.Env = append(env(dbURL), extraEnv...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := bufio.NewScanner(stderr)
	var b strings.Builder
	for lines.Scan() {
		b.WriteString(lines.Text() + "\n")
		if m := regexp.MustCompile(`console listening on http://(\S+)/ `).FindStringSubmatch(lines.Text()); m != nil {
			go func() {
				for lines.Scan() {
				}
			}()
			host, port, _ := net.SplitHostPort(m[1])
			if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
				host = "127.0.0.1"
			}
			return "http://" + net.JoinHostPort(host, port) + "/", b.String()
		}
	}
	t.Fatalf("kagzi ui %v did not listen; it printed:\n%s", args, b.String())
	return "", ""
}

func fetch(t *testing.T, url, user, password string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if password != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header
}

func TestUIRefusesANonLoopbackAddressWithoutAToken(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{":8080", "0.0.0.0:8080", "192.0.2.10:8080"} {
		r := kagziCmd(t, "", "ui", "--addr", addr)
		if r.code != 2 || !strings.Contains(r.stderr, "refusing to serve "+addr) ||
			!strings.Contains(r.stderr, "KAGZI_UI_TOKEN") || !strings.Contains(r.stderr, "--insecure") {
			t.Fatalf("ui --addr %s without a token: exit %d, %q; want a usage error naming the fixes", addr, r.code, r.stderr)
		}
	}
}

func TestUIServesTheConsoleOnLoopbackAndAsksForTheTokenWhenOneIsSet(t *testing.T) {
	t.Parallel()
	dbURL := testdb.New(t)
	open, printed := serveUI(t, dbURL, nil, "--addr", "127.0.0.1:0")
	if status, body, _ := fetch(t, open, "", ""); status != 200 || !strings.Contains(body, "Workflow types") {
		t.Fatalf("loopback without a token: %d\n%s", status, body)
	}
	if !strings.Contains(printed, "warning: no token") {
		t.Fatalf("served without a token and without the warning:\n%s", printed)
	}
	guarded, _ := serveUI(t, dbURL, []string{"KAGZI_UI_TOKEN=s3cret"}, "--addr", ":0", "--actions")
	status, _, h := fetch(t, guarded+"n/default/runs", "", "")
	if status != http.StatusUnauthorized || !strings.Contains(h.Get("WWW-Authenticate"), "Basic") {
		t.Fatalf("with a token, a request without it: %d %v, want 401 asking for Basic credentials", status, h)
	}
	if status, _, _ := fetch(t, guarded+"n/default/runs", "alice", "wrong"); status != http.StatusUnauthorized {
		t.Fatalf("a wrong token: %d, want 401", status)
	}
	status, body, _ := fetch(t, guarded+"n/default/runs", "alice", "s3cret")
	if status != 200 || !strings.Contains(body, "bulk-cancel") {
		t.Fatalf("with the token and --actions: %d, want the runs page with its bulk actions\n%s", status, body)
	}
	if status, _, _ := fetch(t, guarded+"n/other/runs", "alice", "s3cret"); status != http.StatusNotFound {
		t.Fatalf("another namespace without --namespaces: %d, want 404", status)
	}
}

func TestUIWithAMissingCertificateFailsBeforeSayingItListens(t *testing.T) {
	t.Parallel()
	url := testdb.New(t)
	missing := t.TempDir() + "/missing.pem"
	r := kagziCmd(t, url, "ui", "--addr", "127.0.0.1:0", "--tls-cert", missing, "--tls-key", missing)
	if r.code == 0 || strings.Contains(r.stderr, "listening") || !strings.Contains(r.stderr, "missing.pem") {
		t.Fatalf("ui with a missing certificate: exit %d, %q; want a failure naming the file, before any \"listening\"", r.code, r.stderr)
	}
}

func TestUIAcceptsATokenReadFromAFileWithItsNewlineAndRefusesABlankOne(t *testing.T) {
	t.Parallel()
	dbURL := testdb.New(t)
	guarded, _ := serveUI(t, dbURL, []string{"KAGZI_UI_TOKEN=s3cret\n"}, "--addr", "127.0.0.1:0")
	if status, _, _ := fetch(t, guarded+"n/default/runs", "alice", "s3cret"); status != 200 {
		t.Fatalf("KAGZI_UI_TOKEN ending in a newline, the token as the password: %d, want 200", status)
	}
	if status, _, _ := fetch(t, guarded+"n/default/runs", "alice", "wrong"); status != http.StatusUnauthorized {
		t.Fatalf("a wrong token: %d, want 401", status)
	}
	if r := kagziCmdEnv(t, dbURL, []string{"KAGZI_UI_TOKEN= \n"}, "ui", "--addr", "127.0.0.1:0"); r.code != 2 ||
		!strings.Contains(r.stderr, "white space") {
		t.Fatalf("a token of white space only: exit %d, %q; want 2 (usage)", r.code, r.stderr)
	}
}

// Found from outside: serve-admin and ui served with a --namespaces item that is no
// valid name, where the docs make it a usage error found without asking the database.
func TestServeAdminAndUIRefuseANamespacesItemThatIsNoValidNameAsAUsageError(t *testing.T) {
	t.Parallel()
	const dsn = "postgres://postgres@127.0.0.1:1/nowhere?connect_timeout=1" // never asked
	run := func(args ...string) (int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, binary, append([]string{"--dsn", dsn}, args...)...)
		cmd.Env = env("")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		switch {
		case ctx.Err() != nil:
			return -1, "still serving after 4s: " + stderr.String()
		case errors.As(err, &exit):
			return exit.ExitCode(), stderr.String()
		}
		return 0, stderr.String()
	}
	if code, out := run("serve-admin", "--addr", "127.0.0.1:0", "-n", "a\x01b"); code != 2 {
		t.Fatalf("-n with a control character: exit %d (%q), want 2", code, out)
	}
	long := strings.Repeat("x", 300)
	for _, cmd := range []string{"serve-admin", "ui"} {
		for _, ns := range []string{"ok,a\x01b", "ok," + long} {
			if code, out := run(cmd, "--addr", "127.0.0.1:0", "--namespaces", ns); code != 2 {
				t.Errorf("%s --namespaces %.20q: exit %d (%.200q), want 2 (usage error)", cmd, ns, code, out)
			}
		}
	}
}
