package etcdbackend_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/payouts/payouts/internal/loopback"
	"github.com/payouts/payouts/internal/problem"
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
	rev := revision(t, ctx, cli)
	if high, err := b.HighToken(ctx); err != nil || int64(high) < rev {
		t.Fatalf("high token after compaction: %d %v; want at least the revision %d (the newest grant is %d)", high, err, rev, recent)
	}
}

// TestCompactionKeepsSessionsThatEndedWithinTheRetention: an ended
// session's record stays until its end, not its creation, is older than
// the retention, as on PostgreSQL: a session opened before the cutoff that
// is closed (or expires) now still reads CLOSED (or EXPIRED), and a second
// DELETE still answers CLOSED. Before, compaction deleted it right after it
// ended: GET answered 404 and DELETE session_expired. An expiry is dated
// when compaction first finds the session gone (etcd keeps no time for a
// lease's end); here leases are revoked, which is what an expiry looks like
// to the lock service, so that they end when the test says.
func TestCompactionKeepsSessionsThatEndedWithinTheRetention(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const retention = 5 * time.Second // the late ones must be compacted within it of their end, on a loaded machine too
	_, cli, b := countedBackend(t, ctx, func(c *etcdbackend.Config) { c.GrantRetention = retention })
	create := func(owner string) backend.Session {
		t.Helper()
		s, err := b.CreateSession(ctx, owner, "p", backend.MaxTTL)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	expire := func(s backend.Session) {
		t.Helper()
		lease, _ := strconv.ParseInt(s.ID, 10, 64)
		if _, err := cli.Revoke(ctx, clientv3.LeaseID(lease)); err != nil {
			t.Fatal(err)
		}
	}
	closedEarly, expiredEarly := create("closed-early"), create("expired-early")
	if _, err := b.CloseSession(ctx, closedEarly.ID); err != nil {
		t.Fatal(err)
	}
	expire(expiredEarly)
	if _, n, err := b.Compact(ctx); err != nil || n != 0 {
		t.Fatalf("compaction of sessions that just ended deleted %d (%v); want none", n, err)
	}
	closedLate, expiredLate := create("closed-late"), create("expired-late")
	time.Sleep(retention + 100*time.Millisecond) // all four created before the cutoff (the condition, not a synchronisation)
	if _, err := b.CloseSession(ctx, closedLate.ID); err != nil {
		t.Fatal(err)
	}
	expire(expiredLate)
	if _, n, err := b.Compact(ctx); err != nil || n != 2 {
		t.Fatalf("compaction deleted %d sessions (%v); want the 2 that ended before the cutoff", n, err)
	}
	for _, s := range []backend.Session{closedEarly, expiredEarly} {
		if got, err := b.Session(ctx, s.ID); !problem.Has(err, problem.NotFound) {
			t.Errorf("session %s (%s), ended before the cutoff, after compaction: %+v %v; want not found", s.ID, s.Owner, got, err)
		}
	}
	if got, err := b.Session(ctx, closedLate.ID); err != nil || got.State != backend.StateClosed {
		t.Errorf("session created before the cutoff and closed since, after compaction: %+v %v; want CLOSED", got, err)
	}
	if got, err := b.CloseSession(ctx, closedLate.ID); err != nil || got.State != backend.StateClosed {
		t.Errorf("second close of a session closed since the cutoff, after compaction: %+v %v; want CLOSED", got, err)
	}
	if got, err := b.Session(ctx, expiredLate.ID); err != nil || got.State != backend.StateExpired {
		t.Errorf("session created before the cutoff and expired since, after compaction: %+v %v; want EXPIRED", got, err)
	}
}

// memberWithTxnLimit starts an etcd member of its own, whose transactions
// may hold at most maxTxnOps operations (--max-txn-ops), and returns its
// client URL; the member stops when the test ends. Its ports are picked
// free and picked again if another process bound one first.
func memberWithTxnLimit(t *testing.T, maxTxnOps uint) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	for attempt := 1; ; attempt++ {
		cp, err := loopback.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		pp, err := loopback.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		client := fmt.Sprintf("http://127.0.0.1:%d", cp)
		e, err := etcdbackend.StartMember(etcdbackend.Member{Name: "limited", Dir: filepath.Join(dir, strconv.Itoa(attempt)),
			ClientURL: client, PeerURL: fmt.Sprintf("http://127.0.0.1:%d", pp), MaxTxnOps: maxTxnOps})
		if err != nil && attempt < 5 && strings.Contains(err.Error(), "address already in use") {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Close)
		if err := e.Ready(ctx); err != nil {
			t.Fatal(err)
		}
		return client
	}
}

