package reconcile

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/payouts/payouts/lock/lockclient"
)

// TestALostSessionIsClosedBeforeTheNext: the reconciler's session went
// LOST locally (its keepalives got no answer until its deadline passed),
// which does not mean the lock service dropped it. The next acquire opens
// a new session and closes the lost one first, so the locks it held are
// freed now, not when the lock service expires it. Before, it was left
// open.
func TestALostSessionIsClosedBeforeTheNext(t *testing.T) {
	t.Parallel()
	const ttl = 1500 * time.Millisecond
	var (
		stop   = make(chan struct{})
		opened atomic.Int32
		mu     sync.Mutex
		closed []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/v1/sessions":
			id := fmt.Sprintf("s-%d", opened.Add(1))
			_ = json.NewEncoder(w).Encode(lockclient.SessionInfo{SessionID: id, Owner: "reconciler", TTLMS: ttl.Milliseconds(), State: "ACTIVE"})
		case strings.HasSuffix(r.URL.Path, "/keepalive"):
			select { // a lock service that does not answer
			case <-r.Context().Done():
			case <-stop:
			}
		case r.Method == http.MethodDelete:
			mu.Lock()
			closed = append(closed, strings.TrimPrefix(r.URL.Path, "/v1/sessions/"))
			mu.Unlock()
			_ = json.NewEncoder(w).Encode(lockclient.SessionInfo{State: "CLOSED"})
		case strings.HasSuffix(r.URL.Path, "/acquire"):
			var req lockclient.AcquireRequest
			_ = json.NewDecoder(r.Body).Decode(&req)
			key := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/locks/"), "/acquire")
			_ = json.NewEncoder(w).Encode(lockclient.GrantInfo{Key: key, Owner: "reconciler", Token: 7, SessionID: req.SessionID, ServerExpiry: time.Now().Add(ttl)})
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) }) // before srv.Close: no keepalive left waiting
	ls, err := NewLockService(srv.URL, "token", "reconciler", ttl, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l := ls.(*lockService)
	ctx := context.Background()
	t.Cleanup(func() { _ = l.Close(ctx) })
	if _, held, err := l.Acquire(ctx, "payout:a", 0); err != nil || held {
		t.Fatalf("first acquire: held %v, %v", held, err)
	}
	first := l.sess
	deadline := time.Now().Add(time.Minute)
	for first.State() != lockclient.Lost {
		if time.Now().After(deadline) {
			t.Fatal("the session never went LOST without keepalive answers")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, held, err := l.Acquire(ctx, "payout:b", 0); err != nil || held {
		t.Fatalf("acquire after the session was lost: held %v, %v", held, err)
	}
	if l.sess == first || l.sess.ID() != "s-2" {
		t.Fatalf("session %s after the first was lost, want a new one, s-2", l.sess.ID())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(closed) != 1 || closed[0] != "s-1" {
		t.Fatalf("sessions closed: %v, want the lost s-1 before s-2 was used", closed)
	}
}
