package etcdbackend

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/fencing"
)

// The grant log (D-9): the open grants' markers open/<id> and the ended
// grants' records grants/<token>, and recording the grants that lease
// expiry ended.

// endedFrom and endedEnd bound the ended records: every token key starts
// with "0" (tokenKey).
func (b *Backend) endedFrom() string { return b.prefix + "/grants/0" }
func (b *Backend) endedEnd() string  { return b.prefix + "/grants/1" }

// endedToken is the token of the ended record kv, from its key.
func (b *Backend) endedToken(kv *mvccpb.KeyValue) (int64, error) {
	t, ok := parseTokenKey(strings.TrimPrefix(string(kv.Key), b.prefix+"/grants/"))
	if !ok {
		return 0, problem.New(problem.Internal, "grant record %s is not keyed by a token", kv.Key)
	}
	return t, nil
}

// Grants implements backend.Backend: the grant log in token order, tokens
// above after, read at one revision. The open grants are their markers
// above after, sorted by create revision (the token), read keys only
// (etcd answers from its in-memory index, however many locks are held);
// only the markers the page returns are then read whole. The ended
// records are read in key order (token order) from after's successor, a
// window of tokens at a time: etcd counts every key of a range it reads,
// whatever the limit, so a range to the end of the log would cost the
// whole log on every page. The first window is four pages of tokens wide,
// and each next one twice the last, up to the revision read at (no token
// is above it), so a page costs its own records and a few reads however
// long the log, and a gap (records compacted away) costs a read per
// doubling.
func (b *Backend) Grants(ctx context.Context, after fencing.Token, limit int) ([]backend.GrantRecord, error) {
	recs, err := retryCompacted(func() ([]backend.GrantRecord, error) { return b.grantPage(ctx, int64(after)+1, limit) })
	if err != nil {
		return nil, classify("list grants", err)
	}
	return recs, nil
}

func (b *Backend) grantPage(ctx context.Context, from int64, limit int) ([]backend.GrantRecord, error) {
	w := 4 * int64(limit)
	resp, err := b.cli.Txn(ctx).Then(
		clientv3.OpGet(b.openPath(""), clientv3.WithPrefix(), clientv3.WithMinCreateRev(from), clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(int64(limit))),
		clientv3.OpGet(b.grantPath(from), clientv3.WithRange(b.grantPath(from+w)), clientv3.WithLimit(int64(limit))),
	).Commit()
	if err != nil {
		return nil, err
	}
	rev := resp.Header.Revision
	open, ended := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	for len(ended) < limit && from+w <= rev {
		from, w = from+w, 2*w
		r, err := b.cli.Get(ctx, b.grantPath(from), clientv3.WithRange(b.grantPath(min(from+w, rev+1))),
			clientv3.WithLimit(int64(limit-len(ended))), clientv3.WithRev(rev))
		if err != nil {
			return nil, err
		}
		ended = append(ended, r.Kvs...)
	}
	// The page in token order; an open grant's entry is its marker's key
	// alone until its record is read.
	page := make([]*mvccpb.KeyValue, 0, min(limit, len(ended)+len(open)))
	tokens := make([]int64, 0, cap(page))
	var markers []int // the page's open grants
	for len(page) < limit && len(ended)+len(open) > 0 {
		var token int64
		if len(ended) > 0 {
			if token, err = b.endedToken(ended[0]); err != nil {
				return nil, err
			}
		}
		if len(open) > 0 && (len(ended) == 0 || open[0].CreateRevision < token) {
			markers = append(markers, len(page))
			page, tokens, open = append(page, open[0]), append(tokens, open[0].CreateRevision), open[1:]
		} else {
			page, tokens, ended = append(page, ended[0]), append(tokens, token), ended[1:]
		}
	}
	whole, err := b.readOpen(ctx, page, markers, rev)
	if err != nil {
		return nil, err
	}
	for j, i := range markers {
		if whole[j] == nil || whole[j].CreateRevision != page[i].CreateRevision {
			return nil, problem.New(problem.Internal, "open marker %s vanished at revision %d", page[i].Key, rev)
		}
		page[i] = whole[j]
	}
	out := make([]backend.GrantRecord, len(page))
	for i, kv := range page {
		var gv grantValue
		if err := json.Unmarshal(kv.Value, &gv); err != nil {
			return nil, problem.Wrap(problem.Internal, err, "corrupt grant record %s", kv.Key)
		}
		out[i] = record(fencing.Token(tokens[i]), gv)
	}
	return out, nil
}

