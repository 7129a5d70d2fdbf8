// Package faultproxy is a TCP fault proxy on loopback for whole-system
// tests: each link listens on its own 127.0.0.1 port and forwards to one
// target, and its mode can be switched while traffic flows to make the
// link behave like a network partition.
//
// Modes:
//   - Pass: bytes are forwarded both ways.
//   - Blackhole: connections are accepted but nothing is ever answered;
//     every byte in either direction is swallowed, on open connections and
//     new ones. When the link leaves the blackhole, the connections that
//     lost bytes are reset (their streams can no longer be trusted), as a
//     peer's TCP stack would end them after its retransmissions gave up.
//   - Reset: open connections are reset (RST) and new ones are reset as
//     soon as they are accepted.
//   - Delay: bytes are forwarded after an added delay in each direction.
package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Mode is how a link treats its traffic.
type Mode int

const (
	Pass Mode = iota
	Blackhole
	Reset
	Delay
)

func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Blackhole:
		return "blackhole"
	case Reset:
		return "reset"
	case Delay:
		return "delay"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// ParseMode is the inverse of Mode.String.
func ParseMode(s string) (Mode, error) {
	for _, m := range []Mode{Pass, Blackhole, Reset, Delay} {
		if m.String() == s {
			return m, nil
		}
	}
	return Pass, fmt.Errorf("faultproxy: unknown mode %q (want pass, blackhole, reset or delay)", s)
}

// Link is one listening port forwarding to one target.
type Link struct {
	Name   string
	Target string

	ln   net.Listener
	done chan struct{}
	wg   sync.WaitGroup

	mu     sync.Mutex
	mode   Mode
	delay  time.Duration
	conns  map[*conn]struct{}
	closed bool
	stats  Stats
}

// Stats counts what a link did.
type Stats struct {
	Accepted int // connections accepted
	Reset    int // connections reset by the link
	Swallow  int // bytes swallowed by a blackhole
}

// conn is one accepted client connection and its upstream (nil while the
// link swallows it without dialling).
type conn struct {
	client, upstream net.Conn
	lostBytes        bool // a blackhole swallowed some of its bytes
	dead             bool // reset or closed
	once             sync.Once
}

// Listen opens a link on a free loopback port forwarding to target (host:port).
func Listen(name, target string) (*Link, error) {
	return ListenOn(name, "127.0.0.1:0", target)
}

// ListenOn opens a link on addr (a loopback address).
func ListenOn(name, addr, target string) (*Link, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: link %s: %w", name, err)
	}
	l := &Link{Name: name, Target: target, ln: ln, done: make(chan struct{}), conns: map[*conn]struct{}{}}
	l.wg.Add(1)
	go l.accept()
	return l, nil
}

// Addr is the link's listen address (host:port).
func (l *Link) Addr() string { return l.ln.Addr().String() }

// URL is scheme://Addr, e.g. for an HTTP client.
func (l *Link) URL(scheme string) string { return scheme + "://" + l.Addr() }

// Mode returns the current mode and added delay.
func (l *Link) Mode() (Mode, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mode, l.delay
}

// Stats returns the link's counters.
func (l *Link) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stats
}

// Set switches the link's mode; delay is used by Delay only. Open
// connections follow at once: Reset resets them; leaving Blackhole resets
// those that lost bytes.
func (l *Link) Set(mode Mode, delay time.Duration) error {
	if mode < Pass || mode > Delay {
		return fmt.Errorf("faultproxy: unknown mode %d", int(mode))
	}
	if mode == Delay && delay <= 0 {
		return errors.New("faultproxy: the delay mode needs a positive delay")
	}
	l.mu.Lock()
	l.mode, l.delay = mode, delay
	var victims []*conn
	for c := range l.conns {
		switch {
		case mode == Reset:
			victims = append(victims, c)
		case mode == Blackhole:
			c.lostBytes = true // everything from now on is swallowed
		case c.lostBytes:
			victims = append(victims, c)
		}
	}
	l.mu.Unlock()
	for _, c := range victims {
		l.reset(c)
	}
	return nil
}

// Close stops listening and closes every connection.
func (l *Link) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.done)
	var all []*conn
	for c := range l.conns {
		all = append(all, c)
	}
	l.mu.Unlock()
	err := l.ln.Close()
	for _, c := range all {
		l.reset(c)
	}
	l.wg.Wait()
	return err
}

