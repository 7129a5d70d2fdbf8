// Package lockclient is the lock service's client: sessions that keep
// themselves alive and know, from their own monotonic clock, when they can
// no longer trust their grants; and plain reads of the grant log.
//
// It is modelled on etcd's concurrency package. A Session is HEALTHY while
// keepalives are acknowledged, JEOPARDY once one fails (its deadline has not
// passed: finish nothing new), and LOST, for good, once its deadline passes
// or the service says it expired. The deadline is the send time of the last
// acknowledged keepalive + TTL − a safety margin (D-11), deliberately earlier
// than the server's expiry: the client gives up before the lock is freed.
// The check narrows the window; the fencing token closes it.
package lockclient

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
)

// Sentinel errors. The service's own errors compare equal to the matching
// sentinel with errors.Is (they share the problem code).
var (
	// ErrLockHeld: another session holds the key.
	ErrLockHeld error = problem.New(problem.LockHeld, "lockclient: lock held by another session")
	// ErrNotHeld: a release named a grant that is not current.
	ErrNotHeld error = problem.New(problem.NotHeld, "lockclient: lock not held by this grant")
	// ErrSessionExpired: the service no longer knows the session as live.
	ErrSessionExpired error = problem.New(problem.SessionExpired, "lockclient: session expired")
	// ErrSessionLost: the session is LOST (its local deadline passed, or it
	// expired or was closed); open a new one.
	ErrSessionLost = errors.New("lockclient: session lost")
	// ErrJeopardy: a keepalive failed and the session may be about to be
	// lost; no new step (such as an acquire) is started.
	ErrJeopardy = errors.New("lockclient: session in jeopardy (a keepalive failed)")
)

// Default settings.
const (
	DefaultTTL            = 10 * time.Second
	DefaultRequestTimeout = 10 * time.Second
)

type options struct {
	token          string
	ttl            time.Duration
	margin         time.Duration
	requestTimeout time.Duration
	httpClient     *http.Client
	logger         *slog.Logger
}

// Option configures a Client or Session.
type Option func(*options)

// WithToken sets the bearer token (the caller's role token). Always needed
// unless the service runs with --insecure-no-auth.
func WithToken(token string) Option { return func(o *options) { o.token = token } }

// WithTTL sets the session TTL (1s..5min; default 10s). Shorter frees a dead
// client's locks sooner and costs more keepalives (one every TTL/3).
func WithTTL(d time.Duration) Option { return func(o *options) { o.ttl = d } }

// WithSafetyMargin sets how much earlier than TTL after the last
// acknowledged keepalive the session gives up (default TTL/10). Raise it
// when the caller's steps may be slow to notice cancellation.
func WithSafetyMargin(d time.Duration) Option { return func(o *options) { o.margin = d } }

// WithRequestTimeout bounds each request that does not wait (default 10s;
// keepalives are bounded by the session's deadline too).
func WithRequestTimeout(d time.Duration) Option { return func(o *options) { o.requestTimeout = d } }

// WithHTTPClient replaces the HTTP client (tests, custom transports).
func WithHTTPClient(c *http.Client) Option { return func(o *options) { o.httpClient = c } }

// WithLogger sets where session state changes are logged.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

func buildOptions(opts []Option) options {
	o := options{ttl: DefaultTTL, requestTimeout: DefaultRequestTimeout, logger: slog.Default()}
	for _, fn := range opts {
		fn(&o)
	}
	if o.margin <= 0 {
		o.margin = o.ttl / 10
	}
	return o
}

// Client makes session-less calls: the grant log, the high token,
// introspection and the operator's revoke.
type Client struct {
	hc   *httpx.Client // bounded requests
	wait *httpx.Client // waiting acquires: bounded by the caller's context
	o    options
}

// New returns a client of the lock service at url.
func New(url string, opts ...Option) (*Client, error) {
	o := buildOptions(opts)
	var hopts []httpx.ClientOption
	if o.httpClient != nil {
		hopts = append(hopts, httpx.WithHTTPClient(o.httpClient))
	}
	hc, err := httpx.NewClient(url, o.token, append(hopts, httpx.WithTimeout(o.requestTimeout))...)
	if err != nil {
		return nil, err
	}
	wait, err := httpx.NewClient(url, o.token, append(hopts, httpx.WithTimeout(0))...)
	if err != nil {
		return nil, err
	}
	return &Client{hc: hc, wait: wait, o: o}, nil
}

// BaseURL is the service's URL.
func (c *Client) BaseURL() string { return c.hc.BaseURL() }

func lockPath(key string) string { return "/v1/locks/" + httpx.PathEscape(key) }

// Grants reads the grant log: records with token > after, in token order,
// at most limit (1..1000; 0 means 100).
func (c *Client) Grants(ctx context.Context, after fencing.Token, limit int) (GrantPage, error) {
	q := url.Values{"after_token": {strconv.FormatInt(int64(after), 10)}}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var p GrantPage
	err := c.hc.Get(ctx, "/v1/grants", q, &p)
	return p, err
}

// AllGrants reads the whole grant log after a token, page by page.
func (c *Client) AllGrants(ctx context.Context, after fencing.Token) ([]GrantRecord, error) {
	var out []GrantRecord
	for {
		p, err := c.Grants(ctx, after, 1000)
		if err != nil {
			return out, err
		}
		out = append(out, p.Items...)
		if p.Next == "" || len(p.Items) == 0 {
			return out, nil
		}
		after = p.Items[len(p.Items)-1].Token
	}
}

// HighToken is the service's high token: at or above every token it has
// issued, below every one it will issue.
func (c *Client) HighToken(ctx context.Context) (fencing.Token, error) {
	var r HighTokenResponse
	err := c.hc.Get(ctx, "/v1/tokens/high", nil, &r)
	return r.Token, err
}

// Lock reads one key (introspection only).
func (c *Client) Lock(ctx context.Context, key string) (LockInfo, error) {
	var l LockInfo
	err := c.hc.Get(ctx, lockPath(key), nil, &l)
	return l, err
}

// Locks lists held keys starting with prefix (introspection only).
func (c *Client) Locks(ctx context.Context, prefix string) ([]LockInfo, error) {
	var l LockList
	err := c.hc.Get(ctx, "/v1/locks", url.Values{"prefix": {prefix}}, &l)
	return l.Items, err
}

// SessionInfo reads a session.
func (c *Client) SessionInfo(ctx context.Context, id string) (SessionInfo, error) {
	var s SessionInfo
	err := c.hc.Get(ctx, "/v1/sessions/"+httpx.PathEscape(id), nil, &s)
	return s, err
}

// KeepAlive renews session id once (for tools and tests; a Session renews
// itself).
func (c *Client) KeepAlive(ctx context.Context, id string) (SessionInfo, error) {
	var s SessionInfo
	err := c.hc.Post(ctx, "/v1/sessions/"+httpx.PathEscape(id)+"/keepalive", struct{}{}, &s)
	return s, err
}

// Revoke force-frees key (operator role only; reason required). The
// holder's grant ends as revoked and the next grant's token is higher.
func (c *Client) Revoke(ctx context.Context, key, reason string) (GrantRecord, error) {
	var r GrantRecord
	err := c.hc.Post(ctx, lockPath(key)+"/revoke", RevokeRequest{Reason: reason}, &r)
	return r, err
}
