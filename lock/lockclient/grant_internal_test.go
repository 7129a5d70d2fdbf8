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

// TestReacquireIsTrackedOnce: acquiring a key the session already holds
// gives a new Grant of the same lock, sharing the earlier one's context;
// the session tracks one Grant per key, not one more per acquire for as
// long as it lives. Releasing either Grant releases the lock and ends both.
func TestReacquireIsTrackedOnce(t *testing.T) {
	var releases atomic.Int32
	s := openTest(t, sameTokenService(t, &releases), WithToken("x"), WithTTL(time.Minute))
	ctx := context.Background()
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
	if !first.Valid() || !last.Valid() {
		t.Fatalf("Grants of the held lock: first valid %t, last valid %t; want both", first.Valid(), last.Valid())
	}
	other, err := s.TryAcquire(ctx, "payout:b")
	if err != nil {
		t.Fatal(err)
	}
	if n := s.tracked(); n != 2 {
		t.Fatalf("the session tracks %d grants for two keys acquired 12 times, want 2", n)
	}
	if err := s.Release(ctx, first); err != nil {
		t.Fatal(err)
	}
	if n := releases.Load(); n != 1 {
		t.Fatalf("releasing the first Grant sent %d release(s), want 1", n)
	}
	if last.Valid() || last.Context().Err() == nil {
		t.Error("a Grant of the released lock is still valid")
	}
	if n := s.tracked(); n != 1 {
		t.Fatalf("the session tracks %d grants after releasing payout:a, want 1", n)
	}
	if err := s.Release(ctx, other); err != nil {
		t.Fatal(err)
	}
	if n := s.tracked(); n != 0 {
		t.Fatalf("the session tracks %d grants after releasing both keys, want 0", n)
	}
}

// TestReleaseRetriedAfterAReacquireEndsTheLiveGrant: a release that got no
// verdict, then an acquire that answers the same token (the lock was still
// held: a new Grant of the same lock), then the release sent again, as a
// caller retries it. The retry frees the lock at the service, so the live
// Grant must end with it: not Valid, its context cancelled. (It stayed
// valid, untracked, its context never cancelled, not even when the
// session was lost.)
func TestReleaseRetriedAfterAReacquireEndsTheLiveGrant(t *testing.T) {
	var releases atomic.Int32
	s := openTest(t, sameTokenService(t, &releases), WithToken("x"), WithTTL(time.Minute))
	ctx := context.Background()
	old, err := s.TryAcquire(ctx, "payout:a")
	if err != nil {
		t.Fatal(err)
	}
	noVerdict, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Release(noVerdict, old); err == nil {
		t.Fatal("a release with a cancelled context reported success")
	}
	live, err := s.TryAcquire(ctx, "payout:a")
	if err != nil {
		t.Fatal(err)
	}
	if !live.Valid() || live.Token != old.Token {
		t.Fatalf("re-acquire: valid %t, token %d (want the held lock's %d)", live.Valid(), live.Token, old.Token)
	}
	if err := s.Release(ctx, old); err != nil {
		t.Fatal(err)
	}
	if live.Valid() || live.Context().Err() == nil || s.tracked() != 0 {
		t.Fatalf("after the lock was released: live Grant valid %t, context %v, %d Grants tracked; want it ended", live.Valid(), live.Context().Err(), s.tracked())
	}
}
