package httpx_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
)

type echoReq struct {
	Name   string `json:"name"`
	Amount int64  `json:"amount"`
}

const (
	execToken = "executor-token-0123456789"
	opToken   = "operator-token-0123456789"
)

func newTestServer(t *testing.T) (*httptest.Server, *int) {
	t.Helper()
	a, err := auth.Parse([]byte(`{"tokens":[{"token":"` + execToken + `","role":"executor","name":"exec-1"},{"token":"` + opToken + `","role":"operator","name":"alice"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	s := httpx.NewServer(httpx.Config{Role: "test", Auth: a})
	writes := 0
	s.Router().Post("/v1/echo", httpx.Handler(func(w http.ResponseWriter, r *http.Request) error {
		var req echoReq
		if err := httpx.DecodeJSON(r, &req); err != nil {
			return err
		}
		writes++
		httpx.WriteJSON(w, http.StatusOK, req)
		return nil
	}))
	s.Router().With(auth.Require(auth.Operator)).Post("/v1/admin", httpx.Handler(func(w http.ResponseWriter, r *http.Request) error {
		p, _ := auth.FromContext(r.Context())
		httpx.WriteJSON(w, http.StatusOK, map[string]string{"name": p.Name})
		return nil
	}))
	s.Router().Post("/v1/fence", httpx.Handler(func(w http.ResponseWriter, r *http.Request) error {
		return problem.Fenced("payout:acc-1", 4, 7, "token 4 is below the fence 7")
	}))
	s.Router().Get("/v1/boom", httpx.Handler(func(w http.ResponseWriter, r *http.Request) error {
		return errors.New("database password is hunter2")
	}))
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return ts, &writes
}

func TestStrictDecoding(t *testing.T) {
	ts, writes := newTestServer(t)
	c, err := httpx.NewClient(ts.URL, execToken)
	if err != nil {
		t.Fatal(err)
	}
	// A refusal about one field names it in the field member, as the
	// roles' own checks do; a body over the limit is 413.
	cases := []struct {
		name, body, wantInMsg, field string
		status                       int
	}{
		{"unknown field", `{"name":"a","amount":1,"colour":"red"}`, `unknown field "colour"`, "colour", 400},
		{"unknown field, other case", `{"name":"a","Amount":1}`, `unknown field "Amount"`, "Amount", 400},
		{"field twice", `{"name":"a","amount":1,"amount":2}`, `"amount" is given twice`, "amount", 400},
		{"trailing data", `{"name":"a","amount":1} {"x":1}`, "data after the JSON object", "", 400},
		{"wrong type", `{"name":"a","amount":"ten"}`, `field "amount" must be an integer`, "amount", 400},
		{"malformed", `{"name":`, "malformed JSON", "", 400},
		{"empty", ``, "empty", "", 400},
		{"an array, not an object", `[]`, "body must be an object, not array", "", 400},
		{"unknown field with a quote", `{"name":"a","a\"b":1}`, `unknown field "a\"b"`, `a"b`, 400},
		{"unknown field, very long", `{"` + strings.Repeat("k", 5000) + `":1}`, "unknown field", strings.Repeat("k", problem.MaxEchoArg) + "…[4800 more bytes]", 400},
		{"oversize", `{"name":"` + strings.Repeat("x", httpx.MaxBodyBytes) + `"}`, "larger than", "", http.StatusRequestEntityTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/echo", strings.NewReader(tc.body))
			req.Header.Set("Authorization", "Bearer "+execToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if ct := resp.Header.Get("Content-Type"); ct != problem.ContentType {
				t.Fatalf("content type %q", ct)
			}
			perr := problem.Decode(resp)
			var pe *problem.Error
			if !errors.As(perr, &pe) || pe.Code != problem.InvalidRequest {
				t.Fatalf("got %v, want invalid_request", perr)
			}
			if !strings.Contains(pe.Message, tc.wantInMsg) {
				t.Fatalf("message %q does not mention %q", pe.Message, tc.wantInMsg)
			}
			var field string
			if pe.Extension("field", &field); field != tc.field {
				t.Fatalf("field member %q, want %q", field, tc.field)
			}
		})
	}
	if *writes != 0 {
		t.Fatalf("%d rejected requests reached the handler's write", *writes)
	}
	var out echoReq
	if err := c.Post(context.Background(), "/v1/echo", echoReq{Name: "ok", Amount: 5}, &out); err != nil || out.Amount != 5 {
		t.Fatalf("valid request: %v %+v", err, out)
	}
}

func TestProblemRoundTrip(t *testing.T) {
	ts, _ := newTestServer(t)
	c, _ := httpx.NewClient(ts.URL, execToken)
	err := c.Post(context.Background(), "/v1/fence", map[string]string{}, nil)
	var pe *problem.Error
	if !errors.As(err, &pe) {
		t.Fatalf("want *problem.Error, got %T %v", err, err)
	}
	if pe.Code != problem.FencedOut || pe.Key != "payout:acc-1" || pe.PresentedToken != 4 || pe.StoredToken != 7 || pe.Status() != 409 {
		t.Fatalf("round trip lost fields: %+v", pe)
	}
	if !errors.Is(err, problem.New(problem.FencedOut, "")) {
		t.Fatal("errors.Is by code failed")
	}
	// Internal causes are never sent.
	err = c.Get(context.Background(), "/v1/boom", nil, nil)
	if !problem.Has(err, problem.Internal) || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("internal error leaked or wrong code: %v", err)
	}
	// Unknown route is a problem too.
	err = c.Get(context.Background(), "/v1/nope", nil, nil)
	if !problem.Has(err, problem.NotFound) {
		t.Fatalf("want not_found, got %v", err)
	}
}

func TestAuth(t *testing.T) {
	ts, _ := newTestServer(t)
	ctx := context.Background()
	none, _ := httpx.NewClient(ts.URL, "")
	bad, _ := httpx.NewClient(ts.URL, "not-a-real-token-at-all")
	exec, _ := httpx.NewClient(ts.URL, execToken)
	op, _ := httpx.NewClient(ts.URL, opToken)
	if err := none.Post(ctx, "/v1/echo", echoReq{}, nil); !problem.Has(err, problem.Unauthorized) {
		t.Fatalf("no token: %v", err)
	}
	if err := bad.Post(ctx, "/v1/echo", echoReq{}, nil); !problem.Has(err, problem.Unauthorized) {
		t.Fatalf("bad token: %v", err)
	}
	if err := exec.Post(ctx, "/v1/admin", echoReq{}, nil); !problem.Has(err, problem.Forbidden) {
		t.Fatalf("wrong role: %v", err)
	}
	var out map[string]string
	if err := op.Post(ctx, "/v1/admin", echoReq{}, &out); err != nil || out["name"] != "alice" {
		t.Fatalf("right role: %v %v", err, out)
	}
	// Health endpoints need no token.
	resp, err := http.Get(ts.URL + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v", err)
	}
	resp.Body.Close()
	resp, err = http.Get(ts.URL + "/metrics")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("metrics: %v", err)
	}
	resp.Body.Close()
}

