package store

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi/internal/testdb"
)

// stallingProxy forwards connections to addr until stall is called; from then on it
// reads nothing more from the server, as a client process that was stopped (SIGSTOP, a
// paused VM) reads nothing: the server's writes fill the socket buffers and block.
type stallingProxy struct {
	ln      net.Listener
	stalled chan struct{}
	once    sync.Once
}

func newStallingProxy(t *testing.T, addr string) *stallingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallingProxy{ln: ln, stalled: make(chan struct{})}
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", addr)
			if err != nil {
				client.Close()
				return
			}
			mu.Lock()
			conns = append(conns, client, server)
			mu.Unlock()
			go io.Copy(server, client)
			go func() {
				buf := make([]byte, 4096)
				for {
					select {
					case <-p.stalled:
						return // and never read again: the connections stay open
					default:
					}
					n, err := server.Read(buf)
					if n > 0 {
						if _, err := client.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return p
}

func (p *stallingProxy) stall() { p.once.Do(func() { close(p.stalled) }) }

func TestAClaimWhoseClientStopsReadingItsResultEndsWithinTheLeaseAndFreesTheTypesLock(t *testing.T) {
	t.Parallel()
	pool, url := testdb.NewPool(t)
	ctx := context.Background()
	// A limited type: each claim holds the type's lock until it commits.
	setLimit(t, pool, "concurrency", 1000)
	// 100 runs of 256 KB inputs: a claim's result of 25 MB, more than the sockets hold.
	input := []byte(`"` + strings.Repeat("x", 256<<10) + `"`)
	ids := make([]uuid.UUID, 100)
	inputs := make([][]byte, len(ids))
	for i := range ids {
		ids[i], inputs[i] = uuid.Must(uuid.NewV7()), input
	}
	if err := InsertRuns(ctx, pool, "default", "wf", nil, ids, inputs, make([][]byte, len(ids)), time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newStallingProxy(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	cfg.Host, cfg.Port = "127.0.0.1", uint16(proxy.ln.Addr().(*net.TCPAddr).Port)
	stalled, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The stalled claimer's lease is 2 s: its claim must not hold the type for longer.
	c := testClaimer("wf")
	c.Lease = 2 * time.Second
	// A claim of nothing first, so that the connection has the claim's statements
	// prepared: the stalled claim's answer is its result, not its statements' description.
	if _, _, err := ClaimRuns(ctx, stalled, c, 0); err != nil {
		t.Fatal(err)
	}
	proxy.stall()
	go func() {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		ClaimRuns(cctx, stalled, c, 100) // blocks: nothing reaches it
	}()
	// Once the stalled claim holds the type's lock, another worker's claim waits for it.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event = 'ClientWrite')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stalled claim never blocked sending its result")
		}
	}
	began := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	claimed, _, err := ClaimRuns(cctx, pool, testClaimer("wf"), 100)
	if err != nil || len(claimed) != len(ids) {
		t.Fatalf("the other worker's claim, %v after the stalled one began sending: %d runs, %v; want all %d",
			time.Since(began).Round(time.Millisecond), len(claimed), err, len(ids))
	}
	t.Logf("the other worker claimed the runs %v after the stalled claim began sending", time.Since(began).Round(time.Millisecond))
	// The timeout is the claim's transaction's own: the connection keeps its setting.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, _, err := ClaimRuns(ctx, conn, testClaimer("wf"), 1); err != nil {
		t.Fatal(err)
	}
	var setting string
	if err := conn.QueryRow(ctx, `SHOW tcp_user_timeout`).Scan(&setting); err != nil || setting != "0" {
		t.Fatalf("tcp_user_timeout after a claim: %q, %v; want the connection's own, 0", setting, err)
	}
}
