package pgbackend

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/migrations"
)

// TestGrantLogStaysBounded: with a retention, compaction keeps lockdb's
// grant log and session table bounded however many grants are made, keeps
// the newest grant (the high token stays known) and never touches a grant
// that is still held.
func TestGrantLogStaysBounded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := Open(ctx, Config{DatabaseURL: pgtest.NewDB(t, migrations.LockDB), Logger: slog.New(slog.DiscardHandler),
		GrantRetention: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	keeper, err := b.CreateSession(ctx, "keeper", "p", backend.MaxTTL)
	if err != nil {
		t.Fatal(err)
	}
	held, err := b.Acquire(ctx, "payout:held", keeper.ID)
	if err != nil {
		t.Fatal(err)
	}
	count := func() (grants, sessions int) {
		if err := b.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM lock_grant), (SELECT count(*) FROM lock_session)`).Scan(&grants, &sessions); err != nil {
			t.Fatal(err)
		}
		return
	}
	const rounds, perRound = 5, 100
	for r := range rounds {
		s, err := b.CreateSession(ctx, fmt.Sprintf("w-%d", r), "p", backend.MaxTTL)
		if err != nil {
			t.Fatal(err)
		}
		for i := range perRound {
			g, err := b.Acquire(ctx, fmt.Sprintf("payout:k-%d", i%7), s.ID)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.Release(ctx, g.Key, s.ID, g.Token); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := b.CloseSession(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // older than the retention (the condition, not a synchronisation)
		if _, _, err := b.Compact(ctx); err != nil {
			t.Fatal(err)
		}
		// The held grant, the newest grant, and the sessions they belong to.
		if g, s := count(); g > 2 || s > 2 {
			t.Fatalf("after round %d (%d grants made): %d grants and %d sessions remain; want at most 2 of each", r+1, (r+1)*perRound+1, g, s)
		}
		// No grant or held lock is left without its session (compaction's
		// own check: lockdb has no foreign key to lock_session).
		var orphans int
		if err := b.pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM lock_grant g WHERE NOT EXISTS (SELECT 1 FROM lock_session s WHERE s.id = g.session_id)) +
			(SELECT count(*) FROM lock_entry e WHERE NOT EXISTS (SELECT 1 FROM lock_session s WHERE s.id = e.session_id))`).Scan(&orphans); err != nil {
			t.Fatal(err)
		}
		if orphans != 0 {
			t.Fatalf("after round %d: %d grants or locks refer to a deleted session", r+1, orphans)
		}
	}
	high, err := b.HighToken(ctx)
	if err != nil || int64(high) < rounds*perRound {
		t.Fatalf("high token after compaction: %d %v", high, err)
	}
	if l, err := b.Lock(ctx, "payout:held"); err != nil || !l.Held || l.Token != held.Token {
		t.Fatalf("compaction touched a held grant: %+v %v", l, err)
	}
	recs, err := b.Grants(ctx, 0, 10)
	if err != nil || len(recs) == 0 || recs[0].Token != held.Token {
		t.Fatalf("grant log after compaction: %+v %v; want the held grant first", recs, err)
	}
}
