package httpx_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
)

// A routed path with a method it does not have answers 405 with Allow, as
// a problem document; an unrouted path stays 404.
func TestMethodNotAllowed(t *testing.T) {
	ts, _ := newTestServer(t)
	cases := []struct {
		method, path string
		status       int
		allow        string
	}{
		{http.MethodGet, "/v1/echo", http.StatusMethodNotAllowed, "POST"},
		{http.MethodDelete, "/healthz", http.StatusMethodNotAllowed, "GET, HEAD"},
		{"XMETHOD1", "/healthz", http.StatusMethodNotAllowed, "GET, HEAD"},
		{"XMETHOD1", "/v1/nowhere", http.StatusNotFound, ""},
		{http.MethodGet, "/v1/nowhere", http.StatusNotFound, ""},
	}
	for _, tc := range cases {
		req, _ := http.NewRequest(tc.method, ts.URL+tc.path, nil)
		req.Header.Set("Authorization", "Bearer "+execToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || resp.Header.Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d Allow=%q, want %d Allow=%q (%s)", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Allow"), tc.status, tc.allow, body)
		}
		if ct := resp.Header.Get("Content-Type"); ct != problem.ContentType {
			t.Errorf("%s %s: content type %q, want a problem document", tc.method, tc.path, ct)
		}
	}
}

// Methods outside a fixed set are one "other" label: a caller sending
// made-up methods cannot grow the metric's series.
func TestMetricLabelsAreBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := httpx.NewServer(httpx.Config{Role: "test", Registry: reg, Auth: auth.Insecure()})
	h := s.Handler()
	s.Router().Post("/v1/echo", httpx.Handler(func(w http.ResponseWriter, r *http.Request) error { return nil }))
	for i := range 20 {
		req, _ := http.NewRequest("XMETHOD"+strings.Repeat("X", i), "/healthz", nil)
		h.ServeHTTP(nopWriter{http.Header{}}, req)
	}
	// Under /v1 every request no route takes is /v1/*, whatever its
	// method: a made-up one (405), another (405), an unrouted path (404),
	// /v1 itself.
	for _, mp := range [][2]string{{"BREW", "/v1/echo"}, {http.MethodDelete, "/v1/echo"}, {http.MethodGet, "/v1/nowhere"}, {http.MethodGet, "/v1"}} {
		req, _ := http.NewRequest(mp[0], mp[1], nil)
		h.ServeHTTP(nopWriter{http.Header{}}, req)
	}
	req, _ := http.NewRequest(http.MethodGet, "/healthz", nil)
	h.ServeHTTP(nopWriter{http.Header{}}, req)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "payouts_http_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			got[strings.Join(labels, ",")] = m.GetCounter().GetValue()
		}
	}
	want := map[string]float64{
		"method=GET,route=/healthz,status=200":    1,
		"method=other,route=unmatched,status=405": 20,
		"method=other,route=/v1/*,status=405":     1,
		"method=DELETE,route=/v1/*,status=405":    1,
		"method=GET,route=/v1/*,status=404":       2,
	}
	if len(got) != len(want) {
		t.Fatalf("payouts_http_requests_total series %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("payouts_http_requests_total series %v, want %v", got, want)
		}
	}
}

type nopWriter struct{ h http.Header }

func (w nopWriter) Header() http.Header         { return w.h }
func (w nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w nopWriter) WriteHeader(int)             {}

// A path parameter is what the client meant, however it escaped it:
// escaped bytes are decoded once (payout%3Aacc-1 is payout:acc-1, p%2D1 is
// p-1), never twice (a%2541 is "a%41").
func TestPathParamDecodedOnce(t *testing.T) {
	s := httpx.NewServer(httpx.Config{Role: "test", Auth: auth.Insecure()})
	s.Router().Get("/v1/things/{key}/x", httpx.Handler(func(w http.ResponseWriter, r *http.Request) error {
		_, _ = io.WriteString(w, httpx.PathParam(r, "key"))
		return nil
	}))
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	for raw, want := range map[string]string{
		"payout:acc-1":   "payout:acc-1",
		"payout%3Aacc-1": "payout:acc-1",
		"payout%3aacc-1": "payout:acc-1",
		"p%2D1":          "p-1",
		"a%20b":          "a b",
		"a%2541":         "a%41",
		"a%2F%3A":        "a/:",
	} {
		resp, err := http.Get(ts.URL + "/v1/things/" + raw + "/x")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != want {
			t.Errorf("%s: %d %q, want %q", raw, resp.StatusCode, body, want)
		}
	}
}

// TestAClientThatStopsReadingIsCutOff: a client that sends a request and
// never reads the answer held the handler writing it, and the connection,
// for ever (no write deadline): any caller, without a token, could pin
// goroutines and connections with pipelined GET /metrics. The write now
// fails once the request's deadline and a grace have passed.
func TestAClientThatStopsReadingIsCutOff(t *testing.T) {
	t.Parallel()
	done := make(chan error, 1)
	s := httpx.NewServer(httpx.Config{Role: "test", Auth: auth.Insecure(), RequestTimeout: 100 * time.Millisecond})
	s.Router().Get("/v1/big", func(w http.ResponseWriter, r *http.Request) {
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		for {
			if _, err := w.Write(chunk); err != nil {
				done <- err
				return
			}
		}
	})
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "GET /v1/big HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the handler writing to a client that reads nothing was never cut off")
	}
}