func (l *Link) accept() {
	defer l.wg.Done()
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		c := &conn{client: nc}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			nc.Close()
			return
		}
		l.stats.Accepted++
		l.conns[c] = struct{}{}
		mode := l.mode
		if mode == Blackhole {
			c.lostBytes = true
		}
		l.mu.Unlock()
		l.wg.Add(1)
		go l.serve(c, mode)
	}
}

func (l *Link) serve(c *conn, mode Mode) {
	defer l.wg.Done()
	defer l.forget(c)
	switch mode {
	case Reset:
		l.reset(c)
		return
	case Blackhole:
		// Swallow without dialling; leaving the blackhole resets it.
		l.pump(c.client, nil, c)
		return
	}
	up, err := net.DialTimeout("tcp", l.Target, 10*time.Second)
	if err != nil {
		l.reset(c)
		return
	}
	l.mu.Lock()
	if c.dead { // reset while dialling
		l.mu.Unlock()
		up.Close()
		return
	}
	c.upstream = up
	lost := c.lostBytes
	l.mu.Unlock()
	if lost { // the link went dark while dialling
		l.pump(c.client, nil, c)
		return
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		l.pump(up, c.client, c)
	}()
	l.pump(c.client, up, c)
	wg.Wait()
}

// pump copies src to dst (dst nil: swallow) until src fails, applying the
// link's mode to each chunk as it is read.
func (l *Link) pump(src, dst net.Conn, c *conn) {
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			l.mu.Lock()
			mode, delay, lost := l.mode, l.delay, c.lostBytes
			if mode == Blackhole || lost || dst == nil {
				l.stats.Swallow += n
			}
			l.mu.Unlock()
			switch {
			case mode == Blackhole || lost || dst == nil:
				// swallowed
			case mode == Reset:
				l.reset(c)
				return
			default:
				if mode == Delay {
					select {
					case <-time.After(delay):
					case <-l.done:
						return
					}
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					l.reset(c)
					return
				}
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && dst != nil {
				// Half-close: pass the end of stream on.
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
					return
				}
			}
			l.reset(c)
			return
		}
	}
}

// reset ends both sides of c with RST (linger 0).
func (l *Link) reset(c *conn) {
	c.once.Do(func() {
		l.mu.Lock()
		l.stats.Reset++
		c.dead = true
		up := c.upstream
		l.mu.Unlock()
		for _, nc := range []net.Conn{c.client, up} {
			if nc == nil {
				continue
			}
			if tc, ok := nc.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			_ = nc.Close()
		}
	})
}

// forget drops c from the link and closes what is left of it gracefully
// (its streams ended normally, or it was reset already).
func (l *Link) forget(c *conn) {
	l.mu.Lock()
	delete(l.conns, c)
	c.dead = true
	up := c.upstream
	l.mu.Unlock()
	c.once.Do(func() {
		c.client.Close()
		if up != nil {
			up.Close()
		}
	})
}

// Proxy is a set of named links, closed together.
type Proxy struct {
	mu    sync.Mutex
	links map[string]*Link
	order []string
}

// New returns an empty proxy.
func New() *Proxy { return &Proxy{links: map[string]*Link{}} }

// Link opens a new link named name (unique within the proxy) to target.
func (p *Proxy) Link(name, target string) (*Link, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.links[name]; ok {
		return nil, fmt.Errorf("faultproxy: link %s already exists", name)
	}
	l, err := Listen(name, target)
	if err != nil {
		return nil, err
	}
	p.links[name] = l
	p.order = append(p.order, name)
	return l, nil
}

// Get returns the link named name, or nil.
func (p *Proxy) Get(name string) *Link {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.links[name]
}

// Links lists the links in the order they were opened.
func (p *Proxy) Links() []*Link {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*Link, 0, len(p.order))
	for _, n := range p.order {
		out = append(out, p.links[n])
	}
	return out
}

// HealAll sets every link to Pass.
func (p *Proxy) HealAll() {
	for _, l := range p.Links() {
		_ = l.Set(Pass, 0)
	}
}

// Close closes every link.
func (p *Proxy) Close() error {
	var first error
	for _, l := range p.Links() {
		if err := l.Close(); err != nil && first == nil && !errors.Is(err, net.ErrClosed) {
			first = err
		}
	}
	return first
}
