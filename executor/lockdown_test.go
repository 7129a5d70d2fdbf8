package executor

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/lock/lockclient"
)

// TestLockUnavailableWhileTheLockServiceHangs: a lock service that takes
// connections and never answers shows as payouts_executor_lock_unavailable
// = 1 within a session TTL, not after --call-timeout: before the first
// session opens, and when a session is lost because its keepalives hang
// (the gauge is set before the close, which waits on the same service).
func TestLockUnavailableWhileTheLockServiceHangs(t *testing.T) {
	t.Parallel()
	for _, opens := range []bool{false, true} {
		name := map[bool]string{false: "no session yet", true: "session lost"}[opens]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			release := make(chan struct{})
			hang := func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-release:
				case <-r.Context().Done():
				}
				http.Error(w, "gone", http.StatusServiceUnavailable)
			}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if opens && r.Method == http.MethodPost && r.URL.Path == "/v1/sessions" {
					now := time.Now()
					exp := now.Add(3 * time.Second)
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusCreated)
					_ = json.NewEncoder(w).Encode(lockclient.SessionInfo{SessionID: "s-hang", Owner: "hang", TTLMS: 3000, State: "ACTIVE",
						CreatedAt: &now, LastHeartbeatAt: &now, ExpiresAt: &exp})
					return
				}
				if r.URL.Path == "/v1/work" { // the payment resource is up; it has no work
					w.Header().Set("Content-Type", "application/json")
					_, _ = w.Write([]byte(`{"items":[],"next":""}`))
					return
				}
				hang(w, r)
			}))
			defer srv.Close()
			reg := obs.NewRegistry()
			cfg := Config{Owner: "hang", SessionTTL: 3 * time.Second, PollInterval: 100 * time.Millisecond, CallTimeout: 10 * time.Minute,
				LockURL: srv.URL, PaymentURL: srv.URL, ProxyURL: srv.URL, Token: "t",
				Logger: slog.New(slog.DiscardHandler), Registry: reg}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- Run(ctx, cfg) }()
			defer func() { close(release); cancel(); <-done }()
			what, shown := "payouts_executor_lock_unavailable to be 1", func() bool {
				return gathered(t, reg, "payouts_executor_lock_unavailable") == 1
			}
			if opens {
				// The gauge is also 1 from the start until the session
				// opens: a look in that moment saw it before any session
				// was lost. Wait for the loss itself, counted and shown,
				// while the close waits on the hung service (its
				// --call-timeout is 10 minutes).
				what, shown = "the lost session to be counted and payouts_executor_lock_unavailable to be 1", func() bool {
					return counter(t, reg, "payouts_executor_sessions_total", "event", "lost") == 1 &&
						gathered(t, reg, "payouts_executor_lock_unavailable") == 1
				}
			}
			waitFor(t, 2*time.Minute, what, shown)
		})
	}
}

// gathered reads an unlabelled gauge or counter of a registry (-1 when
// absent).
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			if c := mf.GetMetric()[0].GetCounter(); c != nil {
				return c.GetValue()
			}
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}
