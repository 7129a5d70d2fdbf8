package cmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/httpx"
)

// `status --only ROLE --health-only` (the containers' healthcheck) asks
// that one role for health, readiness and version, with no token, and
// exits 1 when it is not ready; --only is checked before anything is asked.
func TestStatusOnlyOneRoleHealth(t *testing.T) {
	t.Setenv("PAYOUTS_TOKEN", "")
	t.Setenv("PAYOUTS_TOKEN_FILE", "")
	var unready atomic.Bool
	srv := httpx.NewServer(httpx.Config{Role: "executor", Ready: []httpx.Check{func(context.Context) error {
		if unready.Load() {
			return errors.New("draining")
		}
		return nil
	}}})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)

	// Every other role keeps its default loopback URL: asking any of them
	// would add a role to the report.
	args := []string{"status", "--only", "executor", "--health-only", "--executor-url", ts.URL, "-o", "json"}
	code, out, errOut := runArgs(t, args...)
	var rep statusReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("status output %q (stderr %q): %v", out, errOut, err)
	}
	if code != 0 || !rep.OK || len(rep.Roles) != 1 {
		t.Fatalf("status --only executor --health-only: exit %d, %+v, stderr %q; want exit 0 and the executor alone", code, rep, errOut)
	}
	if r := rep.Roles[0]; r.Role != "executor" || !r.Healthy || !r.Ready || r.Version == nil {
		t.Fatalf("executor status %+v, want healthy, ready, with a version", r)
	}

	unready.Store(true)
	if code, out, _ := runArgs(t, args...); code != 1 || !strings.Contains(out, "executor is not ready") {
		t.Fatalf("status of an unready executor: exit %d, %q; want 1 and the problem", code, out)
	}

	for _, bad := range [][]string{
		{"status", "--only", "executor", "--health-only"},                                                       // no --executor-url
		{"status", "--only", "ledger", "--health-only"},                                                         // no such role
		{"status", "--only", "executor", "--executor-url", ts.URL},                                              // key numbers need a token
		{"status", "--health-only", "--lock-url", "", "--payment-url", "", "--proxy-url", "", "--rail-url", ""}, // nothing to ask
	} {
		if code, _, errOut := runArgs(t, bad...); code != 2 || errOut == "" {
			t.Errorf("%q: exit %d, %q; want 2 and why", bad, code, errOut)
		}
	}
}

// The proxy's key numbers come from its own series, read in one scrape of
// /metrics: fenced_out from payouts_proxy_fenced_out_total, rail_paused
// from payouts_proxy_rail_paused; the high fence from GET /v1/fences/high.
func TestStatusProxyKeyNumbers(t *testing.T) {
	var scrapes atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		scrapes.Add(1)
		fmt.Fprint(w, "# TYPE payouts_proxy_fenced_out_total counter\npayouts_proxy_fenced_out_total 3\n"+
			"# TYPE payouts_proxy_rail_paused gauge\npayouts_proxy_rail_paused 1\n")
	})
	mux.HandleFunc("GET /v1/fences/high", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"token":7}`)
	})
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	p := &prober{ctx: context.Background(), hc: ts.Client(), token: "operator", timeout: 30 * time.Second}
	r := roleStatus{Role: "proxy", URL: ts.URL, Healthy: true}
	p.proxy(&r)
	if len(r.Errors) != 0 || r.FencedOut == nil || *r.FencedOut != 3 || r.RailPaused == nil || *r.RailPaused != 1 || r.HighFence == nil || *r.HighFence != 7 {
		t.Fatalf("proxy status %+v (errors %v); want fenced_out 3, rail_paused 1, high_fence 7", r, r.Errors)
	}
	if n := scrapes.Load(); n != 1 {
		t.Fatalf("/metrics read %d times for the proxy's key numbers, want once", n)
	}
	if got := keyNumbers(r); !strings.Contains(got, "rail_paused=1") {
		t.Fatalf("key numbers %q lack rail_paused=1", got)
	}
}
