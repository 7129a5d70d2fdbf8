package httpx

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/problem"
)

// Client is the base of every role's client package: JSON in and out,
// problem bodies decoded back into *problem.Error, a timeout on every call,
// and no retry of a mutating request ever. Only GETs are retried, and only
// when the request never reached the server's handler (a connection error).
type Client struct {
	base    *url.URL
	token   string
	http    *http.Client
	timeout time.Duration
	retries int
}

// ClientOption configures a Client.
type ClientOption func(*Client)

// WithTimeout sets the per-request timeout (default 10s). A context with an
// earlier deadline wins.
func WithTimeout(d time.Duration) ClientOption { return func(c *Client) { c.timeout = d } }

// WithHTTPClient sets the underlying http.Client, normally one built by
// NewHTTPClient with the process's TLS settings and shared by every client
// of the process (its Timeout is ignored in favour of WithTimeout). nil
// leaves the default: NewHTTPClient(nil).
func WithHTTPClient(h *http.Client) ClientOption {
	return func(c *Client) {
		if h != nil {
			c.http = h
		}
	}
}

// WithGetRetries sets how often a GET is retried on a connection error.
func WithGetRetries(n int) ClientOption { return func(c *Client) { c.retries = n } }

// NewClient returns a client for baseURL authenticating with bearer token.
func NewClient(baseURL, token string, opts ...ClientOption) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("invalid URL %q: want http(s)://host:port", baseURL)
	}
	// The base is where the server's routes (/v1/...) hang: a path prefix
	// (a gateway's) is kept, but a query, a fragment or credentials would
	// be dropped or sent on every call, and a base ending in /v1 names
	// every route twice (/v1/v1/payouts, answered 404 as if it did not
	// exist).
	switch {
	case u.User != nil:
		u.User = nil
		return nil, fmt.Errorf("invalid URL %q (credentials removed): no user or password in it (the bearer token is given apart)", u.Redacted())
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return nil, fmt.Errorf("invalid URL %q: want http(s)://host:port, with no query or fragment", baseURL)
	case u.Path == "/v1" || strings.HasSuffix(u.Path, "/v1"):
		return nil, fmt.Errorf("invalid URL %q: drop the /v1, the client adds it to every route (want http(s)://host:port)", baseURL)
	}
	c := &Client{base: u, token: token, timeout: 10 * time.Second, retries: 2}
	for _, o := range opts {
		o(c)
	}
	if c.http == nil {
		c.http = NewHTTPClient(nil)
	}
	return c, nil
}

// BaseURL is the server's base URL.
func (c *Client) BaseURL() string { return c.base.String() }

// WhoAmI asks the server which identity the client's token has there
// (GET /v1/whoami).
func (c *Client) WhoAmI(ctx context.Context) (auth.Identity, error) {
	var id auth.Identity
	err := c.Get(ctx, WhoAmIPath, nil, &id)
	return id, err
}

// RoleCheckTimeout bounds RoleRefusal's question: a server that hangs
// does not hold its caller's start for a whole call timeout.
const RoleCheckTimeout = 5 * time.Second

// RoleRefusal asks a server (who: a client's WhoAmI) which identity it
// knows the caller's token as, before the caller does anything a later
// refusal would leave half done. refusal is the server's refusal of the
// token (401, 403), or a forbidden problem when the identity may not do
// what the caller is about to (may false; doing says what, for the
// message); askErr is why the server could not be asked (an older one
// without the route, one that does not answer): the caller's own requests
// will say then.
func RoleRefusal(ctx context.Context, who func(context.Context) (auth.Identity, error), may func(auth.Identity) bool, doing string) (refusal, askErr error) {
	ctx, cancel := context.WithTimeout(ctx, RoleCheckTimeout)
	defer cancel()
	id, err := who(ctx)
	switch {
	case problem.RefusedToken(err):
		return err, nil
	case err != nil:
		return nil, err
	case !may(id):
		return problem.New(problem.Forbidden, "the token is %s's, of role %s, which may not %s there", id.Name, id.Role, doing), nil
	}
	return nil, nil
}

// Get does a GET of path (with query) into out.
func (c *Client) Get(ctx context.Context, path string, query url.Values, out any) error {
	var err error
	for attempt := 0; attempt <= c.retries; attempt++ {
		err = c.do(ctx, http.MethodGet, path, query, nil, out)
		if err == nil || !isConnError(err) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt+1) * 100 * time.Millisecond):
		}
	}
	return err
}

// Post sends in as JSON and decodes the answer into out. Never retried.
func (c *Client) Post(ctx context.Context, path string, in, out any) error {
	return c.do(ctx, http.MethodPost, path, nil, in, out)
}

// Put sends in as JSON. Never retried.
func (c *Client) Put(ctx context.Context, path string, in, out any) error {
	return c.do(ctx, http.MethodPut, path, nil, in, out)
}

// Delete sends a DELETE. Never retried.
func (c *Client) Delete(ctx context.Context, path string, out any) error {
	return c.do(ctx, http.MethodDelete, path, nil, nil, out)
}

// ErrTransport marks an error where no answer came back from the server:
// for a mutating request the effect is unknown.
var ErrTransport = errors.New("no answer from server")

func isConnError(err error) bool {
	return errors.Is(err, ErrTransport)
}

func (c *Client) do(ctx context.Context, method, path string, query url.Values, in, out any) error {
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	u := *c.base
	u.Path = c.base.Path + path
	if rp, err := url.PathUnescape(u.Path); err == nil && rp != u.Path {
		u.RawPath = c.base.Path + path
		u.Path = rp
	}
	if len(query) > 0 {
		u.RawQuery = query.Encode()
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s %s: %w: %w", method, path, ErrTransport, ctx.Err())
		}
		return fmt.Errorf("%s %s: %w: %v", method, path, ErrTransport, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return problem.Decode(resp)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	dec := json.NewDecoder(io.LimitReader(resp.Body, 64<<20))
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode response: %w", method, path, err)
	}
	// The decoder stops at the end of the value; a body closed before its
	// end (a chunked one's last chunk unread) costs the connection.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return nil
}

// PathEscape escapes one path segment (lock keys contain ':').
func PathEscape(s string) string { return url.PathEscape(s) }
