package etcdbackend_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/etcdbackend"
	"github.com/payouts/payouts/lock/fencing"
)

// TestKeyspaceStaysBounded: with a retention, compaction keeps the lock
// service's etcd keyspace bounded however many grants are made, keeps the
// newest grant record (the high token stays known) and never touches a
// grant that is still held.
func TestKeyspaceStaysBounded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cli := newClient(t)
	prefix := fmt.Sprintf("/test/%d", seq.Add(1))
	b, err := etcdbackend.Open(ctx, etcdbackend.Config{Client: cli, Prefix: prefix, Logger: slog.New(slog.DiscardHandler), GrantRetention: time.Millisecond})
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
	keys := func() int64 {
		resp, err := cli.Get(ctx, prefix+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	const rounds, perRound = 5, 100
	var last backend.Grant
	for r := range rounds {
		s, err := b.CreateSession(ctx, fmt.Sprintf("w-%d", r), "p", backend.MaxTTL)
		if err != nil {
			t.Fatal(err)
		}
		for i := range perRound {
			if last, err = b.Acquire(ctx, fmt.Sprintf("payout:k-%d", i%7), s.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Release(ctx, last.Key, s.ID, last.Token); err != nil {
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
		// keeper: session record, alive key, lock, grant record, open
		// marker; the newest grant record; the last session's record
		// (created within the retention window of the closing round).
		if n := keys(); n > 8 {
			t.Fatalf("after round %d (%d grants made): %d keys under %s; want at most 8", r+1, (r+1)*perRound+1, n, prefix)
		}
	}
	if high, err := b.HighToken(ctx); err != nil || high < last.Token {
		t.Fatalf("high token after compaction: %d %v; want at least %d", high, err, last.Token)
	}
	if l, err := b.Lock(ctx, "payout:held"); err != nil || !l.Held || l.Token != held.Token {
		t.Fatalf("compaction touched a held grant: %+v %v", l, err)
	}
	recs, err := b.Grants(ctx, 0, 10)
	if err != nil || len(recs) == 0 || recs[0].Token != held.Token {
		t.Fatalf("grant log after compaction: %+v %v; want the held grant first", recs, err)
	}
}

// TestCompactionKeepsWhatEndedWithinTheRetention: compaction deletes the
// ended records older than the retention and no other: a grant granted
// before the cutoff but held until after it stays until its end is older
// than the retention, and the ended record of the highest token always
// stays (the high token stays known).
func TestCompactionKeepsWhatEndedWithinTheRetention(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const retention = 3 * time.Second
	_, cli, _ := countedBackend(t, ctx)
	b, err := etcdbackend.Open(ctx, etcdbackend.Config{Client: cli, Prefix: fmt.Sprintf("/test/%d", seq.Add(1)), Logger: slog.New(slog.DiscardHandler), GrantRetention: retention})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	s, err := b.CreateSession(ctx, "w", "p", backend.MaxTTL)
	if err != nil {
		t.Fatal(err)
	}
	long, err := b.Acquire(ctx, "compact:long", s.ID)
	if err != nil {
		t.Fatal(err)
	}
	old := makeGrants(t, ctx, b, s.ID, "compact:old", 3)
	time.Sleep(retention + 100*time.Millisecond) // older than the retention (the condition, not a synchronisation)
	if _, err := b.Release(ctx, long.Key, s.ID, long.Token); err != nil {
		t.Fatal(err)
	}
	slices.Sort(old)
	if n, _, err := b.Compact(ctx); err != nil || n != len(old)-1 {
		t.Fatalf("compaction deleted %d grants (%v); want the %d that ended before the cutoff, less the highest", n, err, len(old)-1)
	}
	tokens := func() []fencing.Token {
		var out []fencing.Token
		for _, r := range allGrants(t, ctx, b, 10) {
			out = append(out, r.Token)
		}
		return out
	}
	if got := tokens(); !slices.Equal(got, []fencing.Token{long.Token, old[len(old)-1]}) {
		t.Fatalf("grant log after compaction: %v; want the grant held across the cutoff, %d, and the highest token's, %d", got, long.Token, old[len(old)-1])
	}
	recent := makeGrants(t, ctx, b, s.ID, "compact:recent", 1)[0]
	time.Sleep(retention + 100*time.Millisecond)
	if n, _, err := b.Compact(ctx); err != nil || n != 2 {
		t.Fatalf("second compaction deleted %d grants (%v); want 2 (the record of the highest token stays)", n, err)
	}
	if got := tokens(); len(got) != 1 || got[0] != recent {
		t.Fatalf("grant log after the second compaction: %v; want the newest record, %d", got, recent)
	}
	if high, err := b.HighToken(ctx); err != nil || high != recent {
		t.Fatalf("high token after compaction: %d %v; want %d", high, err, recent)
	}
}
