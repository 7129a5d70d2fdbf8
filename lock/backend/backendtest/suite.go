// Package backendtest is the one behavioural suite every lock backend must
// pass. Each backend's tests call Run with a way to make a fresh store.
package backendtest

import (
	"context"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/fencing"
)

// Store is one fresh, empty store.
type Store interface {
	// Open returns a new backend instance on this store with its Run loop
	// started; it is closed when the test ends. Opening a second one is
	// how the suite restarts "the lock service".
	Open(t *testing.T) backend.Backend
}

// Timeout bounds every wait in the suite (generous: loaded CI machines).
const Timeout = 60 * time.Second

// Run runs the suite against stores made by newStore.
func Run(t *testing.T, newStore func(t *testing.T) Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s Store)
	}{
		{"TokensStrictlyIncrease", testTokensIncrease},
		{"TokensIncreaseAcrossRestart", testTokensAcrossRestart},
		{"TokensIncreaseInGrantOrderUnderContention", testContention},
		{"ReacquireSameToken", testReacquire},
		{"OtherSessionGetsLockHeld", testLockHeld},
		{"ReleaseByNonHolder", testReleaseNonHolder},
		{"CloseFreesEveryLock", testClose},
		{"ExpiryFreesEveryLock", testExpiry},
		{"KeepAliveNeverRevives", testKeepAliveNeverRevives},
		{"SessionTimesAgree", testSessionTimes},
		{"Revoke", testRevoke},
		{"GrantLogAndHighToken", testGrantLog},
		{"Introspection", testIntrospection},
		{"ChangedSignalsRelease", testChanged},
		{"UnknownSession", testUnknownSession},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newStore(t))
		})
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), Timeout)
	t.Cleanup(cancel)
	return c
}

func session(t *testing.T, b backend.Backend, owner string, ttl time.Duration) backend.Session {
	t.Helper()
	principal := "principal-of-" + owner
	s, err := b.CreateSession(ctx(t), owner, principal, ttl)
	if err != nil {
		t.Fatalf("create session: %v", err)
	}
	if s.ID == "" || s.Owner != owner || s.Principal != principal || s.TTL < ttl || s.State != backend.StateActive {
		t.Fatalf("create session: got %+v", s)
	}
	if r, err := b.Session(ctx(t), s.ID); err != nil || r.Principal != principal {
		t.Fatalf("read session: %+v %v; want principal %s", r, err, principal)
	}
	return s
}

func acquire(t *testing.T, b backend.Backend, key string, s backend.Session) backend.Grant {
	t.Helper()
	g, err := b.Acquire(ctx(t), key, s.ID)
	if err != nil {
		t.Fatalf("acquire %s by %s: %v", key, s.ID, err)
	}
	if g.Key != key || g.SessionID != s.ID || g.Owner != s.Owner || !g.Token.Valid() {
		t.Fatalf("acquire %s: got %+v", key, g)
	}
	return g
}

func wantCode(t *testing.T, err error, code problem.Code, what string) {
	t.Helper()
	if !problem.Has(err, code) {
		t.Fatalf("%s: want %s, got %v", what, code, err)
	}
}

func grantByToken(t *testing.T, b backend.Backend, tok fencing.Token) backend.GrantRecord {
	t.Helper()
	recs, err := b.Grants(ctx(t), tok-1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Token != tok {
		t.Fatalf("grant %d not in the log: %+v", tok, recs)
	}
	return recs[0]
}

// waitFor polls cond until it holds or the suite timeout passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
