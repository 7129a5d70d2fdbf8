package lockclient

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
)

var errClosed = errors.New("closed")

// State is a session's client-side state.
type State int

// The states, in the only order they are ever entered (JEOPARDY may return
// to HEALTHY; LOST is terminal).
const (
	Healthy State = iota
	Jeopardy
	Lost
)

func (s State) String() string {
	switch s {
	case Healthy:
		return "HEALTHY"
	case Jeopardy:
		return "JEOPARDY"
	case Lost:
		return "LOST"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Session is a live session with the lock service. It renews itself every
// TTL/3 until closed or lost. Safe for concurrent use.
type Session struct {
	c     *Client
	id    string
	owner string
	ttl   time.Duration

	mu       sync.Mutex
	state    State
	deadline time.Time // monotonic: from time.Now()
	lostErr  error
	grants   map[string]*Grant // key -> the newest Grant of it (register)
	done     chan struct{}

	stop     chan struct{}
	stopOnce sync.Once
	loop     sync.WaitGroup
	loopCtx  context.Context // cancelled on stop: ends a keepalive in flight
	cancel   context.CancelFunc
}

// Open starts a session for owner with the lock service at url.
func Open(ctx context.Context, url, owner string, opts ...Option) (*Session, error) {
	c, err := New(url, opts...)
	if err != nil {
		return nil, err
	}
	return c.Open(ctx, owner)
}

// Open starts a session for owner.
func (c *Client) Open(ctx context.Context, owner string) (*Session, error) {
	sent := time.Now()
	var info SessionInfo
	if err := c.hc.Post(ctx, "/v1/sessions", CreateSessionRequest{Owner: owner, TTLMS: c.o.ttl.Milliseconds()}, &info); err != nil {
		return nil, fmt.Errorf("lockclient: open session: %w", err)
	}
	ttl := time.Duration(info.TTLMS) * time.Millisecond
	if ttl <= 0 || info.SessionID == "" {
		return nil, fmt.Errorf("lockclient: open session: the service answered without a session id or TTL")
	}
	s := &Session{
		c: c, id: info.SessionID, owner: owner, ttl: ttl,
		deadline: sent.Add(ttl - c.o.margin),
		grants:   map[string]*Grant{},
		done:     make(chan struct{}),
		stop:     make(chan struct{}),
	}
	s.loopCtx, s.cancel = context.WithCancel(context.Background())
	s.loop.Add(1)
	go s.keepAlive()
	return s, nil
}

// ID is the session id: the holder identity the guards see.
func (s *Session) ID() string { return s.id }

// Owner is the owner name the session was opened with.
func (s *Session) Owner() string { return s.owner }

// TTL is the TTL the service applied.
func (s *Session) TTL() time.Duration { return s.ttl }

// Client is the session-less client the session uses.
func (s *Session) Client() *Client { return s.c }

// Done is closed when the session is lost or closed.
func (s *Session) Done() <-chan struct{} { return s.done }

// Deadline is the current local deadline (monotonic).
func (s *Session) Deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

// State is the session's state now. Passing the deadline makes it LOST
// here, whether or not the keepalive loop has noticed yet.
func (s *Session) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checkDeadlineLocked()
	return s.state
}

// Err is why the session was lost (nil while it is not).
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checkDeadlineLocked()
	return s.lostErr
}

func (s *Session) checkDeadlineLocked() {
	if s.state != Lost && !time.Now().Before(s.deadline) {
		s.loseLocked(fmt.Errorf("%w: local deadline passed without an acknowledged keepalive", ErrSessionLost))
	}
}

func (s *Session) loseLocked(why error) {
	if s.state == Lost {
		return
	}
	s.state = Lost
	s.lostErr = why
	close(s.done)
	for _, g := range s.grants {
		g.cancel()
	}
	s.grants = map[string]*Grant{}
	if !errors.Is(why, errClosed) {
		s.c.o.logger.Warn("lock session lost", "session_id", s.id, "owner", s.owner, "error", why.Error())
	}
}

func (s *Session) lose(why error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loseLocked(why)
}

