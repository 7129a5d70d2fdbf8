package etcdbackend

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/fencing"
)

// The grant log (D-9): grants/<id> records, and recording the grants that
// lease expiry ended.

// Grants implements backend.Backend: grant records in CreateRevision (token)
// order.
func (b *Backend) Grants(ctx context.Context, after fencing.Token, limit int) ([]backend.GrantRecord, error) {
	resp, err := b.cli.Get(ctx, b.prefix+"/grants/", clientv3.WithPrefix(), clientv3.WithMinCreateRev(int64(after)+1),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(int64(limit)))
	if err != nil {
		return nil, classify("list grants", err)
	}
	out := make([]backend.GrantRecord, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var gv grantValue
		if err := json.Unmarshal(kv.Value, &gv); err != nil {
			return nil, problem.Wrap(problem.Internal, err, "corrupt grant record %s", kv.Key)
		}
		out = append(out, record(fencing.Token(kv.CreateRevision), gv))
	}
	return out, nil
}

// HighToken implements backend.Backend: the newest grant record's
// CreateRevision.
func (b *Backend) HighToken(ctx context.Context) (fencing.Token, error) {
	resp, err := b.cli.Get(ctx, b.prefix+"/grants/", clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1))
	if err != nil {
		return 0, classify("read high token", err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	return fencing.Token(resp.Kvs[0].CreateRevision), nil
}

// recordExpiry ends the grant of a lock key that vanished, at revision rev,
// without a release or revoke transaction (those rewrite the grant record,
// so the CAS on its ModRevision == token fails and nothing is written
// twice).
//
// Most deletions are releases, and most releases are this process's own:
// a deletion its own release or revoke transaction made at rev (the
// transaction's answer says so) is done with at once, without a call to
// etcd. For any other deletion — a lease's expiry, another process's
// release — the grant's open marker is read as of rev: a release or revoke
// deletes it in the same transaction as the lock key, a lease's expiry
// deletes the lock key alone. That is a read, which etcd answers without a
// raft round, and only a grant whose marker was still there gets the
// conditional write. When the read cannot answer (rev compacted or not yet
// applied where it was served), the write is tried as before.
func (b *Backend) recordExpiry(ctx context.Context, prev *mvccpb.KeyValue, rev int64) {
	var lv lockValue
	if err := json.Unmarshal(prev.Value, &lv); err != nil {
		return
	}
	key := strings.TrimPrefix(string(prev.Key), b.prefix+"/locks/")
	b.cache.forgetLock(key, prev.CreateRevision)
	if b.cache.endedHere(prev.CreateRevision, rev) {
		return // this process's release or revoke, which ended the grant
	}
	if r, err := b.cli.Get(ctx, b.openPath(lv.GrantID), clientv3.WithRev(rev), clientv3.WithSerializable(), clientv3.WithCountOnly()); err == nil && r.Count == 0 {
		return // ended by a release or revoke in that revision (or recorded already)
	}
	b.expireGrant(ctx, key, lv, prev.CreateRevision)
}

func (b *Backend) expireGrant(ctx context.Context, key string, lv lockValue, token int64) {
	ended := time.Now().UTC()
	gv := grantValue{Key: key, Owner: lv.Owner, SessionID: lv.SessionID, GrantedAt: lv.GrantedAt, EndedAt: &ended,
		EndReason: backend.EndExpired, Actor: "lock-service"}
	gp := b.grantPath(lv.GrantID)
	resp, err := b.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(gp), "=", token)).
		Then(clientv3.OpPut(gp, mustJSON(gv)), clientv3.OpDelete(b.openPath(lv.GrantID))).Commit()
	if err != nil {
		if ctx.Err() == nil {
			b.log.Warn("could not record an expired grant; the sweep will retry", "key", key, "token", token, "error", err.Error())
		}
		return
	}
	if resp.Succeeded {
		b.obs().Expired([]backend.GrantRecord{record(fencing.Token(token), gv)})
	}
}