// readOpen reads whole, at rev, the open markers page[i] for i in markers
// (read keys only, in token order): one by one when they fit one read
// transaction, else as the range of open markers from the first of them
// (which reads every open marker above it: a page that is mostly open
// grants, the last of a pass, costs one read instead of one per 128).
func (b *Backend) readOpen(ctx context.Context, page []*mvccpb.KeyValue, markers []int, rev int64) ([]*mvccpb.KeyValue, error) {
	if len(markers) <= readBatch {
		keys := make([]string, len(markers))
		for j, i := range markers {
			keys[j] = string(page[i].Key)
		}
		return b.readKeys(ctx, keys, rev)
	}
	r, err := b.cli.Get(ctx, b.openPath(""), clientv3.WithPrefix(), clientv3.WithMinCreateRev(page[markers[0]].CreateRevision),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(int64(len(markers))), clientv3.WithRev(rev))
	if err != nil {
		return nil, err
	}
	out := make([]*mvccpb.KeyValue, len(markers))
	copy(out, r.Kvs)
	return out, nil
}

// readBatch bounds the keys one read transaction reads (etcd's default
// --max-txn-ops; halved while a cluster refuses it).
const readBatch = 128

// readKeys reads keys whole, in transactions of up to readBatch reads; a
// key not there is nil in the answer. At rev > 0 the reads are
// serializable (what a revision holds is the same on every member that has
// it, and a member that has not yet applied it answers ErrFutureRev, when
// they are read again through the leader); at rev 0 they are the latest,
// linearizable.
func (b *Backend) readKeys(ctx context.Context, keys []string, rev int64) ([]*mvccpb.KeyValue, error) {
	out := make([]*mvccpb.KeyValue, 0, len(keys))
	err := inBatches(keys, readBatch, func(batch []string) error {
		read := func(opts ...clientv3.OpOption) (*clientv3.TxnResponse, error) {
			ops := make([]clientv3.Op, len(batch))
			for j, k := range batch {
				ops[j] = clientv3.OpGet(k, append([]clientv3.OpOption{clientv3.WithRev(rev)}, opts...)...)
			}
			return b.cli.Txn(ctx).Then(ops...).Commit()
		}
		var resp *clientv3.TxnResponse
		var err error
		if rev > 0 {
			resp, err = read(clientv3.WithSerializable())
			if errors.Is(err, rpctypes.ErrFutureRev) {
				resp, err = read()
			}
		} else {
			resp, err = read()
		}
		if err != nil {
			return err
		}
		for j := range batch {
			var kv *mvccpb.KeyValue
			if kvs := resp.Responses[j].GetResponseRange().GetKvs(); len(kvs) == 1 {
				kv = kvs[0]
			}
			out = append(out, kv)
		}
		return nil
	})
	return out, err
}

// HighToken implements backend.Backend: 0 before the first grant, then
// the store's revision. Every token issued is a CreateRevision at or below
// it and every future one is above it, as with the token sequence's
// position on PostgreSQL. The highest grant's token alone can be far below:
// after a restore with --bump-revision (D-13) the restored grants are all
// below the guards' fences while the revision is above them, and the
// correctly restored store was reported rewound until its next grant (a
// restore without the bump still is: its revision is below the fences).
// Whether any grant was made is one read of keys at one revision: an open
// marker, or an ended record (compaction always keeps the newest).
func (b *Backend) HighToken(ctx context.Context) (fencing.Token, error) {
	resp, err := b.cli.Txn(ctx).Then(
		clientv3.OpGet(b.openPath(""), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1)),
		clientv3.OpGet(b.endedFrom(), clientv3.WithRange(b.endedEnd()), clientv3.WithKeysOnly(), clientv3.WithLimit(1)),
	).Commit()
	if err != nil {
		return 0, classify("read high token", err)
	}
	for _, r := range resp.Responses {
		if len(r.GetResponseRange().Kvs) > 0 {
			return fencing.Token(resp.Header.Revision), nil
		}
	}
	return 0, nil
}