// keepAlive renews every TTL/3 (sooner while in jeopardy) and turns the
// session LOST when its deadline passes.
func (s *Session) keepAlive() {
	defer s.loop.Done()
	interval := s.ttl / 3
	// Keepalives go every interval from the send of the one before (the
	// first from the open's), however long each took to be answered: the
	// deadline counts from the sends too, so a lock service that answers
	// slowly, but within the interval, never costs the session.
	sent := s.Deadline().Add(-(s.ttl - s.c.o.margin))
	next := time.NewTimer(time.Until(sent.Add(interval)))
	defer next.Stop()
	lost := time.NewTimer(time.Until(s.Deadline()))
	defer lost.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-lost.C:
			s.mu.Lock()
			s.checkDeadlineLocked()
			st, dl := s.state, s.deadline
			s.mu.Unlock()
			if st == Lost {
				return
			}
			lost.Reset(time.Until(dl))
			continue
		case <-next.C:
		}
		sent = time.Now()
		dl := s.Deadline()
		if !sent.Before(dl) {
			s.lose(fmt.Errorf("%w: local deadline passed without an acknowledged keepalive", ErrSessionLost))
			return
		}
		// A keepalive answered after the deadline is useless, and one that
		// hangs for longer than an interval is a failure: bound it by both,
		// so a silent network shows as JEOPARDY well before LOST.
		ctx, cancel := context.WithDeadline(s.loopCtx, minTime(dl, sent.Add(interval)))
		_, err := s.c.KeepAlive(ctx, s.id)
		cancel()
		switch {
		case err == nil:
			s.mu.Lock()
			// An answer read after the deadline passed (this goroutine
			// held up meanwhile: a pause, a stopped process) finds the
			// session LOST, as State() would have: LOST is terminal.
			s.checkDeadlineLocked()
			if s.state != Lost {
				s.deadline = sent.Add(s.ttl - s.c.o.margin)
				if s.state == Jeopardy {
					s.c.o.logger.Info("lock session healthy again", "session_id", s.id)
				}
				s.state = Healthy
				lost.Reset(time.Until(s.deadline))
			}
			st := s.state
			s.mu.Unlock()
			if st == Lost {
				return
			}
			next.Reset(max(interval-time.Since(sent), 0))
		case problem.Has(err, problem.SessionExpired), problem.Has(err, problem.NotSessionOwner):
			// Gone, or not ours to renew (403): either way it will not be
			// renewed by us again.
			s.lose(fmt.Errorf("%w: %w", ErrSessionLost, err))
			return
		case s.loopCtx.Err() != nil:
			return // stopped (Close or Orphan)
		default:
			s.mu.Lock()
			if s.state == Healthy {
				s.state = Jeopardy
				s.c.o.logger.Warn("lock session in jeopardy: keepalive failed", "session_id", s.id, "error", err.Error(),
					"deadline_in_ms", time.Until(s.deadline).Milliseconds())
			}
			s.mu.Unlock()
			next.Reset(max(interval/4, 50*time.Millisecond))
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Orphan stops renewing without closing: the service expires the session
// (and frees its locks) one TTL after the last keepalive, and the session
// goes LOST here at its deadline. For handing a failure to the service, and
// for tests of expiry.
func (s *Session) Orphan() {
	s.stopOnce.Do(func() { close(s.stop); s.cancel() })
	s.loop.Wait()
	s.mu.Lock()
	dl := s.deadline
	s.mu.Unlock()
	// Nothing renews any more: make LOST happen at the deadline even if
	// nobody calls State.
	time.AfterFunc(time.Until(dl), func() { s.State() })
}

// Close stops renewing and closes the session on the service, which
// releases every lock it holds. The session is LOST afterwards.
func (s *Session) Close(ctx context.Context) error {
	s.stopOnce.Do(func() { close(s.stop); s.cancel() })
	s.loop.Wait()
	s.mu.Lock()
	wasLost := s.state == Lost
	s.loseLocked(fmt.Errorf("%w: %w", ErrSessionLost, errClosed))
	s.mu.Unlock()
	err := s.c.hc.Delete(ctx, "/v1/sessions/"+httpx.PathEscape(s.id), nil)
	if wasLost && problem.Has(err, problem.SessionExpired) {
		return nil // already gone on the service too
	}
	return err
}