// sweep checks every open grant against its lock key and records as
// expired those whose key is gone or belongs to a newer grant. The open
// markers and the lock keys are read in one read-only transaction (one
// revision, no raft round), so the sweep costs two range reads however many
// grants are open, and a further read and write only for a grant to record.
func (b *Backend) sweep(ctx context.Context) {
	resp, err := b.cli.Txn(ctx).Then(
		clientv3.OpGet(b.prefix+"/open/", clientv3.WithPrefix()),
		clientv3.OpGet(b.prefix+"/locks/", clientv3.WithPrefix(), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		if ctx.Err() == nil {
			b.log.Warn("sweep of open grants failed", "error", err.Error())
		}
		return
	}
	open, locks := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	held := make(map[string]int64, len(locks)) // lock key -> its grant's token
	for _, kv := range locks {
		held[string(kv.Key)] = kv.CreateRevision
	}
	for _, kv := range open {
		gid := strings.TrimPrefix(string(kv.Key), b.prefix+"/open/")
		key := string(kv.Value)
		token := kv.CreateRevision
		if held[b.lockPath(key)] == token {
			continue // still held
		}
		gr, err := b.cli.Get(ctx, b.grantPath(gid))
		if err != nil {
			return
		}
		if len(gr.Kvs) == 0 {
			continue
		}
		var gv grantValue
		if json.Unmarshal(gr.Kvs[0].Value, &gv) != nil {
			continue
		}
		b.expireGrant(ctx, key, lockValue{Owner: gv.Owner, SessionID: gv.SessionID, GrantID: gid, GrantedAt: gv.GrantedAt}, token)
	}
	if lr, err := b.cli.Leases(ctx); err == nil {
		b.obs().ActiveSessions(len(lr.Leases))
	}
}

// compactPage bounds one read of compaction, and compactOps one delete
// transaction (etcd allows 128 operations per transaction by default).
const (
	compactPage = 500
	compactOps  = 100
)

// Compact deletes ended grant records older than the retention (always
// keeping the newest grant record, so the high token stays known), and the
// records of sessions created before the retention that have ended (their
// alive key is gone). It reports how many of each it deleted. Run calls it
// every CompactInterval; it is exported for tests and tools. etcd's own
// history of the deleted keys goes with etcd's compaction (auto-compaction;
// see docs/lock-service.md).
func (b *Backend) Compact(ctx context.Context) (grants, sessions int, err error) {
	if b.cfg.GrantRetention <= 0 {
		return 0, 0, nil
	}
	cutoff := time.Now().Add(-b.cfg.GrantRetention)
	newest, err := b.HighToken(ctx)
	if err != nil {
		return 0, 0, err
	}
	// Grant ids sort by time: everything granted before the cutoff is the
	// key range [grants/, grants/<cutoff>).
	from, end := b.grantPath(""), b.grantPath(fmt.Sprintf("%016x", cutoff.UnixNano()))
	var dels []string
	for {
		resp, err := b.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(compactPage))
		if err != nil {
			return grants, sessions, classify("compact grant log", err)
		}
		for _, kv := range resp.Kvs {
			var gv grantValue
			if json.Unmarshal(kv.Value, &gv) == nil && gv.EndedAt != nil && gv.EndedAt.Before(cutoff) && kv.CreateRevision < int64(newest) {
				dels = append(dels, string(kv.Key))
			}
		}
		if len(resp.Kvs) == 0 || !resp.More {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	if grants, err = b.deleteKeys(ctx, dels); err != nil {
		return grants, 0, err
	}
	alive, err := b.cli.Get(ctx, b.alivePath(""), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return grants, 0, classify("compact sessions", err)
	}
	live := make(map[string]bool, len(alive.Kvs))
	for _, kv := range alive.Kvs {
		live[strings.TrimPrefix(string(kv.Key), b.alivePath(""))] = true
	}
	recs, err := b.cli.Get(ctx, b.sessionPath(""), clientv3.WithPrefix())
	if err != nil {
		return grants, 0, classify("compact sessions", err)
	}
	dels = dels[:0]
	for _, kv := range recs.Kvs {
		id := strings.TrimPrefix(string(kv.Key), b.sessionPath(""))
		var rec sessionValue
		if !live[id] && json.Unmarshal(kv.Value, &rec) == nil && rec.CreatedAt.Before(cutoff) {
			dels = append(dels, string(kv.Key))
		}
	}
	sessions, err = b.deleteKeys(ctx, dels)
	return grants, sessions, err
}

// deleteKeys deletes keys in transactions of compactOps.
func (b *Backend) deleteKeys(ctx context.Context, keys []string) (int, error) {
	n := 0
	for len(keys) > 0 {
		batch := keys[:min(len(keys), compactOps)]
		keys = keys[len(batch):]
		ops := make([]clientv3.Op, 0, len(batch))
		for _, k := range batch {
			ops = append(ops, clientv3.OpDelete(k))
		}
		if _, err := b.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			return n, classify("compact", err)
		}
		n += len(batch)
	}
	return n, nil
}

func (b *Backend) compactNow(ctx context.Context) {
	g, s, err := b.Compact(ctx)
	switch {
	case err != nil && ctx.Err() == nil:
		b.log.Warn("grant log compaction failed; will retry", "error", err.Error())
	case g+s > 0:
		b.log.Info("grant log compacted", "grants", g, "sessions", s, "retention", b.cfg.GrantRetention.String())
	}
}
