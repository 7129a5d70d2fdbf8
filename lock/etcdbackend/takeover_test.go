package etcdbackend_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/etcdbackend"
)

// gate is a TCP proxy to etcd that can hold back everything the client
// sends (keeping it, in order, until released), so a request can be made
// to start now and reach etcd later.
type gate struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	open   chan struct{}
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newGate(t *testing.T, target string) *gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{ln: ln, target: target, open: make(chan struct{})}
	close(g.open)
	g.wg.Add(1)
	go g.accept()
	t.Cleanup(g.close)
	return g
}

func (g *gate) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open = make(chan struct{})
}

func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

func (g *gate) opened() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open
}

func (g *gate) accept() {
	defer g.wg.Done()
	for {
		c, err := g.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", g.target)
		if err != nil {
			c.Close()
			continue
		}
		g.mu.Lock()
		g.conns = append(g.conns, c, up)
		g.mu.Unlock()
		g.wg.Add(2)
		go g.pipe(up, c, true)
		go g.pipe(c, up, false)
	}
}

func (g *gate) pipe(dst, src net.Conn, gated bool) {
	defer g.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if gated {
				<-g.opened()
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

func (g *gate) close() {
	g.release()
	g.ln.Close()
	g.mu.Lock()
	for _, c := range g.conns {
		c.Close()
	}
	g.mu.Unlock()
	g.wg.Wait()
}

func openVia(t *testing.T, endpoint, prefix string) backend.Backend {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := etcdbackend.Open(ctx, etcdbackend.Config{Client: cli, Prefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close(); cli.Close() })
	return b
}

// TestKeepAliveInFlightAcrossTakeover is the etcd side of the INV-06
// keepalive-versus-takeover race: A's keepalive is sent while A is live
// and reaches etcd only after A's lease has expired and B has taken A's
// key. Exactly one of them may win: B's grant means A's keepalive fails.
func TestKeepAliveInFlightAcrossTakeover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("/test/%d", seq.Add(1))
	u, err := url.Parse(cluster.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	g := newGate(t, u.Host)
	ba := openVia(t, "http://"+g.ln.Addr().String(), prefix)
	bb := openVia(t, cluster.Endpoints()[0], prefix)
	const key = "payout:race"

	sa, err := ba.CreateSession(ctx, "a", "p", backend.MinTTL)
	if err != nil {
		t.Fatal(err)
	}
	held, err := ba.Acquire(ctx, key, sa.ID)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := bb.CreateSession(ctx, "b", "p", backend.MaxTTL)
	if err != nil {
		t.Fatal(err)
	}

	g.hold()
	done := make(chan struct{})
	var kErr error
	go func() { defer close(done); _, kErr = ba.KeepAlive(ctx, sa.ID) }()

	var grant backend.Grant
	deadline := time.Now().Add(time.Minute)
	for {
		grant, err = bb.Acquire(ctx, key, sb.ID)
		if err == nil {
			break
		}
		if !problem.Has(err, problem.LockHeld) || time.Now().After(deadline) {
			t.Fatalf("B's acquire after A's lease should lapse: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case <-done:
		t.Fatalf("A's keepalive returned (%v) while its request was held back", kErr)
	default:
	}
	g.release()
	<-done
	if kErr == nil {
		t.Fatalf("INV-06: A's keepalive succeeded after B took %s over with token %d (A held token %d)", key, grant.Token, held.Token)
	}
	if !problem.Has(kErr, problem.SessionExpired) {
		t.Fatalf("A's keepalive: %v; want session_expired", kErr)
	}
}
