package etcdbackend_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/loopback"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/etcdbackend"
)

// outageProxy is a TCP proxy to etcd that can simulate an outage: while
// down it drops every proxied connection and accepts and at once closes
// every new one, recording when each connection attempt arrived.
type outageProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu       sync.Mutex
	down     bool
	attempts []time.Time // connection attempts while down
	conns    map[net.Conn]struct{}
}

func newOutageProxy(t *testing.T, target string) *outageProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &outageProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *outageProxy) endpoint() string { return "http://" + p.ln.Addr().String() }

func (p *outageProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.down {
			p.attempts = append(p.attempts, time.Now())
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve connects c to etcd and copies both ways until either side ends.
func (p *outageProxy) serve(c net.Conn) {
	defer p.wg.Done()
	up, err := net.DialTimeout("tcp", p.target, 10*time.Second)
	p.mu.Lock()
	_, live := p.conns[c] // not dropped by an outage meanwhile
	if err != nil || !live {
		delete(p.conns, c)
		p.mu.Unlock()
		c.Close()
		if up != nil {
			up.Close()
		}
		return
	}
	p.conns[up] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		dst.Close()
		src.Close()
	}
	go pipe(up, c)
	go pipe(c, up)
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// setDown starts (dropping every proxied connection) or ends an outage.
func (p *outageProxy) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for c := range p.conns {
			c.Close()
			delete(p.conns, c)
		}
	}
}

func (p *outageProxy) attemptTimes() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.attempts...)
}

func (p *outageProxy) close() {
	p.ln.Close()
	p.setDown(true)
	p.wg.Wait()
}

// TestReconnectAfterOutage: after etcd has been unreachable for a while,
// the backend's client still tries to reconnect every couple of seconds
// (gRPC's default backoff would by then wait 10s and more between
// attempts), so it is back soon after etcd answers again.
func TestReconnectAfterOutage(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("holds an etcd outage for 30s")
	}
	const (
		outage = 30 * time.Second
		// Only gaps ending this long into the outage count: by then the
		// backoff has grown to its cap.
		settle = 10 * time.Second
		maxGap = 5 * time.Second
		back   = 20 * time.Second
	)
	u, err := url.Parse(cluster.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	p := newOutageProxy(t, u.Host)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("/test/%d", seq.Add(1))
	b, err := etcdbackend.Open(ctx, etcdbackend.Config{Endpoints: []string{p.endpoint()}, Prefix: prefix,
		Logger: slog.New(slog.DiscardHandler), SweepInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = b.Run(runCtx) }()
	// Callers keep calling during the outage, as executors do: a
	// reconnect that waits for demand still gets it.
	pingDone := make(chan struct{})
	go func() {
		defer close(pingDone)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			pctx, pcancel := context.WithTimeout(runCtx, time.Second)
			_ = b.Ping(pctx)
			pcancel()
			select {
			case <-runCtx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	defer func() { stopRun(); <-pingDone; <-runDone; b.Close() }()

	if _, err := b.CreateSession(ctx, "before", "p", backend.MinTTL); err != nil {
		t.Fatalf("session before the outage: %v", err)
	}

	start := time.Now()
	p.setDown(true)
	select {
	case <-time.After(outage):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	end := time.Now()
	p.setDown(false)
	attempts := p.attemptTimes()

	// The gaps between connection attempts, and from the last one to the
	// end of the outage, that end after the backoff has settled.
	points := append(attempts, end)
	var gaps []string
	var worst time.Duration
	prev := start
	for _, at := range points {
		gap := at.Sub(prev)
		gaps = append(gaps, fmt.Sprintf("%.1fs@%.1fs", gap.Seconds(), at.Sub(start).Seconds()))
		if at.Sub(start) > settle && gap > worst {
			worst = gap
		}
		prev = at
	}
	t.Logf("%d connection attempts during a %s outage; gaps (length@end): %s", len(attempts), outage, strings.Join(gaps, " "))
	if worst > maxGap {
		t.Errorf("after %s of outage the client waited up to %.1fs between connection attempts; want at most %s", settle, worst.Seconds(), maxGap)
	}

	deadline := time.Now().Add(back)
	for {
		sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := b.CreateSession(sctx, "after", "p", backend.MinTTL)
		scancel()
		if err == nil {
			t.Logf("backend answered %.1fs after the outage ended", time.Since(end).Seconds())
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend not answering %s after the outage ended: %v", back, err)
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
}

// An etcd that does not answer at start is waited for, a WARN line an
// attempt, for the step timeout, then refused naming the endpoints: the
// service had waited for it for ever, silent, before it listened.
func TestOpenGivesUpOnAnEtcdThatDoesNotAnswer(t *testing.T) {
	t.Parallel()
	port, err := loopback.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	endpoint := fmt.Sprintf("http://127.0.0.1:%d", port)
	var logs bytes.Buffer
	var mu sync.Mutex
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	_, err = etcdbackend.Open(ctx, etcdbackend.Config{Endpoints: []string{endpoint}, StepTimeout: 7 * time.Second,
		Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))})
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "did not answer within 7s") || !strings.Contains(err.Error(), endpoint) {
		t.Fatalf("Open against %s: %v, want an error naming it and the wait", endpoint, err)
	}
	if took > time.Minute {
		t.Fatalf("Open gave up after %s, want about the 7 s step timeout", took)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "etcd does not answer yet") {
		t.Fatalf("no WARN line while waiting: %q", logs.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
