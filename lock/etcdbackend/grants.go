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

	"github.com/payouts/payouts/internal/batcher"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/fencing"
)

// Grants: acquire, release, revoke and introspection of held keys.

// Acquire implements backend.Backend: one transaction,
//
//	If(CreateRevision(locks/<key>) == 0, CreateRevision(alive/<session>) > 0)
//	Then(Put(locks/<key>, lease), Put(open/<id>, record))
//	Else(Get(locks/<key>), Get(alive/<session>))
//
// whose second compare proves the session alive (its alive key is attached
// to its lease) and open (closing deletes it). One acquire creates one lock
// key, so a revision is the CreateRevision of at most one: the token
// (INV-04), and what the sweep relies on to tell a held grant (some lock
// key's CreateRevision is its token) from an ended one. Several keys must
// never be acquired in one transaction. The owner comes from what
// the service knows of the session, and the expiry from its TTL and last
// renewal here: no other call to etcd.
func (b *Backend) Acquire(ctx context.Context, key, sid string) (backend.Grant, error) {
	lease, ok := parseSessionID(sid)
	if !ok {
		return backend.Grant{}, backend.ErrSessionGone(sid)
	}
	s, found, err := b.knownSession(ctx, sid)
	if err != nil {
		return backend.Grant{}, err
	}
	if !found {
		return backend.Grant{}, backend.ErrSessionGone(sid)
	}
	lp, ap := b.lockPath(key), b.alivePath(sid)
	gid := newID()
	now := time.Now().UTC()
	lv := lockValue{Owner: s.owner, SessionID: sid, GrantID: gid, GrantedAt: now}
	gv := grantValue{Key: key, Owner: s.owner, SessionID: sid, GrantedAt: now}
	resp, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(lp), "=", 0), clientv3.Compare(clientv3.CreateRevision(ap), ">", 0)).
		Then(clientv3.OpPut(lp, mustJSON(lv), clientv3.WithLease(lease)),
			clientv3.OpPut(b.openPath(gid), mustJSON(gv))).
		Else(clientv3.OpGet(lp), clientv3.OpGet(ap, clientv3.WithCountOnly())).
		Commit()
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		b.cache.forgetSession(sid)
		return backend.Grant{}, backend.ErrSessionGone(sid)
	}
	if err != nil {
		return backend.Grant{}, classify("acquire", err)
	}
	g := backend.Grant{Key: key, Owner: s.owner, SessionID: sid, ServerExpiry: s.renewed.Add(s.ttl)}
	if resp.Succeeded {
		g.Token = fencing.Token(resp.Header.Revision)
		b.cache.putLock(key, heldLock{token: resp.Header.Revision, lease: lease, lv: lv})
		return g, nil
	}
	if resp.Responses[1].GetResponseRange().Count == 0 {
		b.cache.forgetSession(sid)
		return backend.Grant{}, backend.ErrSessionGone(sid)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		// Freed between the compare and the get: impossible in one
		// transaction, but answer safely.
		return backend.Grant{}, backend.ErrHeld(key, backend.Lock{})
	}
	kv := kvs[0]
	var cur lockValue
	_ = json.Unmarshal(kv.Value, &cur)
	if clientv3.LeaseID(kv.Lease) != lease {
		holder := backend.Lock{Key: key, Held: true, Owner: cur.Owner, SessionID: cur.SessionID, Token: fencing.Token(kv.CreateRevision)}
		if hs, ok := b.cache.session(cur.SessionID); ok {
			holder.ServerExpiry = hs.renewed.Add(hs.ttl)
		}
		return backend.Grant{}, backend.ErrHeld(key, holder)
	}
	g.Token, g.Existing = fencing.Token(kv.CreateRevision), true // idempotent re-acquire
	b.cache.putLock(key, heldLock{token: kv.CreateRevision, lease: lease, lv: cur})
	return g, nil
}

// end deletes a lock key and ends its grant, in one transaction conditioned
// on the key still being that grant (token) and, when lease is not 0, the
// holder's lease. not_held when it is not. Ends in flight at the same
// moment go to etcd together (endMany).
func (b *Backend) end(ctx context.Context, key string, h heldLock, lease clientv3.LeaseID, reason, actor, why string) (backend.GrantRecord, error) {
	r, err := b.ends.Do(ctx, endReq{key: key, h: h, lease: lease, gv: endedGrant(key, h, time.Now().UTC(), reason, actor, why)})
	if err == nil {
		err = r.err
	}
	if err != nil {
		return backend.GrantRecord{}, classify("end grant", err)
	}
	if !r.ended {
		return backend.GrantRecord{}, backend.ErrNotHeld(key, h.lv.SessionID, fencing.Token(h.token))
	}
	return record(fencing.Token(h.token), r.gv), nil
}

// endReq is one grant to end: h, the grant of key, conditioned on lease
// when it is not 0, ended as gv.
type endReq struct {
	key   string
	h     heldLock
	lease clientv3.LeaseID
	gv    grantValue
}