func TestServerRefusesWithoutAuthConfig(t *testing.T) {
	if _, err := auth.FromFlags("", false); err == nil {
		t.Fatal("a server with neither --auth-file nor --insecure-no-auth must refuse to start")
	}
	if _, err := auth.FromFlags("x", true); err == nil {
		t.Fatal("both flags at once must be refused")
	}
}

func TestReadyzTurns503OnShutdownAndInFlightFinishes(t *testing.T) {
	a := auth.Insecure()
	s := httpx.NewServer(httpx.Config{Role: "test", Addr: "127.0.0.1:0", Auth: a})
	addr, err := s.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	entered := make(chan struct{})
	s.Router().Get("/v1/slow", func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		w.WriteHeader(200)
	})
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	base := "http://" + addr.String()
	waitStatus := func(path string, want int) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
			resp, err := http.Get(base + path)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == want {
					return
				}
			}
			time.Sleep(10 * time.Millisecond) // polling interval, not synchronisation
		}
		t.Fatalf("%s never answered %d", path, want)
	}
	waitStatus("/readyz", 200)
	slowDone := make(chan int, 1)
	go func() {
		resp, err := http.Get(base + "/v1/slow")
		if err != nil {
			slowDone <- 0
			return
		}
		resp.Body.Close()
		slowDone <- resp.StatusCode
	}()
	<-entered
	cancel()
	// Once shutdown has begun, readiness fails (load balancers stop sending).
	deadline := time.Now().Add(30 * time.Second)
	for {
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		if rec.Code == http.StatusServiceUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still %d after shutdown began", rec.Code)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The in-flight request finishes within the grace period.
	close(release)
	if code := <-slowDone; code != 200 {
		t.Fatalf("in-flight request got %d during graceful shutdown", code)
	}
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
}