// expiring is a grant whose lock key vanished without a release or revoke
// transaction seen by this process: possibly ended by its lease's expiry.
type expiring struct {
	key   string
	lv    lockValue
	token int64
	rev   int64 // the revision the watch saw the key deleted at (0: the sweep's)
}

// expiryBatch bounds the grants (or keys) one read or one write
// transaction covers. etcd's limit (128 by default, --max-txn-ops) applies
// to a transaction's compares and to each of its branches' operations, and
// a nested transaction may use only what its parent's branch leaves: 64
// grants, written as 64 nested transactions of two or three operations,
// fit. A cluster with a lower limit refuses a batch as too large, and the
// batch is then split in halves until it fits (inBatches).
const expiryBatch = 64

// inBatches calls fn on xs in batches of at most size, halving the size
// while etcd refuses a batch's transaction as too large, and stops at the
// first other error, which it returns.
func inBatches[T any](xs []T, size int, fn func([]T) error) error {
	for len(xs) > 0 {
		n := min(len(xs), size)
		err := fn(xs[:n])
		if errors.Is(err, rpctypes.ErrTooManyOps) && n > 1 {
			size = n / 2
			continue
		}
		if err != nil {
			return err
		}
		xs = xs[n:]
	}
	return nil
}

// retryCompacted calls read again (three times at most) while it fails
// because etcd compacted past the revision it read at.
func retryCompacted[T any](read func() (T, error)) (T, error) {
	for attempt := 0; ; attempt++ {
		v, err := read()
		if errors.Is(err, rpctypes.ErrCompacted) && attempt < 3 {
			continue
		}
		return v, err
	}
}

// recordDeletions handles the deletions of lock keys in one watch answer:
// each key's waiters are told first, then the grants that the deletions
// ended without a release or revoke are recorded as expired (a release or
// revoke deletes the grant's open marker, so the compare on its
// CreateRevision == token fails and nothing is written twice).
//
// Most deletions are releases, and most releases are this process's own:
// a deletion its own release or revoke transaction made at that revision
// (the transaction's answer says so) is done with, without a call to etcd.
// For the rest — a lease's expiry, another process's release — the grants'
// open markers are read as of each deletion's revision, all of the answer's
// in one read-only transaction (served without a raft round): a release or
// revoke deletes the marker in the same transaction as the lock key, a
// lease's expiry deletes the lock key alone. Only the grants whose marker
// was still there are written, again all in one transaction of one
// conditional transaction per grant. When a lease that held many keys
// expires, etcd deletes them all in one revision and the watch brings them
// in one answer: before, each cost a read and a write transaction in turn,
// and waiters for the keys late in the answer were told only after them.
// When the read cannot answer (a revision compacted, or not yet applied by
// the member that served it), every grant of the batch gets its
// conditional write.
func (b *Backend) recordDeletions(ctx context.Context, evs []*clientv3.Event) {
	var gone []*clientv3.Event
	for _, ev := range evs {
		if ev.Type != mvccpb.DELETE || ev.PrevKv == nil {
			continue
		}
		b.signal(strings.TrimPrefix(string(ev.Kv.Key), b.prefix+"/locks/"))
		gone = append(gone, ev)
	}
	// One wait for this process's ends in flight, whatever the answer
	// holds: a reply that is late (lost, held until its caller's
	// deadline) costs the loop at most endingWait, and its deletion a read.
	deadline := time.Now().Add(endingWait)
	var maybe []expiring
	for _, ev := range gone {
		key, prev := strings.TrimPrefix(string(ev.Kv.Key), b.prefix+"/locks/"), ev.PrevKv
		b.cache.forgetLock(key, prev.CreateRevision)
		if b.cache.endedHere(ctx, prev.CreateRevision, ev.Kv.ModRevision, deadline) {
			continue // this process's release or revoke, which ended the grant
		}
		var lv lockValue
		if json.Unmarshal(prev.Value, &lv) != nil {
			continue
		}
		maybe = append(maybe, expiring{key: key, lv: lv, token: prev.CreateRevision, rev: ev.Kv.ModRevision})
	}
	// A batch that fails is left to the sweep; the next is still tried,
	// unless the step has ended (its deadline, or Run stopping): then the
	// rest are left to the sweep too, without a warning each.
	_ = inBatches(maybe, expiryBatch, func(batch []expiring) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		open, err := b.stillOpen(ctx, batch)
		if errors.Is(err, rpctypes.ErrTooManyOps) {
			return err
		}
		if err := b.expire(ctx, open); errors.Is(err, rpctypes.ErrTooManyOps) {
			return err
		}
		return nil
	})
}

