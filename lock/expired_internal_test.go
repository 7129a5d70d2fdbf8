package lock

import (
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/payouts/payouts/lock/backend"
)

// TestExpiredSessionsCountedOncePerSession: one executor killed while it
// held 20 grants is one expired session for PayoutsLockSessionExpirations,
// whether its backend reports the grants together (PostgreSQL) or one by
// one (etcd); payouts_lock_expirations_total still counts the grants.
func TestExpiredSessionsCountedOncePerSession(t *testing.T) {
	s := &Service{m: newMetrics(prometheus.NewRegistry(), "test"), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	o := observer{s}
	var together []backend.GrantRecord
	for i := range 20 {
		together = append(together, backend.GrantRecord{Key: fmt.Sprintf("payout:a-%d", i), SessionID: "s-1"})
	}
	o.Expired(together)
	for i := range 3 {
		o.Expired([]backend.GrantRecord{{Key: fmt.Sprintf("payout:b-%d", i), SessionID: "s-2"}})
	}
	if got := testutil.ToFloat64(s.m.expiredSessions); got != 2 {
		t.Fatalf("payouts_lock_expired_sessions_total %v, want 2 (two sessions)", got)
	}
	if got := testutil.ToFloat64(s.m.expirations); got != 23 {
		t.Fatalf("payouts_lock_expirations_total %v, want 23 grants", got)
	}
	// The memory of counted sessions is bounded: past its size a session
	// reported again long after is counted again, never leaked.
	for i := range recentSetSize + 10 {
		s.expired.add(fmt.Sprintf("other-%d", i))
	}
	if len(s.expired.ids) != recentSetSize {
		t.Fatalf("remembered %d sessions, want at most %d", len(s.expired.ids), recentSetSize)
	}
}