// TestAuthAfterRouting: a request no route takes is answered 404 or 405
// with or without a token (routes mounted under a prefix, as every role
// mounts /v1, included), while a routed request without a valid token is
// 401 and reaches no handler; the Bearer scheme's name is matched in any
// case; HEAD is answered wherever GET is, under the same authentication.
func TestAuthAfterRouting(t *testing.T) {
	a, err := auth.Parse([]byte(`{"tokens":[{"token":"` + execToken + `","role":"executor","name":"exec-1"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	s := httpx.NewServer(httpx.Config{Role: "test", Auth: a})
	ran := 0
	s.Router().Route("/v1/sub", func(r chi.Router) {
		r.Get("/things/{id}", httpx.Handler(func(w http.ResponseWriter, r *http.Request) error {
			ran++
			httpx.WriteJSON(w, http.StatusOK, map[string]string{"id": httpx.PathParam(r, "id")})
			return nil
		}))
	})
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	for _, c := range []struct {
		method, path, authz string
		status              int
		allow               string
	}{
		{http.MethodDelete, "/v1/sub/things/x", "", http.StatusMethodNotAllowed, "GET, HEAD"},
		{http.MethodDelete, "/v1/sub/things/x", "Bearer not-a-real-token-at-all", http.StatusMethodNotAllowed, "GET, HEAD"},
		{http.MethodDelete, "/v1/sub/things/x", "Bearer " + execToken, http.StatusMethodNotAllowed, "GET, HEAD"},
		{http.MethodGet, "/v1/sub/nowhere", "", http.StatusNotFound, ""},
		{http.MethodGet, "/v1/sub/things/x", "", http.StatusUnauthorized, ""},
		{http.MethodGet, "/v1/sub/things/x", "Bearer not-a-real-token-at-all", http.StatusUnauthorized, ""},
		{http.MethodGet, "/v1/sub/things/x", "Basic " + execToken, http.StatusUnauthorized, ""},
		{http.MethodGet, "/v1/sub/things/x", "Bearer", http.StatusUnauthorized, ""},
		{http.MethodGet, "/v1/sub/things/x", "Bearer " + execToken, http.StatusOK, ""},
		{http.MethodGet, "/v1/sub/things/x", "bearer " + execToken, http.StatusOK, ""},
		{http.MethodGet, "/v1/sub/things/x", "BEARER  " + execToken, http.StatusOK, ""},
		{http.MethodHead, "/v1/sub/things/x", "", http.StatusUnauthorized, ""},
		{http.MethodHead, "/v1/sub/things/x", "Bearer " + execToken, http.StatusOK, ""},
		{http.MethodHead, "/healthz", "", http.StatusOK, ""},
	} {
		req, _ := http.NewRequest(c.method, ts.URL+c.path, nil)
		if c.authz != "" {
			req.Header.Set("Authorization", c.authz)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.status || resp.Header.Get("Allow") != c.allow {
			t.Errorf("%s %s (Authorization %q): %d Allow=%q, want %d Allow=%q", c.method, c.path, c.authz, resp.StatusCode, resp.Header.Get("Allow"), c.status, c.allow)
		}
	}
	if ran != 4 {
		t.Errorf("the handler ran %d times, want 4 (the authenticated GETs and HEAD only)", ran)
	}
}

// TestWritesTakeNoQueryString: no endpoint that changes something takes a
// query parameter, so one is refused (400 naming it) before the handler
// runs, instead of being ignored: POST /v1/locks/k/acquire?wait_ms=5000
// acquired without waiting, POST /v1/payouts?dry_run=true created the
// payout. Reads keep their own checks.
func TestWritesTakeNoQueryString(t *testing.T) {
	ts, writes := newTestServer(t)
	for _, c := range []struct {
		method, query string
		field         string // "" when accepted
	}{
		{http.MethodPost, "dry_run=true", "dry_run"},
		{http.MethodPost, "wait_ms=5000&x=1", "wait_ms"},
		{http.MethodPost, "", ""},
		{http.MethodPost, "&", ""}, // no parameter at all
	} {
		u := ts.URL + "/v1/echo"
		if c.query != "" {
			u += "?" + c.query
		}
		req, _ := http.NewRequest(c.method, u, strings.NewReader(`{"name":"a","amount":1}`))
		req.Header.Set("Authorization", "Bearer "+execToken)
		req.Header.Set("Content-Type", "application/json")
		before := *writes
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode >= 300 {
			err = problem.Decode(resp)
		}
		resp.Body.Close()
		if c.field == "" {
			if err != nil || *writes != before+1 {
				t.Errorf("%s ?%s: %v (handler ran %d times), want accepted", c.method, c.query, err, *writes-before)
			}
			continue
		}
		var got string
		if !problem.Has(err, problem.InvalidRequest) || !problem.From(err).Extension("field", &got) || got != c.field {
			t.Errorf("%s ?%s: %v (field %q), want invalid_request naming %q", c.method, c.query, err, got, c.field)
		}
		if *writes != before {
			t.Errorf("%s ?%s: the handler ran on a refused request", c.method, c.query)
		}
	}
	// Unauthenticated callers still learn nothing but 401.
	req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/echo?dry_run=1", strings.NewReader(`{}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no token with a query: %d, want 401", resp.StatusCode)
	}
}

// A request refused for its credential is a WARN line naming where it came
// from (an operator sees who holds a wrong or rotated token), not only a
// debug access line; 401 and 403 alike.
func TestARefusedCredentialIsLoggedAtWarn(t *testing.T) {
	a, err := auth.Parse([]byte(`{"tokens":[{"token":"` + execToken + `","role":"executor","name":"exec-1"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		token, path string
		status      int
	}{{"not-a-valid-token-0123456789", "/v1/echo", 401}, {execToken, "/v1/admin", 403}} {
		var buf bytes.Buffer
		reg := prometheus.NewRegistry()
		s := httpx.NewServer(httpx.Config{Role: "test", Auth: a, Registry: reg, Logger: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))})
		// Both statuses are exported at 0 before any refusal (an alert
		// counts their increase).
		if got := refusals(t, reg); got["401"] != 0 || got["403"] != 0 || len(got) != 2 {
			t.Fatalf("payouts_http_credential_refusals_total before any request: %v, want 401 and 403 at 0", got)
		}
		s.Router().Post("/v1/echo", func(w http.ResponseWriter, r *http.Request) {})
		s.Router().With(auth.Require(auth.Operator)).Post("/v1/admin", func(w http.ResponseWriter, r *http.Request) {})
		ts := httptest.NewServer(s.Handler())
		req, _ := http.NewRequest(http.MethodPost, ts.URL+tc.path, strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer "+tc.token)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		ts.Close()
		if res.StatusCode != tc.status {
			t.Fatalf("%s: status %d, want %d", tc.path, res.StatusCode, tc.status)
		}
		var line map[string]any
		if err := json.Unmarshal(bytes.TrimSpace(buf.Bytes()), &line); err != nil {
			t.Fatalf("%s: want one log line, got %q: %v", tc.path, buf.String(), err)
		}
		if got := refusals(t, reg); got[strconv.Itoa(tc.status)] != 1 {
			t.Fatalf("%s: payouts_http_credential_refusals_total %v, want %d counted once", tc.path, got, tc.status)
		}
		if line["level"] != "WARN" || line["status"] != float64(tc.status) || line["route"] != tc.path ||
			!strings.HasPrefix(line["remote_addr"].(string), "127.0.0.1:") {
			t.Fatalf("%s: log line %v, want a WARN with status %d, the route and the caller's address", tc.path, line, tc.status)
		}
	}
}

// A base URL is where the server's routes hang: a gateway's path prefix is
// kept, but one ending in /v1 (every route named twice, each answered 404),
// a query or fragment (dropped) and credentials (sent on every call, and
// echoed in the error) are refused. They were taken.
func TestNewClientRefusesABaseItWouldMisuse(t *testing.T) {
	for _, u := range []string{"http://127.0.0.1:7102", "https://gw.example:443/payouts/", "http://127.0.0.1:7102/"} {
		if _, err := httpx.NewClient(u, ""); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
	for _, c := range []struct{ url, want string }{
		{"http://127.0.0.1:7102/v1", "drop the /v1"},
		{"http://127.0.0.1:7102/gw/v1/", "drop the /v1"},
		{"http://127.0.0.1:7102/foo?x=1", "no query or fragment"},
		{"http://127.0.0.1:7102#y", "no query or fragment"},
		{"http://127.0.0.1:7102?", "no query or fragment"},
		{"http://alice:s3cret@127.0.0.1:7102", "no user or password"},
	} {
		_, err := httpx.NewClient(c.url, "")
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: %v, want an error saying %q (and no password)", c.url, err, c.want)
		}
	}
}

// Two Authorization headers are refused 400, whichever comes first: the
// first was taken, where a proxy in front may have checked the other.
func TestTwoAuthorizationHeadersAreRefused(t *testing.T) {
	ts, writes := newTestServer(t)
	for _, pair := range [][2]string{{execToken, opToken}, {"not-a-valid-token-0123456789", execToken}} {
		req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/echo", strings.NewReader(`{"name":"a","amount":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Add("Authorization", "Bearer "+pair[0])
		req.Header.Add("Authorization", "Bearer "+pair[1])
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest {
			t.Fatalf("two Authorization headers: %d, want 400", res.StatusCode)
		}
	}
	if *writes != 0 {
		t.Fatalf("a request with two credentials ran its handler %d times", *writes)
	}
}

// refusals is payouts_http_credential_refusals_total by status.
func refusals(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "payouts_http_credential_refusals_total" {
			for _, m := range mf.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	return got
}
