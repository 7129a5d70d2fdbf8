package lockclient

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
)

// Grant is a held lock. Its Token is the fencing token to present to every
// guard, with Holder() as the holder.
type Grant struct {
	Key       string
	Owner     string
	Token     fencing.Token
	SessionID string
	// ServerExpiry is the service's view of when the session expires
	// (informational; another clock).
	ServerExpiry time.Time
	// Deadline is the session's local deadline when the grant was made; it
	// moves later with each keepalive (see Session.Deadline).
	Deadline time.Time

	s      *Session
	ctx    context.Context
	cancel context.CancelFunc
}

// Holder is the holder identity to present with the token (the session id).
func (g *Grant) Holder() fencing.Holder { return fencing.Holder(g.SessionID) }

// Context is cancelled when the session is lost or closed, or the grant is
// released. Run every step of the work under it.
func (g *Grant) Context() context.Context { return g.ctx }

// Valid reports whether a new step may start under the grant: not
// released, and the session HEALTHY. In JEOPARDY (a keepalive failed, the
// deadline not passed) it is false until a keepalive gets through again
// (D-11: start no new step); once LOST, for good. Liveness only: the
// guards' fence is what makes a late write harmless.
func (g *Grant) Valid() bool {
	if g.ctx.Err() != nil {
		return false
	}
	return g.s.State() == Healthy
}

// TryAcquire acquires key if it is free now (ErrLockHeld otherwise).
func (s *Session) TryAcquire(ctx context.Context, key string) (*Grant, error) {
	return s.Acquire(ctx, key, 0)
}

// Acquire acquires key, waiting up to wait for it to become free. A
// request that got no answer is retried: a re-acquire by the same session
// is idempotent (same token), so a retry never mints a second grant.
func (s *Session) Acquire(ctx context.Context, key string, wait time.Duration) (*Grant, error) {
	if wait < 0 {
		wait = 0
	}
	for attempt := 0; ; attempt++ {
		switch st := s.State(); st {
		case Lost:
			return nil, s.Err()
		case Jeopardy:
			return nil, ErrJeopardy
		}
		rctx, cancel := context.WithTimeout(ctx, wait+s.c.o.requestTimeout)
		var info GrantInfo
		err := s.c.wait.Post(rctx, lockPath(key)+"/acquire", AcquireRequest{SessionID: s.id, WaitMS: wait.Milliseconds()}, &info)
		cancel()
		if errors.Is(err, httpx.ErrTransport) && ctx.Err() == nil && attempt < 3 {
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(attempt+1) * 50 * time.Millisecond):
			}
			continue
		}
		if problem.Has(err, problem.SessionExpired) {
			s.lose(fmt.Errorf("%w: %w", ErrSessionLost, err))
			return nil, s.Err()
		}
		if err != nil {
			return nil, err
		}
		return s.register(info)
	}
}

func (s *Session) register(info GrantInfo) (*Grant, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checkDeadlineLocked()
	if s.state == Lost {
		return nil, s.lostErr
	}
	if !info.Token.Valid() || info.Key == "" || info.SessionID != s.id {
		return nil, fmt.Errorf("lockclient: the service answered an acquire with an invalid grant (%+v)", info)
	}
	g := &Grant{Key: info.Key, Owner: info.Owner, Token: info.Token, SessionID: info.SessionID,
		ServerExpiry: info.ServerExpiry, Deadline: s.deadline, s: s}
	// The session tracks one Grant per key, the newest: a key acquired
	// again and again is tracked once, not once per acquire for the
	// session's life. An acquire of a key the session holds answers the
	// same token: the same lock, so the new Grant shares the earlier one's
	// context (released, or lost, through either, both end). A new token
	// means the earlier lock ended: its Grant is cancelled.
	if old := s.grants[g.Key]; old != nil {
		if old.Token == g.Token {
			g.ctx, g.cancel = old.ctx, old.cancel
		} else {
			old.cancel()
		}
	}
	if g.ctx == nil {
		g.ctx, g.cancel = context.WithCancel(context.Background())
	}
	s.grants[g.Key] = g
	return g, nil
}

// Release releases g (compare-and-delete on key, session and token). Its
// context is cancelled whatever the outcome, and with it that of every
// Grant of the same lock; ErrNotHeld when the grant was no longer current
// (revoked or expired).
func (s *Session) Release(ctx context.Context, g *Grant) error {
	if g == nil || g.s != s {
		return errors.New("lockclient: release of a grant from another session")
	}
	s.mu.Lock()
	if cur := s.grants[g.Key]; cur != nil && cur.Token == g.Token {
		// The same lock, perhaps through a Grant a later acquire made
		// (after a release of g that got no verdict): the release ends it.
		delete(s.grants, g.Key)
		cur.cancel()
	}
	s.mu.Unlock()
	g.cancel()
	return s.c.hc.Post(ctx, lockPath(g.Key)+"/release", ReleaseRequest{SessionID: s.id, Token: g.Token}, nil)
}
