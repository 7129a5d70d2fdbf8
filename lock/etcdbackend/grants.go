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

// Grants: acquire, release, revoke and introspection of held keys.

// Acquire implements backend.Backend: one transaction,
// If(CreateRevision(key)==0) Then(Put(key, lease), Put(grant record)) Else(Get(key)).
func (b *Backend) Acquire(ctx context.Context, key, sid string) (backend.Grant, error) {
	lease, ok := parseSessionID(sid)
	if !ok {
		return backend.Grant{}, backend.ErrSessionGone(sid)
	}
	rec, found, err := b.readSession(ctx, sid)
	if err != nil {
		return backend.Grant{}, err
	}
	if !found || rec.Closed {
		return backend.Grant{}, backend.ErrSessionGone(sid)
	}
	lp := b.lockPath(key)
	gid := newID()
	now := time.Now().UTC()
	lv := lockValue{Owner: rec.Owner, SessionID: sid, GrantID: gid, GrantedAt: now}
	gv := grantValue{Key: key, Owner: rec.Owner, SessionID: sid, GrantedAt: now}
	resp, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(lp), "=", 0)).
		Then(clientv3.OpPut(lp, mustJSON(lv), clientv3.WithLease(lease)),
			clientv3.OpPut(b.grantPath(gid), mustJSON(gv)),
			clientv3.OpPut(b.openPath(gid), key)).
		Else(clientv3.OpGet(lp)).
		Commit()
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return backend.Grant{}, backend.ErrSessionGone(sid)
	}
	if err != nil {
		return backend.Grant{}, classify("acquire", err)
	}
	g := backend.Grant{Key: key, Owner: rec.Owner, SessionID: sid}
	if resp.Succeeded {
		g.Token = fencing.Token(resp.Header.Revision)
	} else {
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
			holder.ServerExpiry = b.leaseExpiry(ctx, clientv3.LeaseID(kv.Lease))
			return backend.Grant{}, backend.ErrHeld(key, holder)
		}
		g.Token, g.Existing = fencing.Token(kv.CreateRevision), true // idempotent re-acquire
	}
	g.ServerExpiry = b.leaseExpiry(ctx, lease)
	return g, nil
}

// leaseExpiry is informational: now + the lease's remaining TTL.
func (b *Backend) leaseExpiry(ctx context.Context, lease clientv3.LeaseID) time.Time {
	ttl, err := b.cli.TimeToLive(ctx, lease)
	if err != nil || ttl.TTL <= 0 {
		return time.Now()
	}
	return time.Now().Add(time.Duration(ttl.TTL) * time.Second)
}

// end deletes the lock kv and ends its grant, in one transaction
// conditioned on the key still being that grant (and, for a release, on
// the holder's lease).
func (b *Backend) end(ctx context.Context, kv *mvccpb.KeyValue, lease clientv3.LeaseID, reason, actor, why string) (backend.GrantRecord, error) {
	var lv lockValue
	if err := json.Unmarshal(kv.Value, &lv); err != nil {
		return backend.GrantRecord{}, problem.Wrap(problem.Internal, err, "corrupt lock record %s", kv.Key)
	}
	key := strings.TrimPrefix(string(kv.Key), b.prefix+"/locks/")
	ended := time.Now().UTC()
	gv := grantValue{Key: key, Owner: lv.Owner, SessionID: lv.SessionID, GrantedAt: lv.GrantedAt, EndedAt: &ended, EndReason: reason, Actor: actor, Reason: why}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", kv.CreateRevision)}
	if lease != 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.LeaseValue(string(kv.Key)), "=", lease))
	}
	resp, err := b.cli.Txn(ctx).If(cmps...).
		Then(clientv3.OpDelete(string(kv.Key)), clientv3.OpPut(b.grantPath(lv.GrantID), mustJSON(gv)), clientv3.OpDelete(b.openPath(lv.GrantID))).
		Commit()
	if err != nil {
		return backend.GrantRecord{}, classify("end grant", err)
	}
	if !resp.Succeeded {
		return backend.GrantRecord{}, backend.ErrNotHeld(key, lv.SessionID, fencing.Token(kv.CreateRevision))
	}
	b.signal(key)
	return record(fencing.Token(kv.CreateRevision), gv), nil
}

