package backendtest

import (
	"testing"
	"time"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
)

func testClose(t *testing.T, st Store) {
	b := st.Open(t)
	s := session(t, b, "closer", 30*time.Second)
	other := session(t, b, "other", 30*time.Second)
	g1 := acquire(t, b, "payout:c-1", s)
	g2 := acquire(t, b, "payout:c-2", s)
	closed, err := b.CloseSession(ctx(t), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if closed.State != backend.StateClosed {
		t.Fatalf("closed session state %s", closed.State)
	}
	for _, g := range []backend.Grant{g1, g2} {
		rec := grantByToken(t, b, g.Token)
		if rec.EndReason != backend.EndReleased || rec.EndedAt == nil {
			t.Fatalf("grant of a closed session: %+v", rec)
		}
		acquire(t, b, g.Key, other)
	}
	if _, err := b.CloseSession(ctx(t), s.ID); err != nil {
		t.Fatalf("closing twice: %v", err)
	}
	_, err = b.KeepAlive(ctx(t), s.ID)
	wantCode(t, err, problem.SessionExpired, "keepalive of a closed session")
	_, err = b.Acquire(ctx(t), "payout:c-3", s.ID)
	wantCode(t, err, problem.SessionExpired, "acquire by a closed session")
	got, err := b.Session(ctx(t), s.ID)
	if err != nil || got.State != backend.StateClosed {
		t.Fatalf("session after close: %+v %v", got, err)
	}
}

func testExpiry(t *testing.T, st Store) {
	b := st.Open(t)
	s := session(t, b, "doomed", time.Second)
	other := session(t, b, "other", 60*time.Second)
	g1 := acquire(t, b, "payout:e-1", s)
	g2 := acquire(t, b, "payout:e-2", s)
	// No keepalive: the store expires the session and frees both keys.
	for _, g := range []backend.Grant{g1, g2} {
		var ng backend.Grant
		waitFor(t, "expired lock to be free", func() bool {
			var err error
			ng, err = b.Acquire(ctx(t), g.Key, other.ID)
			if err != nil && !problem.Has(err, problem.LockHeld) {
				t.Fatal(err)
			}
			return err == nil
		})
		if ng.Token <= g.Token {
			t.Fatalf("token %d after expired %d", ng.Token, g.Token)
		}
		waitFor(t, "expired grant to be recorded", func() bool {
			return grantByToken(t, b, g.Token).EndReason == backend.EndExpired
		})
	}
	waitFor(t, "session to show EXPIRED", func() bool {
		got, err := b.Session(ctx(t), s.ID)
		return err == nil && got.State == backend.StateExpired
	})
	if _, err := b.KeepAlive(ctx(t), other.ID); err != nil {
		t.Fatalf("a live session's keepalive: %v", err)
	}
}

func testKeepAliveNeverRevives(t *testing.T, st Store) {
	b := st.Open(t)
	s := session(t, b, "doomed", time.Second)
	waitFor(t, "session to expire", func() bool {
		got, err := b.Session(ctx(t), s.ID)
		return err == nil && got.State == backend.StateExpired
	})
	_, err := b.KeepAlive(ctx(t), s.ID)
	wantCode(t, err, problem.SessionExpired, "keepalive of an expired session")
	got, err := b.Session(ctx(t), s.ID)
	if err != nil || got.State != backend.StateExpired {
		t.Fatalf("keepalive revived the session: %+v %v", got, err)
	}
	_, err = b.Acquire(ctx(t), "payout:x", s.ID)
	wantCode(t, err, problem.SessionExpired, "acquire by an expired session")
}

func testRevoke(t *testing.T, st Store) {
	b := st.Open(t)
	s := session(t, b, "holder", 30*time.Second)
	g := acquire(t, b, "payout:acc-9", s)
	rec, err := b.Revoke(ctx(t), "payout:acc-9", "alice", "stuck worker")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Token != g.Token || rec.EndReason != backend.EndRevoked || rec.Actor != "alice" || rec.Reason != "stuck worker" {
		t.Fatalf("revoke record: %+v", rec)
	}
	if got := grantByToken(t, b, g.Token); got.EndReason != backend.EndRevoked || got.Actor != "alice" || got.Reason != "stuck worker" {
		t.Fatalf("revoked grant in the log: %+v", got)
	}
	_, err = b.Release(ctx(t), "payout:acc-9", s.ID, g.Token)
	wantCode(t, err, problem.NotHeld, "release by the deposed holder")
	_, err = b.Revoke(ctx(t), "payout:acc-9", "alice", "again")
	wantCode(t, err, problem.NotHeld, "revoke of a free key")
	g2 := acquire(t, b, "payout:acc-9", s)
	if g2.Token <= g.Token {
		t.Fatalf("token after revoke %d <= %d", g2.Token, g.Token)
	}
}

func testUnknownSession(t *testing.T, st Store) {
	b := st.Open(t)
	const id = "4242424242"
	_, err := b.KeepAlive(ctx(t), id)
	wantCode(t, err, problem.SessionExpired, "keepalive of an unknown session")
	_, err = b.Acquire(ctx(t), "payout:u", id)
	wantCode(t, err, problem.SessionExpired, "acquire by an unknown session")
	_, err = b.Session(ctx(t), id)
	wantCode(t, err, problem.NotFound, "read an unknown session")
	_, err = b.CloseSession(ctx(t), id)
	wantCode(t, err, problem.SessionExpired, "close an unknown session")
	l, err := b.Lock(ctx(t), "payout:u")
	if err != nil || l.Held {
		t.Fatalf("a refused acquire left a lock: %+v %v", l, err)
	}
}

// testSessionTimes: a session's reported times agree with each other and
// with what the service last did: the last heartbeat is never before the
// session was created, is what the last keepalive reported (read twice,
// the same), and the expiry is the heartbeat plus the TTL.
func testSessionTimes(t *testing.T, st Store) {
	b := st.Open(t)
	s := session(t, b, "times", 10*time.Second)
	check := func(what string, want time.Time) {
		t.Helper()
		for range 2 {
			r, err := b.Session(ctx(t), s.ID)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if r.LastHeartbeatAt.Before(r.CreatedAt) {
				t.Errorf("%s: last heartbeat %s before creation %s", what, r.LastHeartbeatAt, r.CreatedAt)
			}
			if d := r.LastHeartbeatAt.Sub(want); d < -time.Millisecond || d > time.Millisecond {
				t.Errorf("%s: last heartbeat %s, want %s (%s apart)", what, r.LastHeartbeatAt, want, d)
			}
			if d := r.ExpiresAt.Sub(r.LastHeartbeatAt.Add(r.TTL)); d < -time.Millisecond || d > time.Millisecond {
				t.Errorf("%s: expires %s, want last heartbeat %s + TTL %s", what, r.ExpiresAt, r.LastHeartbeatAt, r.TTL)
			}
		}
	}
	check("after create", s.LastHeartbeatAt)
	k, err := b.KeepAlive(ctx(t), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	check("after keepalive", k.LastHeartbeatAt)
	// Closing answers the times a read shows afterwards: the last
	// heartbeat, and the close as the expiry.
	before := time.Now()
	c, err := b.CloseSession(ctx(t), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	r, err := b.Session(ctx(t), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !c.LastHeartbeatAt.Equal(r.LastHeartbeatAt) || !c.ExpiresAt.Equal(r.ExpiresAt) {
		t.Errorf("close answered heartbeat %s, expiry %s; a read after it shows %s, %s", c.LastHeartbeatAt, c.ExpiresAt, r.LastHeartbeatAt, r.ExpiresAt)
	}
	if d := r.LastHeartbeatAt.Sub(k.LastHeartbeatAt); d < -time.Millisecond || d > time.Millisecond {
		t.Errorf("closed session: last heartbeat %s, want the last keepalive's %s", r.LastHeartbeatAt, k.LastHeartbeatAt)
	}
	if r.ExpiresAt.Before(before.Add(-time.Second)) || r.ExpiresAt.After(time.Now().Add(time.Second)) {
		t.Errorf("closed session: expiry %s, want the close (between %s and now)", r.ExpiresAt, before)
	}
}