type endRes struct {
	gv    grantValue
	ended bool  // false: the key was no longer that grant (or not the lease's)
	err   error // of its round's transaction
}

// endMany ends a batch of grants in rounds of distinct keys
// (batcher.InRounds), each round one transaction of one conditional
// transaction per key (endTxns), split in halves while etcd refuses it as
// too large (inBatches: a transaction of n ends needs --max-txn-ops of at
// least n + 3). A transaction that fails gives its error to its own
// requests and to the rest of its round, which are not sent; the ends
// before it have taken effect and keep their answers. Later rounds still
// run: each end is conditioned on its own grant's token.
func (b *Backend) endMany(ctx context.Context, reqs []endReq) ([]endRes, error) {
	return batcher.InRounds(reqs, func(r endReq) string { return r.key }, func(err error) endRes { return endRes{err: err} },
		func(round []endReq) ([]endRes, error) {
			out := make([]endRes, 0, len(round))
			err := inBatches(round, len(round), func(part []endReq) error {
				res, err := b.endTxns(ctx, part)
				out = append(out, res...)
				return err
			})
			for len(out) < len(round) {
				out = append(out, endRes{err: err})
			}
			return out, nil
		}), nil
}

// endTxns ends grants of distinct keys in one transaction made of one
// conditional transaction per key (endTxn): a key whose grant changed
// since it was read is left as it is, and the others are ended. Each end
// is registered for the watch (beginEnd), so that it need not ask etcd
// about a deletion made here.
func (b *Backend) endTxns(ctx context.Context, reqs []endReq) ([]endRes, error) {
	ops := make([]clientv3.Op, len(reqs))
	answered := make([]func(rev int64), len(reqs))
	for i, r := range reqs {
		cmps, then := b.endTxn(r.key, r.h, r.lease, r.gv)
		ops[i] = clientv3.OpTxn(cmps, then, nil)
		answered[i] = b.cache.beginEnd(r.h.token)
	}
	resp, err := b.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		for _, a := range answered {
			a(0) // no deletion known: the watch reads as for any other
		}
		return nil, err
	}
	out := make([]endRes, len(reqs))
	for i, r := range reqs {
		b.cache.forgetLock(r.key, r.h.token)
		if resp.Responses[i].GetResponseTxn().GetSucceeded() {
			answered[i](resp.Header.Revision)
			b.signal(r.key)
			out[i] = endRes{gv: r.gv, ended: true}
		} else {
			answered[i](0)
		}
	}
	return out, nil
}

// endedGrant is h's grant record as ended at ended.
func endedGrant(key string, h heldLock, ended time.Time, reason, actor, why string) grantValue {
	return grantValue{Key: key, Owner: h.lv.Owner, SessionID: h.lv.SessionID, GrantedAt: h.lv.GrantedAt, EndedAt: &ended,
		EndReason: reason, Actor: actor, Reason: why}
}

// endTxn is the transaction that ends h, the grant of key: conditioned on
// the key still being that grant (token) and, when lease is not 0, the
// holder's lease; it deletes the key and the grant's open marker and
// writes gv, the ended record, at grants/<token>.
func (b *Backend) endTxn(key string, h heldLock, lease clientv3.LeaseID, gv grantValue) ([]clientv3.Cmp, []clientv3.Op) {
	lp := b.lockPath(key)
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(lp), "=", h.token)}
	if lease != 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.LeaseValue(lp), "=", lease))
	}
	return cmps, []clientv3.Op{clientv3.OpDelete(lp), clientv3.OpPut(b.grantPath(h.token), mustJSON(gv)), clientv3.OpDelete(b.openPath(h.lv.GrantID))}
}

// endBatch is end for several lock keys of the session with lease, as
// read from etcd, in one transaction of one conditional transaction per
// key (endTxns): a key whose grant changed since it was read (ended
// meanwhile) is left as it is. A key whose record cannot be read is left
// to its lease and reported after the others are ended.
func (b *Backend) endBatch(ctx context.Context, kvs []*mvccpb.KeyValue, lease clientv3.LeaseID, reason, actor, why string) error {
	ended := time.Now().UTC()
	reqs := make([]endReq, 0, len(kvs))
	var corrupt error
	for _, kv := range kvs {
		h, err := heldFromKV(kv)
		if err != nil {
			corrupt = err
			continue
		}
		key := strings.TrimPrefix(string(kv.Key), b.prefix+"/locks/")
		reqs = append(reqs, endReq{key: key, h: h, lease: lease, gv: endedGrant(key, h, ended, reason, actor, why)})
	}
	if len(reqs) == 0 {
		return corrupt
	}
	if _, err := b.endTxns(ctx, reqs); err != nil {
		return err
	}
	return corrupt
}