func record(token fencing.Token, gv grantValue) backend.GrantRecord {
	return backend.GrantRecord{Token: token, Key: gv.Key, Owner: gv.Owner, SessionID: gv.SessionID, GrantedAt: gv.GrantedAt,
		EndedAt: gv.EndedAt, EndReason: gv.EndReason, Actor: gv.Actor, Reason: gv.Reason}
}

// Release implements backend.Backend: a transaction conditioned on the key's
// CreateRevision (the token) and the session's lease.
func (b *Backend) Release(ctx context.Context, key, sid string, token fencing.Token) (backend.GrantRecord, error) {
	lease, ok := parseSessionID(sid)
	if !ok {
		return backend.GrantRecord{}, backend.ErrNotHeld(key, sid, token)
	}
	resp, err := b.cli.Get(ctx, b.lockPath(key))
	if err != nil {
		return backend.GrantRecord{}, classify("release", err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != int64(token) || clientv3.LeaseID(resp.Kvs[0].Lease) != lease {
		return backend.GrantRecord{}, backend.ErrNotHeld(key, sid, token)
	}
	var lv lockValue
	_ = json.Unmarshal(resp.Kvs[0].Value, &lv)
	rec, err := b.end(ctx, resp.Kvs[0], lease, backend.EndReleased, lv.Owner, "")
	if problem.Has(err, problem.NotHeld) {
		return rec, backend.ErrNotHeld(key, sid, token)
	}
	return rec, err
}

// Revoke implements backend.Backend.
func (b *Backend) Revoke(ctx context.Context, key, actor, reason string) (backend.GrantRecord, error) {
	for {
		resp, err := b.cli.Get(ctx, b.lockPath(key))
		if err != nil {
			return backend.GrantRecord{}, classify("revoke", err)
		}
		if len(resp.Kvs) == 0 {
			return backend.GrantRecord{}, backend.ErrFree(key)
		}
		rec, err := b.end(ctx, resp.Kvs[0], 0, backend.EndRevoked, actor, reason)
		if problem.Has(err, problem.NotHeld) && ctx.Err() == nil {
			continue // the grant changed under us: look again
		}
		return rec, err
	}
}

func (b *Backend) toLock(ctx context.Context, kv *mvccpb.KeyValue, expiries map[int64]time.Time) backend.Lock {
	var lv lockValue
	_ = json.Unmarshal(kv.Value, &lv)
	exp, ok := expiries[kv.Lease]
	if !ok {
		exp = b.leaseExpiry(ctx, clientv3.LeaseID(kv.Lease))
		expiries[kv.Lease] = exp
	}
	return backend.Lock{Key: strings.TrimPrefix(string(kv.Key), b.prefix+"/locks/"), Held: true, Owner: lv.Owner, SessionID: lv.SessionID,
		Token: fencing.Token(kv.CreateRevision), AcquiredAt: lv.GrantedAt, ServerExpiry: exp}
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
	return b.toLock(ctx, resp.Kvs[0], map[int64]time.Time{}), nil
}

// Locks implements backend.Backend.
func (b *Backend) Locks(ctx context.Context, prefix string, limit int) ([]backend.Lock, error) {
	resp, err := b.cli.Get(ctx, b.lockPath(prefix), clientv3.WithPrefix(), clientv3.WithLimit(int64(limit)),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, classify("list locks", err)
	}
	exp := map[int64]time.Time{}
	out := make([]backend.Lock, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, b.toLock(ctx, kv, exp))
	}
	return out, nil
}

// Changed implements backend.Backend: signalled from the watch.
func (b *Backend) Changed(key string) (<-chan struct{}, func()) { return b.waiters.Changed(key) }

func (b *Backend) signal(key string) { b.waiters.Signal(key) }
