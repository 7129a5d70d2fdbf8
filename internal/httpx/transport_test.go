package httpx_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
)

// TestClientsSpeakHTTP1OverTLS: the clients never use HTTP/2, even with a
// server that offers it. Go's HTTP/2 client sends a request again, body
// and all, when the server resets its stream with a protocol error, which
// it may do after acting on it: a payment at the rail made twice. HTTP/1.1
// sends a POST again only when not a byte of it was written.
func TestClientsSpeakHTTP1OverTLS(t *testing.T) {
	t.Parallel()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"proto":%q}`, r.Proto)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	c, err := httpx.NewClient(srv.URL, "t", httpx.WithHTTPClient(httpx.NewHTTPClient(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	var out struct{ Proto string }
	if err := c.Post(context.Background(), "/v1/payments", map[string]any{"amount": 1}, &out); err != nil {
		t.Fatal(err)
	}
	if out.Proto != "HTTP/1.1" {
		t.Fatalf("a POST over TLS to a server offering HTTP/2 went as %s; want HTTP/1.1", out.Proto)
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

// TestClientReusesItsConnectionAfterALargeAnswer: a page of a list (a
// thousand payouts, ten thousand digests) is sent chunked, and the JSON
// decoder stops at the end of the value, before the chunked body's end. A
// body closed there costs the connection: every large page opened a new
// one (a TCP and, with TLS, a handshake per request). The client reads
// the body to its end, so twenty large answers take one connection.
func TestClientReusesItsConnectionAfterALargeAnswer(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 100_000)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, "{\"items\":[%q]}\n", big)
	}))
	var conns atomic.Int32
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c, err := httpx.NewClient(srv.URL, "t")
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		var out struct{ Items []string }
		if err := c.Get(context.Background(), "/v1/things", nil, &out); err != nil || len(out.Items) != 1 || out.Items[0] != big {
			t.Fatalf("get: %v (%d items)", err, len(out.Items))
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("twenty large answers took %d connections, want 1", n)
	}
}
