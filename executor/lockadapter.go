package executor

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
)

// lockService opens lockclient sessions.
type lockService struct {
	c *lockclient.Client
}

func newLockService(url, token string, ttl, timeout time.Duration, log *slog.Logger, hc *http.Client) (locker, error) {
	c, err := lockclient.New(url, lockclient.WithToken(token), lockclient.WithTTL(ttl),
		lockclient.WithRequestTimeout(timeout), lockclient.WithLogger(log), lockclient.WithHTTPClient(hc))
	if err != nil {
		return nil, err
	}
	return lockService{c: c}, nil
}

func (l lockService) Open(ctx context.Context, owner string) (session, error) {
	s, err := l.c.Open(ctx, owner)
	if err != nil {
		return nil, err
	}
	return lockSession{s: s}, nil
}

type lockSession struct {
	s *lockclient.Session
}

func (s lockSession) TryAcquire(ctx context.Context, key string) (grant, error) {
	g, err := s.s.TryAcquire(ctx, key)
	if err != nil {
		return nil, err
	}
	return lockGrant{g: g, s: s.s}, nil
}

func (s lockSession) Acquire(ctx context.Context, key string, wait time.Duration) (grant, error) {
	g, err := s.s.Acquire(ctx, key, wait)
	if err != nil {
		return nil, err
	}
	return lockGrant{g: g, s: s.s}, nil
}

func (s lockSession) Healthy() bool                   { return s.s.State() == lockclient.Healthy }
func (s lockSession) Lost() bool                      { return s.s.State() == lockclient.Lost }
func (s lockSession) ID() string                      { return s.s.ID() }
func (s lockSession) Close(ctx context.Context) error { return s.s.Close(ctx) }

type lockGrant struct {
	g *lockclient.Grant
	s *lockclient.Session
}

func (g lockGrant) Key() string            { return g.g.Key }
func (g lockGrant) Token() fencing.Token   { return g.g.Token }
func (g lockGrant) Holder() fencing.Holder { return g.g.Holder() }

// Valid: not lost, and not in jeopardy either — JEOPARDY starts nothing new.
func (g lockGrant) Valid() bool {
	return g.g.Valid() && g.s.State() == lockclient.Healthy
}

func (g lockGrant) Done() <-chan struct{}             { return g.g.Context().Done() }
func (g lockGrant) Release(ctx context.Context) error { return g.s.Release(ctx, g.g) }
