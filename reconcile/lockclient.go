package reconcile

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
)

// lockService implements LockService over lockclient. Its session is
// opened on the first Acquire (a pass with nothing to resolve holds no
// session) and opened again if it is lost.
type lockService struct {
	c     *lockclient.Client
	url   string
	owner string
	opts  []lockclient.Option

	mu     sync.Mutex
	sess   *lockclient.Session
	grants map[string]*lockclient.Grant // key -> held grant
	// unreleased holds grants whose release got no verdict (the lock
	// service was unreachable or restarting). The session lives on in
	// continuous mode, so such a key would stay held — and every executor
	// skip the account — until the process ends. RetryReleases retries
	// them; a grant is forgotten only once its release is acknowledged.
	unreleased map[string]*lockclient.Grant
}

// NewLockService returns the lock service at url as the reconciler uses
// it: bearer token, session owner and TTL, and per-request timeout (extra:
// further options, such as the HTTP client with the TLS settings).
func NewLockService(url, token, owner string, ttl, requestTimeout time.Duration, extra ...lockclient.Option) (LockService, error) {
	opts := append([]lockclient.Option{lockclient.WithToken(token), lockclient.WithTTL(ttl), lockclient.WithRequestTimeout(requestTimeout)}, extra...)
	c, err := lockclient.New(url, opts...)
	if err != nil {
		return nil, err
	}
	return &lockService{c: c, url: url, owner: owner, opts: opts, grants: map[string]*lockclient.Grant{}, unreleased: map[string]*lockclient.Grant{}}, nil
}

func (l *lockService) Grants(ctx context.Context, after fencing.Token, limit int) ([]GrantRecord, fencing.Token, error) {
	p, err := l.c.Grants(ctx, after, limit)
	if err != nil {
		return nil, 0, err
	}
	out := make([]GrantRecord, 0, len(p.Items))
	for _, g := range p.Items {
		out = append(out, GrantRecord{Token: g.Token, Key: g.Key, SessionID: g.SessionID})
	}
	var next fencing.Token
	if p.Next != "" {
		n, err := strconv.ParseInt(p.Next, 10, 64)
		if err != nil {
			return nil, 0, errors.New("lock service answered a grant-log cursor that is not a token: " + p.Next)
		}
		next = fencing.Token(n)
	}
	return out, next, nil
}

func (l *lockService) HighToken(ctx context.Context) (fencing.Token, error) {
	return l.c.HighToken(ctx)
}

func (l *lockService) session(ctx context.Context) (*lockclient.Session, error) {
	if l.sess != nil && l.sess.State() != lockclient.Lost {
		return l.sess, nil
	}
	if l.sess != nil {
		// Lost here (its deadline passed unrenewed) is not gone there:
		// close it, so that its locks are freed now rather than when the
		// lock service expires it.
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_ = l.sess.Close(cctx)
		cancel()
		l.sess = nil
	}
	s, err := l.c.Open(ctx, l.owner)
	if err != nil {
		return nil, err
	}
	// A new session: whatever the old one held ended with it.
	l.sess = s
	l.grants = map[string]*lockclient.Grant{}
	l.unreleased = map[string]*lockclient.Grant{}
	return s, nil
}

func (l *lockService) Acquire(ctx context.Context, key string, wait time.Duration) (Lease, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, err := l.session(ctx)
	if err != nil {
		return Lease{}, false, err
	}
	g, err := s.Acquire(ctx, key, wait)
	if problem.Has(err, problem.LockHeld) {
		return Lease{}, true, nil
	}
	if err != nil {
		return Lease{}, false, err
	}
	// A re-acquire of a key whose release failed returns the same grant;
	// it is released again when this lease ends.
	delete(l.unreleased, key)
	l.grants[key] = g
	return Lease{Token: g.Token, Holder: g.Holder(), Ctx: g.Context(),
		Healthy: func() bool { return s.State() == lockclient.Healthy }}, false, nil
}

func (l *lockService) Release(ctx context.Context, key string, lease Lease) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.grants[key]
	if g == nil || g.Token != lease.Token || l.sess == nil {
		return errors.New("reconcile: release of a lease this reconciler does not hold: " + key)
	}
	delete(l.grants, key)
	err := l.sess.Release(ctx, g)
	if !releaseSettled(err) {
		l.unreleased[key] = g
	}
	return err
}

// RetryReleases retries every release that got no verdict.
func (l *lockService) RetryReleases(ctx context.Context) (pending int, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sess == nil {
		clear(l.unreleased)
		return 0, nil
	}
	for key, g := range l.unreleased {
		rerr := l.sess.Release(ctx, g)
		if releaseSettled(rerr) {
			delete(l.unreleased, key)
			continue
		}
		err = rerr
	}
	return len(l.unreleased), err
}

// releaseSettled: the lock service gave a verdict on a release — done, or
// the key or the session is no longer ours (nothing left to give back).
func releaseSettled(err error) bool {
	return err == nil || problem.Has(err, problem.NotHeld) || problem.Has(err, problem.SessionExpired) ||
		errors.Is(err, lockclient.ErrSessionLost)
}

func (l *lockService) Close(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sess == nil {
		return nil
	}
	err := l.sess.Close(ctx)
	l.sess = nil
	clear(l.unreleased)
	return err
}