// TestCompactionSplitsWhatTheClusterRefuses: on a cluster whose
// --max-txn-ops is below compaction's delete batch (100), the batch is
// split until etcd takes it, as every other batch of the backend is
// (inBatches), and compaction deletes every ended record older than the
// retention but the newest. Before, each pass failed with "too many
// operations in txn request" and deleted nothing: the log grew until
// etcd's quota.
func TestCompactionSplitsWhatTheClusterRefuses(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{memberWithTxnLimit(t, 64)}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	const retention = time.Millisecond
	b, err := etcdbackend.Open(ctx, etcdbackend.Config{Client: cli, Prefix: "/limited", Logger: slog.New(slog.DiscardHandler), GrantRetention: retention})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	s, err := b.CreateSession(ctx, "w", "p", backend.MaxTTL)
	if err != nil {
		t.Fatal(err)
	}
	const n = 110
	tokens := makeGrants(t, ctx, b, s.ID, "split", n)
	newest := slices.Max(tokens)
	time.Sleep(10 * retention) // every record older than the retention (the condition, not a synchronisation)
	if got, _, err := b.Compact(ctx); err != nil || got != n-1 {
		t.Fatalf("compaction on a cluster with --max-txn-ops 64 deleted %d grant records (%v); want %d, all but the newest", got, err, n-1)
	}
	if recs := allGrants(t, ctx, b, 200); len(recs) != 1 || recs[0].Token != newest {
		t.Fatalf("grant log after compaction: %d records %+v; want only the newest, %d", len(recs), recs, newest)
	}
}

// TestACompactionCutShortKeepsWhatItDeleted: a compaction pass that ends
// part way (Run bounds each by the step timeout) has deleted the records
// it read before, and reports them; the next pass goes on from there.
// Before, a pass read the whole log before deleting anything, so a log too
// long to read within the timeout was never compacted. Here the pass is
// cut as it asks for its second page of records.
func TestACompactionCutShortKeepsWhatItDeleted(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("/test/%d", seq.Add(1))
	var pages atomic.Int32
	var cut atomic.Pointer[context.CancelFunc]
	cutOnSecondPage := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*etcdserverpb.RangeRequest); ok && strings.HasPrefix(string(r.Key), prefix+"/grants/") {
			if c := cut.Load(); c != nil && pages.Add(1) == 2 {
				(*c)()
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(cutOnSecondPage)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	const retention = time.Millisecond
	b, err := etcdbackend.Open(ctx, etcdbackend.Config{Client: cli, Prefix: prefix, Logger: slog.New(slog.DiscardHandler), GrantRetention: retention})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	s, err := b.CreateSession(ctx, "w", "p", backend.MaxTTL)
	if err != nil {
		t.Fatal(err)
	}
	const n = 600 // more than a page of compaction's reads (500)
	newest := slices.Max(makeGrants(t, ctx, b, s.ID, "cut", n))
	time.Sleep(10 * retention) // every record older than the retention (the condition, not a synchronisation)
	pass, cutPass := context.WithCancel(ctx)
	defer cutPass()
	cut.Store(&cutPass)
	deleted, _, err := b.Compact(pass)
	cut.Store(nil)
	if err == nil {
		t.Fatal("the compaction pass cut short succeeded")
	}
	if deleted == 0 || deleted >= n-1 {
		t.Fatalf("the compaction pass cut short at its second page deleted %d grant records (%v); want those of its first page", deleted, err)
	}
	if left := len(allGrants(t, ctx, b, 1000)); left != n-deleted {
		t.Fatalf("after a compaction pass that reported %d deleted: %d of %d grant records left; want %d", deleted, left, n, n-deleted)
	}
	if more, _, err := b.Compact(ctx); err != nil || deleted+more != n-1 {
		t.Fatalf("the next compaction pass deleted %d grant records (%v); want the other %d but the newest", more, err, n-1-deleted)
	}
	if recs := allGrants(t, ctx, b, 1000); len(recs) != 1 || recs[0].Token != newest {
		t.Fatalf("grant log after both passes: %d records; want only the newest, %d", len(recs), newest)
	}
}
