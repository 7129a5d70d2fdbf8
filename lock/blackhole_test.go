package lock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/lockclient"
)

// TestBlackholedClient cuts the network between a client and the service
// without closing anything: the session must go JEOPARDY, then LOST, before
// the service frees the lock, and its grant contexts must be cancelled.
func TestBlackholedClient(t *testing.T) {
	forEachBackend(t, func(t *testing.T, kind string) {
		svc := setup(t, kind).svc
		ctx := testCtx(t)
		proxy := newBlackhole(t, svc.URL[len("http://"):])
		// A TTL long enough that a slow keepalive before the cut does not
		// put the session in jeopardy: the states are checked from the cut.
		s, err := lockclient.Open(ctx, proxy.URL(), "partitioned", lockclient.WithToken(executorToken),
			lockclient.WithTTL(6*time.Second), lockclient.WithHTTPClient(httpClient()))
		if err != nil {
			t.Fatal(err)
		}
		// Record every state the session passes through, from its opening
		// on. Each state is read and recorded under mu, so the cut below
		// falls between two recordings.
		var (
			mu     sync.Mutex
			states []lockclient.State
		)
		record := func() lockclient.State {
			st := s.State()
			if len(states) == 0 || states[len(states)-1] != st {
				states = append(states, st)
			}
			return st
		}
		mu.Lock()
		record()
		mu.Unlock()
		g, err := s.TryAcquire(ctx, "payout:acc-bh")
		if err != nil {
			t.Fatal(err)
		}
		observer, _ := lockclient.New(svc.URL, lockclient.WithToken(executorToken))

		stopRec := make(chan struct{})
		recDone := make(chan struct{})
		go func() {
			defer close(recDone)
			for {
				mu.Lock()
				st := record()
				mu.Unlock()
				if st == lockclient.Lost {
					return
				}
				select {
				case <-stopRec:
					return
				case <-time.After(2 * time.Millisecond):
				}
			}
		}()
		t.Cleanup(func() { close(stopRec); <-recDone })

		// The cut. cut is the index of the state the session was in when
		// it came (a slow keepalive before it may have left the session in
		// JEOPARDY already, or had it go JEOPARDY and back).
		mu.Lock()
		record()
		cut := len(states) - 1
		proxy.holed.Store(true)
		mu.Unlock()
		eventually(t, "the service to free the lock", func() bool {
			l, err := observer.Lock(ctx, "payout:acc-bh")
			if err != nil {
				t.Fatal(err)
			}
			if l.Held {
				return false
			}
			// The moment the service shows the key free, the client must
			// already have given up.
			if st := s.State(); st != lockclient.Lost {
				t.Fatalf("service freed the lock while the client was %s", st)
			}
			return true
		})
		<-recDone
		mu.Lock()
		got := append([]lockclient.State(nil), states...)
		mu.Unlock()
		if got[0] != lockclient.Healthy {
			t.Fatalf("states: want the session to open HEALTHY, got %v", got)
		}
		// From the cut on: HEALTHY (unless a keepalive had already
		// failed), then JEOPARDY, then LOST, and nothing else.
		after := got[cut:]
		if after[0] == lockclient.Healthy {
			after = after[1:]
		}
		if len(after) != 2 || after[0] != lockclient.Jeopardy || after[1] != lockclient.Lost {
			t.Fatalf("states from the cut on: want [HEALTHY] JEOPARDY LOST, got %v (all: %v)", got[cut:], got)
		}
		select {
		case <-s.Done():
		default:
			t.Fatal("Done not closed after LOST")
		}
		eventually(t, "the grant context to be cancelled", func() bool { return g.Context().Err() != nil })
		if g.Valid() {
			t.Fatal("grant valid after LOST")
		}
		if _, err := s.TryAcquire(ctx, "payout:other"); err == nil {
			t.Fatal("a LOST session acquired")
		}
		// The network comes back: a LOST session's keepalive is refused by
		// the service, and the session stays LOST.
		proxy.holed.Store(false)
		// The lock was freed by expiry, so the session is already gone.
		if _, err := observer.KeepAlive(ctx, s.ID()); !problem.Has(err, problem.SessionExpired) {
			t.Fatalf("keepalive of a LOST, expired session: want session_expired, got %v", err)
		}
		if s.State() != lockclient.Lost {
			t.Fatal("session left LOST")
		}
	})
}
