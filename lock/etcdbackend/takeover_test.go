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

	// heldAt is when each chunk held back since hold arrived at the gate;
	// heldCh is closed (and replaced) when one more is held back.
	heldAt []time.Time
	heldCh chan struct{}
}

func newGate(t *testing.T, target string) *gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{ln: ln, target: target, open: make(chan struct{}), heldCh: make(chan struct{})}
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
	g.heldAt = nil
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

// pass waits until the gate is open, noting when a chunk is held back.
func (g *gate) pass() {
	g.mu.Lock()
	open := g.open
	select {
	case <-open:
	default:
		g.heldAt = append(g.heldAt, time.Now())
		close(g.heldCh)
		g.heldCh = make(chan struct{})
	}
	g.mu.Unlock()
	<-open
}

// heldSince reports when the first chunk held back that arrived at or
// after since did; until there is one, ok is false and next is closed
// when the gate holds back another chunk.
func (g *gate) heldSince(since time.Time) (at time.Time, ok bool, next <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, at := range g.heldAt {
		if !at.Before(since) {
			return at, true, nil
		}
	}
	return time.Time{}, false, g.heldCh
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
				g.pass()
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
//
// The keepalive must be sent before A's lease can have lapsed, or the
// race is not run: A's TTL leaves a slow machine seconds for that, and an
// attempt whose keepalive reached the gate later than that is made again
// with a fresh session (a few times, then the test fails).
func TestKeepAliveInFlightAcrossTakeover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("/test/%d", seq.Add(1))
	u, err := url.Parse(cluster.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	g := newGate(t, u.Host)
	ba := openVia(t, "http://"+g.ln.Addr().String(), prefix)
	bb := openVia(t, cluster.Endpoints()[0], prefix)
	sb, err := bb.CreateSession(ctx, "b", "p", backend.MaxTTL)
	if err != nil {
		t.Fatal(err)
	}
	const (
		ttlA     = 5 * time.Second
		attempts = 3
	)

	// race runs the race once on key; false: A's keepalive was not seen
	// sent before A's lease could have lapsed, and nothing was checked.
	race := func(attempt int, key string) bool {
		// etcd grants A's lease after this: it lapses no earlier than
		// created plus the TTL it applied.
		created := time.Now()
		sa, err := ba.CreateSession(ctx, "a", "p", ttlA)
		if err != nil {
			t.Fatal(err)
		}
		held, err := ba.Acquire(ctx, key, sa.ID)
		if err != nil {
			t.Fatal(err)
		}

		g.hold()
		done := make(chan struct{})
		called := make(chan time.Time, 1)
		var kErr error
		go func() {
			defer close(done)
			called <- time.Now()
			_, kErr = ba.KeepAlive(ctx, sa.ID)
		}()
		// A's keepalive is sent: what A sends from the call on reaches
		// the gate, which holds it back.
		callAt := <-called
		var sent time.Time
		for {
			at, ok, next := g.heldSince(callAt)
			if ok {
				sent = at
				break
			}
			select {
			case <-next:
			case <-done:
				t.Fatalf("A's keepalive returned (%v) without sending anything through the gate", kErr)
			case <-ctx.Done():
				t.Fatalf("A's keepalive never reached the gate: %v", ctx.Err())
			}
		}
		if lapse := created.Add(sa.TTL); !sent.Before(lapse) {
			t.Logf("attempt %d: A's keepalive reached the gate %s after A's session was opened, not within its TTL %s: it may have been sent after A's lease lapsed; trying again",
				attempt, sent.Sub(created).Round(time.Millisecond), sa.TTL)
			g.release()
			<-done
			return false
		}

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
		return true
	}
	for attempt := 1; !race(attempt, fmt.Sprintf("payout:race-%d", attempt)); attempt++ {
		if attempt == attempts {
			t.Fatalf("in %d attempts A's keepalive never reached the gate within A's TTL: the race was not run", attempts)
		}
	}
}
