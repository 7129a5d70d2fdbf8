package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// echoServer answers each line with the same line.
func echoServer(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var lines atomic.Int64
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					lines.Add(1)
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), &lines
}

func newLink(t *testing.T, target string) *Link {
	t.Helper()
	l, err := Listen("test", target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// roundTrip writes a line on c and reads the answer within timeout.
func roundTrip(c net.Conn, r *bufio.Reader, msg string, timeout time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	line, err := r.ReadString('\n')
	return strings.TrimSuffix(line, "\n"), err
}

func dial(t *testing.T, l *Link) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", l.Addr(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func isReset(err error) bool {
	// A reset shows as ECONNRESET, or as EOF when the RST races the read.
	return err != nil && !isTimeout(err) && (errors.Is(err, io.EOF) || strings.Contains(err.Error(), "reset") || strings.Contains(err.Error(), "broken pipe"))
}

func TestPassForwardsBothWays(t *testing.T) {
	target, _ := echoServer(t)
	l := newLink(t, target)
	c, r := dial(t, l)
	for _, msg := range []string{"one", "two", strings.Repeat("x", 100_000)} {
		got, err := roundTrip(c, r, msg, 30*time.Second)
		if err != nil || got != msg {
			t.Fatalf("echo of %d bytes: got %d bytes, %v", len(msg), len(got), err)
		}
	}
	if m, _ := l.Mode(); m != Pass {
		t.Fatalf("mode %v, want pass", m)
	}
}

func TestBlackholeSwallowsThenResetsOnHeal(t *testing.T) {
	target, lines := echoServer(t)
	l := newLink(t, target)
	old, oldR := dial(t, l)
	if _, err := roundTrip(old, oldR, "before", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := l.Set(Blackhole, 0); err != nil {
		t.Fatal(err)
	}
	// An open connection: the request is swallowed, no answer comes.
	if _, err := roundTrip(old, oldR, "lost", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("open connection in a blackhole: %v, want a timeout", err)
	}
	// A new connection is accepted (the dial succeeds) but never answered.
	fresh, freshR := dial(t, l)
	if _, err := roundTrip(fresh, freshR, "also lost", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("new connection in a blackhole: %v, want a timeout", err)
	}
	if n := lines.Load(); n != 1 {
		t.Fatalf("the target saw %d lines, want only the one sent before the blackhole", n)
	}
	if l.Stats().Swallow == 0 {
		t.Fatal("no bytes counted as swallowed")
	}
	// Heal: connections that lost bytes are reset; new ones work.
	if err := l.Set(Pass, 0); err != nil {
		t.Fatal(err)
	}
	_ = old.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := oldR.ReadString('\n'); !isReset(err) {
		t.Fatalf("a connection that lost bytes after the heal: %v, want reset", err)
	}
	c, r := dial(t, l)
	if got, err := roundTrip(c, r, "after", 30*time.Second); err != nil || got != "after" {
		t.Fatalf("after the heal: %q, %v", got, err)
	}
}

func TestResetEndsOpenAndNewConnections(t *testing.T) {
	target, _ := echoServer(t)
	l := newLink(t, target)
	old, oldR := dial(t, l)
	if _, err := roundTrip(old, oldR, "hi", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := l.Set(Reset, 0); err != nil {
		t.Fatal(err)
	}
	_ = old.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := oldR.ReadString('\n'); !isReset(err) {
		t.Fatalf("open connection after reset: %v, want reset", err)
	}
	// A new connection is reset as soon as it is accepted: the dial itself
	// or the first exchange fails.
	if c, err := net.DialTimeout("tcp", l.Addr(), 10*time.Second); err == nil {
		_, err = roundTrip(c, bufio.NewReader(c), "x", 30*time.Second)
		c.Close()
		if !isReset(err) {
			t.Fatalf("new connection in reset mode: %v, want reset", err)
		}
	} else if !strings.Contains(err.Error(), "reset") {
		t.Fatalf("dial in reset mode: %v, want reset", err)
	}
	if l.Stats().Reset < 2 {
		t.Fatalf("reset count %d, want at least 2", l.Stats().Reset)
	}
	if err := l.Set(Pass, 0); err != nil {
		t.Fatal(err)
	}
	c2, r2 := dial(t, l)
	if got, err := roundTrip(c2, r2, "back", 30*time.Second); err != nil || got != "back" {
		t.Fatalf("after reset mode ends: %q, %v", got, err)
	}
}

func TestDelayAddsLatencyAndSwitchesAtRunTime(t *testing.T) {
	target, _ := echoServer(t)
	l := newLink(t, target)
	c, r := dial(t, l)
	const d = 150 * time.Millisecond
	if err := l.Set(Delay, d); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if got, err := roundTrip(c, r, "slow", 30*time.Second); err != nil || got != "slow" {
		t.Fatalf("delayed echo: %q, %v", got, err)
	}
	// The request and the answer are each held back by d.
	if el := time.Since(start); el < 2*d {
		t.Fatalf("round trip took %s with %s added each way, want at least %s", el, d, 2*d)
	}
	if m, got := l.Mode(); m != Delay || got != d {
		t.Fatalf("mode %v %s", m, got)
	}
	// Back to pass on the same connection: no reset, answers again.
	if err := l.Set(Pass, 0); err != nil {
		t.Fatal(err)
	}
	if got, err := roundTrip(c, r, "fast", 30*time.Second); err != nil || got != "fast" {
		t.Fatalf("same connection after the delay ends: %q, %v", got, err)
	}
}

func TestHTTPClientSeesEachMode(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	t.Cleanup(srv.Close)
	l := newLink(t, strings.TrimPrefix(srv.URL, "http://"))
	// A short timeout only where the subject is the client timing out
	// (blackhole); elsewhere an answer, or a connection error, must come
	// however loaded the machine. Both share the default transport.
	short := &http.Client{Timeout: 500 * time.Millisecond}
	generous := &http.Client{Timeout: 30 * time.Second}
	get := func(cl *http.Client) error {
		resp, err := cl.Get(l.URL("http"))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil && string(b) != "ok" {
			err = errors.New("body " + string(b))
		}
		return err
	}
	if err := get(generous); err != nil {
		t.Fatalf("pass: %v", err)
	}
	_ = l.Set(Blackhole, 0)
	if err := get(short); err == nil || !isTimeout(err) {
		t.Fatalf("blackhole: %v, want a client timeout", err)
	}
	_ = l.Set(Reset, 0)
	if err := get(generous); err == nil || isTimeout(err) {
		t.Fatalf("reset: %v, want a connection error that is not a timeout", err)
	}
	_ = l.Set(Pass, 0)
	if err := get(generous); err != nil {
		t.Fatalf("healed: %v", err)
	}
}

func TestSetRejectsBadModes(t *testing.T) {
	target, _ := echoServer(t)
	l := newLink(t, target)
	if err := l.Set(Delay, 0); err == nil {
		t.Fatal("delay without a duration accepted")
	}
	if err := l.Set(Mode(42), 0); err == nil {
		t.Fatal("unknown mode accepted")
	}
	for _, m := range []Mode{Pass, Blackhole, Reset, Delay} {
		got, err := ParseMode(m.String())
		if err != nil || got != m {
			t.Fatalf("ParseMode(%q) = %v, %v", m, got, err)
		}
	}
	if _, err := ParseMode("lossy"); err == nil {
		t.Fatal("ParseMode accepted an unknown mode")
	}
}

func TestProxyNamesLinksAndClosesThem(t *testing.T) {
	target, _ := echoServer(t)
	p := New()
	a, err := p.Link("a", target)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Link("a", target); err == nil {
		t.Fatal("duplicate link name accepted")
	}
	b, err := p.Link("b", target)
	if err != nil {
		t.Fatal(err)
	}
	if p.Get("b") != b || len(p.Links()) != 2 {
		t.Fatal("links not recorded")
	}
	_ = a.Set(Blackhole, 0)
	_ = b.Set(Delay, time.Second)
	p.HealAll()
	for _, l := range p.Links() {
		if m, _ := l.Mode(); m != Pass {
			t.Fatalf("link %s is %v after HealAll", l.Name, m)
		}
	}
	c, r := dial(t, a)
	if got, err := roundTrip(c, r, "x", 30*time.Second); err != nil || got != "x" {
		t.Fatalf("%q %v", got, err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := net.DialTimeout("tcp", a.Addr(), time.Second); err == nil {
		t.Fatal("a closed link still accepts")
	}
	// An open connection ends with the proxy.
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := r.ReadString('\n'); err == nil || isTimeout(err) {
		t.Fatalf("open connection after Close: %v", err)
	}
}
