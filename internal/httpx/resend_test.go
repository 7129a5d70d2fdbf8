package httpx_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
)

// resendRecorder is a transport that notes whether a request it was given
// could be sent again (its GetBody), then passes it on.
type resendRecorder struct {
	next       http.RoundTripper
	resendable atomic.Int32
}

func (r *resendRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.GetBody != nil {
		r.resendable.Add(1)
	}
	return r.next.RoundTrip(req)
}

// TestMutatingRequestsCannotBeResent: the transport never gets a way to send
// a POST, PUT or DELETE again. HTTP/2 resends a request whose stream the
// server reset with a protocol error when it can rebuild the body, and the
// server may have acted on it first: a payment at the rail made twice.
func TestMutatingRequestsCannotBeResent(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(srv.Close)
	rec := &resendRecorder{next: http.DefaultTransport}
	c, err := httpx.NewClient(srv.URL, "t", httpx.WithHTTPClient(&http.Client{Transport: rec}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var out map[string]any
	if err := c.Post(ctx, "/v1/payments", map[string]any{"amount": 1}, &out); err != nil {
		t.Fatal(err)
	}
	if err := c.Put(ctx, "/v1/x", map[string]any{"a": 1}, &out); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, "/v1/x", &out); err != nil {
		t.Fatal(err)
	}
	if n := rec.resendable.Load(); n != 0 {
		t.Fatalf("%d mutating requests reached the transport with a body it could send again", n)
	}
}

// TestRedirectsAreNotFollowed: the roles never redirect, so a redirect
// comes from something in between. Followed, a POST would reach a server
// nobody configured (307/308), or turn into a GET whose answer reads as the
// POST's (301/302/303). The caller gets an error of no known kind instead:
// for a mutation, its outcome is unknown.
func TestRedirectsAreNotFollowed(t *testing.T) {
	t.Parallel()
	var reached atomic.Int32
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"items":[]}`))
	}))
	t.Cleanup(elsewhere.Close)
	for _, status := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, elsewhere.URL+r.URL.Path, status)
		}))
		c, err := httpx.NewClient(front.URL, "t", httpx.WithHTTPClient(httpx.NewHTTPClient(nil)))
		if err != nil {
			t.Fatal(err)
		}
		var out map[string]any
		err = c.Post(context.Background(), "/v1/submissions", map[string]any{"payout_id": "p"}, &out)
		var pe *problem.Error
		if !errors.As(err, &pe) || pe.Code != problem.Internal {
			t.Errorf("POST answered %d: error %v; want a problem of code internal (an answer of no known kind)", status, err)
		}
		front.Close()
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("a redirect was followed %d times", n)
	}
}
