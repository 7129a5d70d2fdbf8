package pgbackend

import (
	"testing"
	"time"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
)

// TestFreeAcquireGrantsOnlyFreeKeys: the fast path grants a key that has
// no entry, logged like any grant, and leaves every other case (held by
// another session, re-acquired by its holder, a lapsed holder to take
// over, a session that is not live) to the full acquire, drawing no token
// for them; Acquire still answers each case as before.
func TestFreeAcquireGrantsOnlyFreeKeys(t *testing.T) {
	t.Parallel()
	ctx, b := openFresh(t)
	a, err := b.CreateSession(ctx, "a", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	other, err := b.CreateSession(ctx, "other", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lapsing, err := b.CreateSession(ctx, "lapsing", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	closed, err := b.CreateSession(ctx, "closed", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	g, granted, err := b.acquireFree(ctx, "fast:free", a.ID)
	if err != nil || !granted {
		t.Fatalf("free key: granted %v, err %v; want granted", granted, err)
	}
	if g.Key != "fast:free" || g.SessionID != a.ID || g.Owner != "a" || g.Token <= 0 || g.ServerExpiry.IsZero() || g.Existing {
		t.Errorf("free key: grant %+v", g)
	}
	var logged int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM lock_grant WHERE token = $1 AND key = $2 AND session_id = $3 AND ended_at IS NULL`,
		int64(g.Token), g.Key, a.ID).Scan(&logged); err != nil || logged != 1 {
		t.Errorf("free key: %d open grant records for token %d (err %v), want 1", logged, g.Token, err)
	}
	if _, err := b.Acquire(ctx, "fast:lapsed", lapsing.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE lock_session SET expires_at = now() - interval '1 second' WHERE id = $1`, lapsing.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CloseSession(ctx, closed.ID); err != nil {
		t.Fatal(err)
	}
	var before int64
	if err := b.pool.QueryRow(ctx, `SELECT last_value FROM lock_token_seq`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, key, session string }{
		{"held by another session", "fast:free", other.ID},
		{"re-acquired by its holder", "fast:free", a.ID},
		{"a lapsed holder's key", "fast:lapsed", other.ID},
		{"a closed session", "fast:nobody", closed.ID},
	} {
		if _, granted, err := b.acquireFree(ctx, c.key, c.session); granted || err != nil {
			t.Errorf("%s: fast path granted %v, err %v; want it left to the full acquire", c.name, granted, err)
		}
	}
	var after int64
	if err := b.pool.QueryRow(ctx, `SELECT last_value FROM lock_token_seq`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("the fast path's misses drew %d tokens, want none", after-before)
	}
	// And Acquire settles each of them as the full acquire does.
	if _, err := b.Acquire(ctx, "fast:free", other.ID); !problem.Has(err, problem.LockHeld) {
		t.Errorf("held by another session: %v, want lock_held", err)
	}
	if again, err := b.Acquire(ctx, "fast:free", a.ID); err != nil || !again.Existing || again.Token != g.Token {
		t.Errorf("re-acquire: %+v, %v; want the same token, existing", again, err)
	}
	if took, err := b.Acquire(ctx, "fast:lapsed", other.ID); err != nil || took.SessionID != other.ID || took.Token <= fencing.Token(after) {
		t.Errorf("lapsed holder's key: %+v, %v; want taken over with a new token", took, err)
	}
	if _, err := b.Acquire(ctx, "fast:nobody", closed.ID); !problem.Has(err, problem.SessionExpired) {
		t.Errorf("closed session: %v, want session gone", err)
	}
}
