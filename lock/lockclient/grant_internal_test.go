package lockclient

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// sameTokenService answers as a lock service whose acquires, for one
// session, always grant the same token: a session acquiring a key it
// already holds gets the same lock back.
func sameTokenService(t *testing.T, releases *atomic.Int32) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/v1/sessions",
			strings.HasSuffix(r.URL.Path, "/keepalive"),
			r.Method == http.MethodDelete:
			_ = json.NewEncoder(w).Encode(SessionInfo{SessionID: "s-1", Owner: "test", TTLMS: 60_000, State: "ACTIVE"})
		case strings.HasSuffix(r.URL.Path, "/acquire"):
			key := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/locks/"), "/acquire")
			_ = json.NewEncoder(w).Encode(GrantInfo{Key: key, Owner: "test", Token: 7, SessionID: "s-1", ServerExpiry: time.Now().Add(time.Minute)})
		case strings.HasSuffix(r.URL.Path, "/release"):
			releases.Add(1)
			_, _ = w.Write([]byte(`{}`))
		default:
			t.Errorf("unexpected request %s %s", r.Method, r.URL.Path)
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func (s *Session) tracked() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.grants)
}

// TestReacquireSupersedesTheEarlierGrant: acquiring a key the session
// already holds gives a new Grant of the same lock; the earlier one is
// superseded (cancelled, no longer tracked), so that a key acquired again
// and again does not make the session track one Grant more each time, for
// as long as it lives.
func TestReacquireSupersedesTheEarlierGrant(t *testing.T) {
	var releases atomic.Int32
	c, err := New(sameTokenService(t, &releases), WithToken("x"), WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := c.Open(ctx, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	first, err := s.TryAcquire(ctx, "payout:a")
	if err != nil {
		t.Fatal(err)
	}
	var last *Grant
	for range 10 {
		if last, err = s.TryAcquire(ctx, "payout:a"); err != nil {
			t.Fatal(err)
		}
	}
	if first.Valid() || first.Context().Err() == nil {
		t.Error("the earlier Grant of the key is still valid after the key was acquired again")
	}
	if !last.Valid() {
		t.Error("the newest Grant is not valid")
	}
	// Released, the superseded Grant must not free the lock its successor
	// holds under the same token.
	if err := s.Release(ctx, first); err != nil {
		t.Fatal(err)
	}
	if n := releases.Load(); n != 0 {
		t.Fatalf("releasing the superseded Grant sent %d release(s) to the service, want 0", n)
	}
	other, err := s.TryAcquire(ctx, "payout:b")
	if err != nil {
		t.Fatal(err)
	}
	if n := s.tracked(); n != 2 {
		t.Fatalf("the session tracks %d grants for two keys acquired 12 times, want 2", n)
	}
	if err := s.Release(ctx, last); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, other); err != nil {
		t.Fatal(err)
	}
	if n := s.tracked(); n != 0 {
		t.Fatalf("the session tracks %d grants after releasing both keys, want 0", n)
	}
}