// stillOpen returns the grants of batch whose open marker was still there
// at the revision their key was deleted at, read in one transaction; all
// of them, with the error, when that read cannot answer.
func (b *Backend) stillOpen(ctx context.Context, batch []expiring) ([]expiring, error) {
	ops := make([]clientv3.Op, len(batch))
	for i, x := range batch {
		ops[i] = clientv3.OpGet(b.openPath(x.lv.GrantID), clientv3.WithRev(x.rev), clientv3.WithSerializable(), clientv3.WithCountOnly())
	}
	resp, err := b.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return batch, err
	}
	var open []expiring
	for i, r := range resp.Responses {
		if r.GetResponseRange().GetCount() > 0 {
			open = append(open, batch[i])
		}
	}
	return open, nil
}

// expire records the grants of batch as expired, in one transaction of one
// conditional transaction per grant: a grant whose open marker is gone
// (released, revoked, or recorded already) is left as it is. A failure is
// logged (the sweep retries) and returned.
func (b *Backend) expire(ctx context.Context, batch []expiring) error {
	if len(batch) == 0 {
		return nil
	}
	ended := time.Now().UTC()
	ops := make([]clientv3.Op, len(batch))
	recs := make([]backend.GrantRecord, len(batch))
	for i, x := range batch {
		gv := endedGrant(x.key, heldLock{token: x.token, lv: x.lv}, ended, backend.EndExpired, "lock-service", "")
		op := b.openPath(x.lv.GrantID)
		ops[i] = clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(op), "=", x.token)},
			[]clientv3.Op{clientv3.OpPut(b.grantPath(x.token), mustJSON(gv)), clientv3.OpDelete(op)}, nil)
		recs[i] = record(fencing.Token(x.token), gv)
	}
	resp, err := b.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		if !stopping(ctx) && !(errors.Is(err, rpctypes.ErrTooManyOps) && len(batch) > 1) {
			b.log.Warn("could not record expired grants; the sweep will retry", "grants", len(batch), "first_key", batch[0].key,
				"first_token", batch[0].token, "error", b.failure(ctx, err))
		}
		return err
	}
	var done []backend.GrantRecord
	for i, r := range resp.Responses {
		if r.GetResponseTxn().GetSucceeded() {
			done = append(done, recs[i])
		}
	}
	if len(done) > 0 {
		b.obs().Expired(done)
	}
	return nil
}

