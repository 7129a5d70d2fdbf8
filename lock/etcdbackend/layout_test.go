package etcdbackend_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/etcdbackend"
	"github.com/payouts/payouts/lock/fencing"
)

// makeGrants makes n grants of distinct keys under prefix, released at
// once, in a few goroutines; it returns their tokens in no order.
func makeGrants(t *testing.T, ctx context.Context, b *etcdbackend.Backend, sid, prefix string, n int) []fencing.Token {
	t.Helper()
	const workers = 8
	var mu sync.Mutex
	var tokens []fencing.Token
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				g, err := b.Acquire(ctx, fmt.Sprintf("%s:%05d", prefix, i), sid)
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := b.Release(ctx, g.Key, sid, g.Token); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				tokens = append(tokens, g.Token)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return tokens
}

// allGrants reads the whole grant log in pages of limit.
func allGrants(t *testing.T, ctx context.Context, b backend.Backend, limit int) []backend.GrantRecord {
	t.Helper()
	var out []backend.GrantRecord
	var after fencing.Token
	for {
		page, err := b.Grants(ctx, after, limit)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			return out
		}
		out = append(out, page...)
		after = page[len(page)-1].Token
	}
}

// revision is the store's revision now: once a grant was made, the high
// token read after it is at least this.
func revision(t *testing.T, ctx context.Context, cli *clientv3.Client) int64 {
	t.Helper()
	resp, err := cli.Get(ctx, "/revision")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// grantRecordsCounted is how many ended grant records etcd counted (which
// it does for every key of a range it reads, whatever the limit) in the
// range reads of calls.
func grantRecordsCounted(calls []rpcCall) int64 {
	var n int64
	count := func(req *etcdserverpb.RangeRequest, resp *etcdserverpb.RangeResponse) {
		if req != nil && resp != nil && strings.Contains(string(req.Key), "/grants/") {
			n += resp.Count
		}
	}
	for _, c := range calls {
		switch req := c.req.(type) {
		case *etcdserverpb.RangeRequest:
			count(req, c.reply.(*etcdserverpb.RangeResponse))
		case *etcdserverpb.TxnRequest:
			resp := c.reply.(*etcdserverpb.TxnResponse)
			for i, op := range req.Success {
				if i < len(resp.Responses) {
					count(op.GetRequestRange(), resp.Responses[i].GetResponseRange())
				}
			}
		}
	}
	return n
}

// TestAGrantPageReadsItsOwnRecordsNotTheLog: a page of the grant log costs
// etcd the page's records, not the whole log (the reconciler reads the
// whole log in pages, so a page that reads the log makes a pass grow with
// the square of its length). With 1,500 ended grants and some held ones
// between them, a page of 50 from the middle makes etcd count at most ten
// pages' worth of records; the pages together give the whole log in token
// order, each grant once, held ones as open, whatever the page size.
func TestAGrantPageReadsItsOwnRecordsNotTheLog(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rc, _, b := countedBackend(t, ctx)
	s, err := b.CreateSession(ctx, "w", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ended := makeGrants(t, ctx, b, s.ID, "page:a", 750)
	held, _ := acquireMany(t, ctx, b, s.ID, "page:held", 5)
	ended = append(ended, makeGrants(t, ctx, b, s.ID, "page:b", 750)...)

	all := allGrants(t, ctx, b, 50)
	if len(all) != len(ended)+len(held) {
		t.Fatalf("the pages hold %d grants; want %d", len(all), len(ended)+len(held))
	}
	for i, r := range all {
		if i > 0 && r.Token <= all[i-1].Token {
			t.Fatalf("grant %d (token %d) follows token %d: not in token order", i, r.Token, all[i-1].Token)
		}
		if open := r.EndedAt == nil; open != held[r.Token] {
			t.Fatalf("grant %d: ended_at %v, held %v", r.Token, r.EndedAt, held[r.Token])
		}
	}

	// Pages smaller than the held grants: the open markers' read is cut
	// short by the limit too, and the log reads the same.
	if small := allGrants(t, ctx, b, 3); !slices.EqualFunc(small, all, func(a, b backend.GrantRecord) bool {
		return a.Token == b.Token && (a.EndedAt == nil) == (b.EndedAt == nil)
	}) {
		t.Fatalf("pages of 3 hold %d grants, not the %d of pages of 50 in the same order", len(small), len(all))
	}

	const limit = 50
	mid := all[len(all)/2].Token
	var page []backend.GrantRecord
	calls := rc.duringCalls(func() {
		if page, err = b.Grants(ctx, mid, limit); err != nil {
			t.Fatal(err)
		}
	})
	if len(page) != limit || page[0].Token != all[len(all)/2+1].Token {
		t.Fatalf("page after %d: %d grants from %d; want %d from %d", mid, len(page), page[0].Token, limit, all[len(all)/2+1].Token)
	}
	if n := grantRecordsCounted(calls); n > 10*limit {
		t.Errorf("a page of %d made etcd count %d grant records; want at most %d (the log holds %d)", limit, n, 10*limit, len(all))
	}
}

// TestGrantPagesAndHighTokenCrossGaps: tokens are etcd revisions, and other
// writes (or compaction of old records) leave gaps between grants far wider
// than a page. The log reads across them, and the grants below them are
// found: the high token is the store's revision, not 0.
func TestGrantPagesAndHighTokenCrossGaps(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, cli, b := countedBackend(t, ctx)
	s, err := b.CreateSession(ctx, "w", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	gap := func() {
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for i := range 400 {
					if _, err := cli.Put(ctx, fmt.Sprintf("/gap/%d/%d", w, i), "x"); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	first := makeGrants(t, ctx, b, s.ID, "gap:first", 1)[0]
	gap()
	second := makeGrants(t, ctx, b, s.ID, "gap:second", 1)[0]
	gap()
	if t.Failed() {
		t.FailNow()
	}
	recs, err := b.Grants(ctx, 0, 10)
	if err != nil || len(recs) != 2 || recs[0].Token != first || recs[1].Token != second {
		t.Fatalf("grant log across gaps: %+v %v; want tokens %d and %d", recs, err, first, second)
	}
	if recs, err := b.Grants(ctx, first, 1); err != nil || len(recs) != 1 || recs[0].Token != second {
		t.Fatalf("page after %d: %+v %v; want token %d", first, recs, err, second)
	}
	rev := revision(t, ctx, cli)
	if high, err := b.HighToken(ctx); err != nil || int64(high) < rev {
		t.Fatalf("high token with the last grant, %d, below a gap: %d %v; want at least the revision %d", second, high, err, rev)
	}
	open, err := b.Acquire(ctx, "gap:open", s.ID)
	if err != nil {
		t.Fatal(err)
	}
	gap()
	rev = revision(t, ctx, cli)
	if high, err := b.HighToken(ctx); err != nil || int64(high) < rev {
		t.Fatalf("high token with a held grant, %d, below a gap: %d %v; want at least the revision %d", open.Token, high, err, rev)
	}
}

// TestEarlierLayoutIsMigrated: a grant log written by the earlier layout
// (every record at grants/<id> from its acquire on, markers holding the
// lock key) is moved by Open: an ended grant to its token's key, a held
// one into its marker (which a release then ends as usual), and a grant
// whose lease expired while no service ran is recorded by the sweep. A
// marker whose record is missing gets one from its lock key, or is
// recorded as expired when its key is gone; an ended record already
// written is not overwritten. No record is left at the old keys, no
// marker holds a bare key, and the log reads the same.
func TestEarlierLayoutIsMigrated(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cli := newClient(t)
	prefix := fmt.Sprintf("/test/%d", seq.Add(1))
	open := func() *etcdbackend.Backend {
		b, err := etcdbackend.Open(ctx, etcdbackend.Config{Client: cli, Prefix: prefix, Logger: slog.New(slog.DiscardHandler), SweepInterval: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	b0 := open()
	live, err := b0.CreateSession(ctx, "live", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lapsing, err := b0.CreateSession(ctx, "lapsing", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	b0.Close()

	n := 0
	legacyID := func() string {
		n++
		return fmt.Sprintf("%016x%016x", time.Now().UnixNano(), n)
	}
	at := time.Now().UTC().Truncate(time.Millisecond)
	record := func(key, sid string, ended bool) string {
		v := map[string]any{"key": key, "owner": "o-" + key, "session_id": sid, "granted_at": at}
		if ended {
			v["ended_at"], v["end_reason"] = at, "released"
		}
		b, _ := json.Marshal(v)
		return string(b)
	}
	// An ended grant: its record alone.
	endedID := legacyID()
	resp, err := cli.Put(ctx, prefix+"/grants/"+endedID, record("legacy:ended", live.ID, true))
	if err != nil {
		t.Fatal(err)
	}
	endedToken := fencing.Token(resp.Header.Revision)
	// A held grant, and one whose lease then expires: lock key, record and
	// marker in the acquire's transaction, as the earlier layout wrote them.
	acquire := func(key, sid string) fencing.Token {
		lease, _ := strconv.ParseInt(sid, 10, 64)
		id := legacyID()
		lv, _ := json.Marshal(map[string]any{"owner": "o-" + key, "session_id": sid, "grant_id": id, "granted_at": at})
		r, err := cli.Txn(ctx).Then(
			clientv3.OpPut(prefix+"/locks/"+key, string(lv), clientv3.WithLease(clientv3.LeaseID(lease))),
			clientv3.OpPut(prefix+"/grants/"+id, record(key, sid, false)),
			clientv3.OpPut(prefix+"/open/"+id, key)).Commit()
		if err != nil {
			t.Fatal(err)
		}
		return fencing.Token(r.Header.Revision)
	}
	heldToken := acquire("legacy:held", live.ID)
	lapsedToken := acquire("legacy:lapsed", lapsing.ID)
	// Records the earlier layout cannot make alone, as an earlier replica
	// running beside this version leaves them: a held grant whose marker
	// holds the bare key but whose record is gone; a marker alone, its
	// key gone; and a grant this version ended (its ended record written,
	// its marker deleted) while its old record stayed open.
	bareHeldToken := acquire("legacy:bare-held", live.ID)
	bareGoneToken := acquire("legacy:bare-gone", lapsing.ID)
	endedHereToken := acquire("legacy:ended-here", live.ID)
	r, err := cli.Get(ctx, prefix+"/grants/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range r.Kvs {
		id := strings.TrimPrefix(string(kv.Key), prefix+"/grants/")
		switch fencing.Token(kv.CreateRevision) {
		case bareHeldToken, bareGoneToken:
			if _, err := cli.Delete(ctx, string(kv.Key)); err != nil {
				t.Fatal(err)
			}
		case endedHereToken:
			if _, err := cli.Txn(ctx).Then(clientv3.OpDelete(prefix+"/open/"+id), clientv3.OpDelete(prefix+"/locks/legacy:ended-here"),
				clientv3.OpPut(etcdbackend.EndedGrantKey(prefix, int64(endedHereToken)), record("legacy:ended-here", live.ID, true))).Commit(); err != nil {
				t.Fatal(err)
			}
		}
	}
	lease, _ := strconv.ParseInt(lapsing.ID, 10, 64)
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(lease)); err != nil {
		t.Fatal(err)
	}

	b := open()
	defer b.Close()
	if r, err := cli.Get(ctx, prefix+"/grants/1", clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix+"/grants/")), clientv3.WithCountOnly()); err != nil || r.Count != 0 {
		t.Fatalf("records left at the earlier layout's keys: %v %v", r, err)
	}
	if r, err := cli.Get(ctx, prefix+"/open/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	} else {
		for _, kv := range r.Kvs {
			if !json.Valid(kv.Value) {
				t.Errorf("marker %s still holds %q after the move", kv.Key, kv.Value)
			}
		}
	}
	recs, err := b.Grants(ctx, 0, 10)
	if err != nil || len(recs) != 6 {
		t.Fatalf("grant log after the move: %+v %v; want 6 grants", recs, err)
	}
	for i, want := range []struct {
		token      fencing.Token
		key, owner string
		end        string // "": open
	}{
		{endedToken, "legacy:ended", "o-legacy:ended", backend.EndReleased},
		{heldToken, "legacy:held", "o-legacy:held", ""},
		{lapsedToken, "legacy:lapsed", "o-legacy:lapsed", ""},
		{bareHeldToken, "legacy:bare-held", "o-legacy:bare-held", ""}, // from its lock key
		{bareGoneToken, "legacy:bare-gone", "", backend.EndExpired},
		{endedHereToken, "legacy:ended-here", "o-legacy:ended-here", backend.EndReleased}, // not overwritten
	} {
		r := recs[i]
		if r.Token != want.token || r.Key != want.key || r.Owner != want.owner || r.EndReason != want.end || (r.EndedAt != nil) != (want.end != "") {
			t.Errorf("grant %d after the move: %+v; want token %d key %s owner %s end %q", i, r, want.token, want.key, want.owner, want.end)
		}
		if want.owner != "" && !r.GrantedAt.Equal(at) {
			t.Errorf("grant %d after the move: granted at %v; want %v", i, r.GrantedAt, at)
		}
	}
	rev := revision(t, ctx, cli)
	if high, err := b.HighToken(ctx); err != nil || int64(high) < rev {
		t.Errorf("high token after the move: %d %v; want at least the revision %d", high, err, rev)
	}
	running(t, ctx, b)
	waitExpired(t, ctx, b, lapsedToken)
	if _, err := b.Release(ctx, "legacy:held", live.ID, heldToken); err != nil {
		t.Fatalf("release of a grant held across the move: %v", err)
	}
	recs, err = b.Grants(ctx, heldToken-1, 1)
	if err != nil || len(recs) != 1 || recs[0].Token != heldToken || recs[0].EndReason != backend.EndReleased || recs[0].Owner != "o-legacy:held" {
		t.Fatalf("grant held across the move, released: %+v %v", recs, err)
	}
}

// TestAGrantPageIsReadAtOneRevision: a page whose ended records take more
// than one read is read at one revision, so a grant that ends between the
// reads is in the page once, as it was when the page began (open).
func TestAGrantPageIsReadAtOneRevision(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rc, cli, b := countedBackend(t, ctx)
	s, err := b.CreateSession(ctx, "w", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	first := makeGrants(t, ctx, b, s.ID, "onerev:first", 1)[0]
	for i := range 100 { // a gap wider than the page's first window (4 × 10 tokens)
		if _, err := cli.Put(ctx, fmt.Sprintf("/onerev-gap/%d", i), "x"); err != nil {
			t.Fatal(err)
		}
	}
	held, err := b.Acquire(ctx, "onerev:held", s.ID)
	if err != nil {
		t.Fatal(err)
	}
	rc.between(func(_ string, req any) bool { return isGrantsRead(req) }, func() {
		if _, err := b.Release(ctx, held.Key, s.ID, held.Token); err != nil {
			t.Error(err)
		}
	})
	recs, err := b.Grants(ctx, first-1, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].Token != first || recs[1].Token != held.Token || recs[1].EndedAt != nil {
		t.Fatalf("page with a grant ended while it was read: %+v; want %d, then %d open", recs, first, held.Token)
	}
}

// TestHighTokenIsReadAtOneRevision: the high token is read at one
// revision, so a grant made and released right after, and a compaction
// that deletes the record it found, cannot make it find no grant (a high
// token of 0): it is the revision of the read.
func TestHighTokenIsReadAtOneRevision(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const retention = time.Second
	rc, _, b := countedBackend(t, ctx, func(c *etcdbackend.Config) { c.GrantRetention = retention })
	s, err := b.CreateSession(ctx, "w", "p", backend.MaxTTL)
	if err != nil {
		t.Fatal(err)
	}
	old := makeGrants(t, ctx, b, s.ID, "high:old", 1)[0]
	time.Sleep(retention + 100*time.Millisecond) // older than the retention (the condition, not a synchronisation)
	var newer fencing.Token
	rc.between(func(_ string, req any) bool {
		r, ok := req.(*etcdserverpb.TxnRequest)
		return ok && len(r.Success) > 0 && strings.Contains(string(r.Success[0].GetRequestRange().GetKey()), "/open/")
	}, func() {
		newer = makeGrants(t, ctx, b, s.ID, "high:new", 1)[0]
		if n, _, err := b.Compact(ctx); err != nil || n != 1 {
			t.Errorf("compaction between the reads deleted %d (%v); want the old record", n, err)
		}
	})
	high, err := b.HighToken(ctx)
	if err != nil || newer == 0 {
		t.Fatalf("high token: %v (newer grant %d)", err, newer)
	}
	if high < old || high >= newer {
		t.Fatalf("high token read while %d was made and %d compacted away: %d; want the revision when the read began, from %d to %d", newer, old, high, old, newer-1)
	}
}

// TestHighTokenCoversTheStoresRevision: every future token (a
// CreateRevision) is above the store's current revision, so the high
// token is at least that revision, not only the highest grant's token.
// After a restore with --bump-revision (D-13) the restored grants are all
// below the guards' fences and the bumped revision above them: before,
// the high token was the highest restored grant, and the reconciler and
// payouts status reported the correctly restored store as rewound until a
// new grant was made. Writes that are not grants move the revision here.
func TestHighTokenCoversTheStoresRevision(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, cli, b := countedBackend(t, ctx)
	s, err := b.CreateSession(ctx, "w", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	last := makeGrants(t, ctx, b, s.ID, "rev:last", 1)[0]
	var rev int64
	for i := range 100 {
		resp, err := cli.Put(ctx, fmt.Sprintf("/rev-gap/%d", i), "x")
		if err != nil {
			t.Fatal(err)
		}
		rev = resp.Header.Revision
	}
	high, err := b.HighToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if int64(high) < rev || high < last {
		t.Fatalf("high token %d; want at least the store's revision %d (the last grant's token is %d)", high, rev, last)
	}
	next, err := b.Acquire(ctx, "rev:next", s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if next.Token <= high {
		t.Fatalf("next grant's token %d; want above the high token %d", next.Token, high)
	}
}

// TestCompactionPassesOverAGrantDatedAhead: a record granted later than
// now (a replica's clock ahead) does not stop compaction of the records
// after it.
func TestCompactionPassesOverAGrantDatedAhead(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const retention = time.Second
	prefix := fmt.Sprintf("/test/%d", seq.Add(1))
	_, cli, b := countedBackend(t, ctx, func(c *etcdbackend.Config) { c.GrantRetention = retention; c.Prefix = prefix })
	s, err := b.CreateSession(ctx, "w", "p", backend.MaxTTL)
	if err != nil {
		t.Fatal(err)
	}
	var old []fencing.Token // one at a time: a grant's release is the revision after it
	for i := range 4 {
		old = append(old, makeGrants(t, ctx, b, s.ID, fmt.Sprintf("ahead:old%d", i), 1)...)
	}
	ahead := time.Now().Add(365 * 24 * time.Hour).UTC()
	v, _ := json.Marshal(map[string]any{"key": "ahead:clock", "owner": "o", "session_id": s.ID, "granted_at": ahead, "ended_at": ahead, "end_reason": "released"})
	aheadToken := old[0] + 1 // the first grant's release: no grant's token
	if _, err := cli.Put(ctx, etcdbackend.EndedGrantKey(prefix, int64(aheadToken)), string(v)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(retention + 100*time.Millisecond) // older than the retention (the condition, not a synchronisation)
	if n, _, err := b.Compact(ctx); err != nil || n != len(old)-1 {
		t.Fatalf("compaction deleted %d grants (%v); want %d (all the old ones but the highest)", n, err, len(old)-1)
	}
	var got []fencing.Token
	for _, r := range allGrants(t, ctx, b, 10) {
		got = append(got, r.Token)
	}
	if want := []fencing.Token{aheadToken, old[len(old)-1]}; !slices.Equal(got, want) {
		t.Fatalf("grant log after compaction: %v; want %v", got, want)
	}
}

// openRecordsRead is how many open markers the replies of calls carried
// whole (with their records).
func openRecordsRead(calls []rpcCall) int {
	n := 0
	count := func(resp *etcdserverpb.RangeResponse) {
		for _, kv := range resp.GetKvs() {
			if strings.Contains(string(kv.Key), "/open/") && len(kv.Value) > 0 {
				n++
			}
		}
	}
	for _, c := range calls {
		switch r := c.reply.(type) {
		case *etcdserverpb.RangeResponse:
			count(r)
		case *etcdserverpb.TxnResponse:
			for _, op := range r.Responses {
				count(op.GetResponseRange())
			}
		}
	}
	return n
}

// TestAPageReadsOnlyTheOpenRecordsItReturns: the open grants are the most
// recent, and there can be thousands (one per account an executor keeps);
// a page reads whole only the open markers it returns, so a pass over the
// log does not read every open grant's record on every page.
func TestAPageReadsOnlyTheOpenRecordsItReturns(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rc, _, b := countedBackend(t, ctx)
	s, err := b.CreateSession(ctx, "w", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ended := makeGrants(t, ctx, b, s.ID, "few:ended", 100)
	slices.Sort(ended)
	held, _ := acquireMany(t, ctx, b, s.ID, "few:held", 150)
	for _, c := range []struct {
		after             fencing.Token
		limit, open, read int
	}{
		{0, 50, 0, 0},
		{ended[len(ended)-11], 50, 40, 40},
		{ended[len(ended)-1], 150, 150, 150}, // more than one read transaction's worth: one range read
	} {
		var page []backend.GrantRecord
		calls := rc.duringCalls(func() {
			if page, err = b.Grants(ctx, c.after, c.limit); err != nil {
				t.Fatal(err)
			}
		})
		open := 0
		for _, r := range page {
			if held[r.Token] && r.EndedAt == nil && r.Key != "" && r.Owner == "w" {
				open++
			}
		}
		if len(page) != c.limit || open != c.open {
			t.Fatalf("page after %d: %d grants, %d of them open with their records; want %d and %d", c.after, len(page), open, c.limit, c.open)
		}
		for i := 1; i < len(page); i++ {
			if page[i].Token <= page[i-1].Token {
				t.Fatalf("page after %d: token %d follows %d", c.after, page[i].Token, page[i-1].Token)
			}
		}
		if n := openRecordsRead(calls); n != c.read {
			t.Errorf("page after %d (%d open grants, %d held in all) read %d open records; want %d", c.after, open, len(held), n, c.read)
		}
	}
}
