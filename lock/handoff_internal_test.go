package lock

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A woken waiter's try that found the key still held by the session whose
// grant is ending started before that end (a late signal of an earlier end
// of the key): the release goes on waiting for a try made after it. A try
// that found another holder, or the waiter leaving, ends the wait.
func TestHandOffWaitsForATryAfterTheEnd(t *testing.T) {
	s := &Service{m: newMetrics(prometheus.NewRegistry(), "test"), waiters: map[string]*keyWaiters{}}
	w, done := s.addWaiter("payout:a")
	_, e := s.markHandoff("payout:a")
	s.tried(w, e-1, "") // a try of an earlier epoch
	s.tried(w, e, "ending")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	s.awaitHandoff(ctx, w, e, "ending")
	if got := testutil.ToFloat64(s.m.handoffs.WithLabelValues("timed_out")); got != 1 {
		t.Fatalf("a release whose only tries were stale answered before its wait ran out (timed_out %v)", got)
	}
	s.tried(w, e, "waiter-2") // found the key taken by another waiter: the hand-off happened
	s.awaitHandoff(context.Background(), w, e, "ending")
	if got := testutil.ToFloat64(s.m.handoffs.WithLabelValues("local")); got != 1 {
		t.Fatalf("local hand-offs %v, want 1", got)
	}
	_, e2 := s.markHandoff("payout:a")
	done() // the waiter leaves (it got the key, or gave up)
	s.awaitHandoff(context.Background(), w, e2, "ending")
	if got := testutil.ToFloat64(s.m.handoffs.WithLabelValues("local")); got != 2 {
		t.Fatalf("local hand-offs %v after the waiter left, want 2", got)
	}
}