// sweep checks every open grant against the lock keys and records as
// expired those whose grant no lock key is (its key gone, or a newer
// grant's): each acquire creates one lock key, so a grant is held exactly
// while a lock key's CreateRevision is its token. The open markers and the
// lock keys are read keys only, in one read-only transaction (one
// revision, no raft round, answered from etcd's in-memory index), so the
// sweep costs two range reads however many grants are open; only the
// markers of grants to record are then read whole, and written.
func (b *Backend) sweep(ctx context.Context) {
	resp, err := b.cli.Txn(ctx).Then(
		clientv3.OpGet(b.openPath(""), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(b.prefix+"/locks/", clientv3.WithPrefix(), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		if !stopping(ctx) {
			b.log.Warn("sweep of open grants failed", "error", b.failure(ctx, err))
		}
		return
	}
	open, locks := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	held := make(map[int64]bool, len(locks)) // the held grants' tokens
	for _, kv := range locks {
		held[kv.CreateRevision] = true
	}
	var gone []string // markers of grants no lock key is
	for _, kv := range open {
		if !held[kv.CreateRevision] {
			gone = append(gone, string(kv.Key))
		}
	}
	whole, err := b.readKeys(ctx, gone, 0)
	if err != nil {
		if !stopping(ctx) {
			b.log.Warn("sweep of open grants failed", "error", b.failure(ctx, err))
		}
		return
	}
	var ended []expiring
	for _, kv := range whole {
		var gv grantValue
		if kv == nil || json.Unmarshal(kv.Value, &gv) != nil {
			continue // ended meanwhile; or not a record: left for the migration of an older layout (migrate.go)
		}
		id := strings.TrimPrefix(string(kv.Key), b.openPath(""))
		ended = append(ended, expiring{key: gv.Key, token: kv.CreateRevision,
			lv: lockValue{Owner: gv.Owner, SessionID: gv.SessionID, GrantID: id, GrantedAt: gv.GrantedAt}})
	}
	if err := inBatches(ended, expiryBatch, func(batch []expiring) error { return b.expire(ctx, batch) }); err != nil {
		return // expire logged it; the next sweep tries again
	}
	if lr, err := b.cli.Leases(ctx); err == nil {
		b.obs().ActiveSessions(len(lr.Leases))
	}
}

// compactPage bounds one read of compaction, and compactOps one delete
// transaction (etcd allows 128 operations per transaction by default; a
// batch a cluster with a lower limit refuses is split, inBatches).
// clockAhead is how far ahead of this process's clock another replica's
// may be before compaction takes a grant's time for a wrong one.
const (
	compactPage = 500
	compactOps  = 100
	clockAhead  = time.Minute
)

// Compact deletes ended grant records older than the retention (always
// keeping the newest ended record, so the high token stays known), and the
// records of sessions that ended (their alive key is gone) before the
// retention. It reports how many of each it deleted, also when it fails
// part way: it deletes each page of records as it reads it, so what it
// deleted stays deleted and a pass cut short (Run bounds each by the step
// timeout) leaves the next less to read. Run calls it every
// CompactInterval; it is exported for tests and tools. etcd's own history
// of the deleted keys goes with etcd's compaction (auto-compaction; see
// docs/lock-service.md).
func (b *Backend) Compact(ctx context.Context) (grants, sessions int, err error) {
	if b.cfg.GrantRetention <= 0 {
		return 0, 0, nil
	}
	cutoff := time.Now().Add(-b.cfg.GrantRetention)
	// The ended records in token order are in grant order: the scan stops
	// at the first granted since the cutoff (none after it can have ended
	// before the cutoff, up to the replicas' clock skew, which only leaves
	// a record for a later pass). What it reads is what it deletes, and
	// the records of grants held across the cutoff. A record granted
	// later than now (a replica's clock ahead) is passed over, not stopped
	// at: stopping there would stop compaction until that time.
	now := time.Now()
	from := b.endedFrom()
	for {
		resp, err := b.cli.Get(ctx, from, clientv3.WithRange(b.endedEnd()), clientv3.WithLimit(compactPage))
		if err != nil {
			return grants, sessions, classify("compact grant log", err)
		}
		var dels []string
		stop := false
		for _, kv := range resp.Kvs {
			var gv grantValue
			if json.Unmarshal(kv.Value, &gv) != nil {
				continue
			}
			if !gv.GrantedAt.Before(cutoff) && !gv.GrantedAt.After(now.Add(clockAhead)) {
				stop = true
				break
			}
			if gv.EndedAt != nil && gv.EndedAt.Before(cutoff) {
				dels = append(dels, string(kv.Key))
			}
		}
		// Without more records after it, the page's last is the newest
		// ended record: it stays. A record is deleted only when a newer
		// one was read (another replica's compaction too), so the newest
		// always stays.
		last := !stop && !resp.More
		if n := len(dels); last && n > 0 && dels[n-1] == string(resp.Kvs[len(resp.Kvs)-1].Key) {
			dels = dels[:n-1]
		}
		n, err := b.deleteKeys(ctx, dels)
		grants += n
		if err != nil {
			return grants, 0, err
		}
		if stop || last || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	// A session's record goes once its end, not its creation, is before
	// the cutoff, as lockdb's do: by its creation, a session opened before
	// the cutoff was deleted at once when it ended, and then read as not
	// found and a second close answered session_expired, not CLOSED. The
	// alive keys and the records are read at one revision: a session
	// created between two reads would look ended.
	resp, err := b.cli.Txn(ctx).Then(
		clientv3.OpGet(b.alivePath(""), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(b.sessionPath(""), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return grants, 0, classify("compact sessions", err)
	}
	alive, recs := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	live := make(map[string]bool, len(alive))
	for _, kv := range alive {
		live[strings.TrimPrefix(string(kv.Key), b.alivePath(""))] = true
	}
	var dels []string
	var undated []endedSession
	for _, kv := range recs {
		id := strings.TrimPrefix(string(kv.Key), b.sessionPath(""))
		var rec sessionValue
		if live[id] || json.Unmarshal(kv.Value, &rec) != nil {
			continue
		}
		switch end := rec.end(); {
		case end.IsZero():
			undated = append(undated, endedSession{kv: kv, rec: rec})
		case end.Before(cutoff):
			dels = append(dels, string(kv.Key))
		}
	}
	if err := inBatches(undated, expiryBatch, func(batch []endedSession) error { return b.dateEnds(ctx, batch, now) }); err != nil {
		return grants, 0, classify("compact sessions", err)
	}
	sessions, err = b.deleteKeys(ctx, dels)
	return grants, sessions, err
}

// endedSession is the record of a session that ended with no end recorded.
type endedSession struct {
	kv  *mvccpb.KeyValue
	rec sessionValue
}

// dateEnds records now as the end of the sessions of batch, in one
// transaction of one conditional transaction per record: a record changed
// since it was read (a close in flight writing its own end) is left as it
// is.
func (b *Backend) dateEnds(ctx context.Context, batch []endedSession, now time.Time) error {
	ops := make([]clientv3.Op, len(batch))
	for i, s := range batch {
		s.rec.EndSeenAt = now.UTC()
		k := string(s.kv.Key)
		ops[i] = clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k), "=", s.kv.ModRevision)},
			[]clientv3.Op{clientv3.OpPut(k, mustJSON(s.rec))}, nil)
	}
	_, err := b.cli.Txn(ctx).Then(ops...).Commit()
	return err
}

// deleteKeys deletes keys in transactions of compactOps (fewer while etcd
// refuses that many, inBatches) and reports how many it deleted: every
// transaction that was committed, also when a later one failed.
func (b *Backend) deleteKeys(ctx context.Context, keys []string) (int, error) {
	n := 0
	err := inBatches(keys, compactOps, func(batch []string) error {
		ops := make([]clientv3.Op, len(batch))
		for i, k := range batch {
			ops[i] = clientv3.OpDelete(k)
		}
		if _, err := b.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			return err
		}
		n += len(batch)
		return nil
	})
	return n, classify("compact", err)
}