func heldFromKV(kv *mvccpb.KeyValue) (heldLock, error) {
	h := heldLock{token: kv.CreateRevision, lease: clientv3.LeaseID(kv.Lease)}
	if err := json.Unmarshal(kv.Value, &h.lv); err != nil {
		return h, problem.Wrap(problem.Internal, err, "corrupt lock record %s", kv.Key)
	}
	return h, nil
}

func record(token fencing.Token, gv grantValue) backend.GrantRecord {
	return backend.GrantRecord{Token: token, Key: gv.Key, Owner: gv.Owner, SessionID: gv.SessionID, GrantedAt: gv.GrantedAt,
		EndedAt: gv.EndedAt, EndReason: gv.EndReason, Actor: gv.Actor, Reason: gv.Reason}
}

// current is the key's grant: from what this process knows when that is
// the grant named by token (0: any), else read from etcd (found false: the
// key is free).
func (b *Backend) current(ctx context.Context, key string, token int64) (h heldLock, found bool, err error) {
	if h, ok := b.cache.lock(key); ok && (token == 0 || h.token == token) {
		return h, true, nil
	}
	resp, err := b.cli.Get(ctx, b.lockPath(key))
	if err != nil || len(resp.Kvs) == 0 {
		return h, false, err
	}
	h, err = heldFromKV(resp.Kvs[0])
	return h, err == nil, err
}

// Release implements backend.Backend: one conditional transaction on the
// key's CreateRevision (the token) and the session's lease (end: in the
// transaction of the other ends in flight), written from what the service
// knows of the grant (read first only when it knows nothing).
func (b *Backend) Release(ctx context.Context, key, sid string, token fencing.Token) (backend.GrantRecord, error) {
	lease, ok := parseSessionID(sid)
	if !ok {
		return backend.GrantRecord{}, backend.ErrNotHeld(key, sid, token)
	}
	h, found, err := b.current(ctx, key, int64(token))
	if err != nil {
		return backend.GrantRecord{}, classify("release", err)
	}
	if !found || h.token != int64(token) || h.lease != lease {
		return backend.GrantRecord{}, backend.ErrNotHeld(key, sid, token)
	}
	rec, err := b.end(ctx, key, h, lease, backend.EndReleased, h.lv.Owner, "")
	if problem.Has(err, problem.NotHeld) {
		return rec, backend.ErrNotHeld(key, sid, token)
	}
	if err == nil {
		rec.Waited = b.waiting.has(key)
	}
	return rec, err
}

// Revoke implements backend.Backend: one conditional transaction on the
// key's current grant (end: in the transaction of the other ends in
// flight); read again only when that grant changed under us.
func (b *Backend) Revoke(ctx context.Context, key, actor, reason string) (backend.GrantRecord, error) {
	for {
		h, found, err := b.current(ctx, key, 0)
		if err != nil {
			return backend.GrantRecord{}, classify("revoke", err)
		}
		if !found {
			return backend.GrantRecord{}, backend.ErrFree(key)
		}
		rec, err := b.end(ctx, key, h, 0, backend.EndRevoked, actor, reason)
		if problem.Has(err, problem.NotHeld) && ctx.Err() == nil {
			continue // the grant changed under us (or what we knew was stale): look again
		}
		if err == nil {
			rec.Waited = b.waiting.has(key)
		}
		return rec, err
	}
}

func (b *Backend) toLock(kv *mvccpb.KeyValue) backend.Lock {
	var lv lockValue
	_ = json.Unmarshal(kv.Value, &lv)
	l := backend.Lock{Key: strings.TrimPrefix(string(kv.Key), b.prefix+"/locks/"), Held: true, Owner: lv.Owner, SessionID: lv.SessionID,
		Token: fencing.Token(kv.CreateRevision), AcquiredAt: lv.GrantedAt}
	if s, ok := b.cache.session(lv.SessionID); ok {
		l.ServerExpiry = s.renewed.Add(s.ttl)
	}
	return l
}

// Lock implements backend.Backend.
func (b *Backend) Lock(ctx context.Context, key string) (backend.Lock, error) {
	resp, err := b.cli.Get(ctx, b.lockPath(key))
	if err != nil {
		return backend.Lock{}, classify("read lock", err)
	}
	if len(resp.Kvs) == 0 {
		return backend.Lock{Key: key}, nil
	}
	return b.toLock(resp.Kvs[0]), nil
}

// Locks implements backend.Backend.
func (b *Backend) Locks(ctx context.Context, prefix string, limit int) ([]backend.Lock, error) {
	resp, err := b.cli.Get(ctx, b.lockPath(prefix), clientv3.WithPrefix(), clientv3.WithLimit(int64(limit)),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, classify("list locks", err)
	}
	out := make([]backend.Lock, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, b.toLock(kv))
	}
	return out, nil
}

// Changed implements backend.Backend: signalled from the watch.
func (b *Backend) Changed(key string) (<-chan struct{}, func()) { return b.waiters.Changed(key) }

func (b *Backend) signal(key string) { b.waiters.Signal(key) }