func (b *Backend) compactNow(ctx context.Context) {
	g, s, err := b.Compact(ctx)
	switch {
	case err != nil && !stopping(ctx):
		b.log.Warn("grant log compaction failed; will retry", "error", b.failure(ctx, err), "grants", g, "sessions", s)
	case g+s > 0:
		b.log.Info("grant log compacted", "grants", g, "sessions", s, "retention", b.cfg.GrantRetention.String())
	}
}

// nearQuota is the share of its quota past which a member's database is
// logged at every report (etcd refuses every write at the quota).
const nearQuota = 0.8

// reportSize reports the database size and quota of the member nearest its
// quota (each endpoint asked for its status, a second at most). A member
// that does not answer is left out; none answering reports nothing. Run
// calls it beside its loop, so that a member that is down delays neither
// the watch nor the sweep.
func (b *Backend) reportSize(ctx context.Context) {
	var size, quota int64
	var member string
	for _, ep := range b.cli.Endpoints() {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := b.cli.Status(sctx, ep)
		cancel()
		if err != nil || st.DbSizeQuota <= 0 {
			continue
		}
		if member == "" || float64(st.DbSize)/float64(st.DbSizeQuota) > float64(size)/float64(quota) {
			size, quota, member = st.DbSize, st.DbSizeQuota, ep
		}
	}
	if member == "" {
		return
	}
	b.obs().StoreSize(size, quota)
	if float64(size) >= nearQuota*float64(quota) {
		b.log.Warn("etcd's database is near its quota: at the quota etcd refuses every write and no lock is granted",
			"endpoint", member, "db_bytes", size, "quota_bytes", quota)
	}
}
