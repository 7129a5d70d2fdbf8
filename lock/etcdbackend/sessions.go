package etcdbackend

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
)

// Sessions: one lease each; a record under sessions/ that outlives it (so
// GET /sessions/{id} can say EXPIRED or CLOSED); and alive/<id>, attached
// to the lease and deleted when the session is closed, so that one compare
// in an acquire's transaction proves the session alive and open.

// CreateSession implements backend.Backend. etcd leases are whole seconds:
// the TTL is rounded up and the applied TTL reported.
func (b *Backend) CreateSession(ctx context.Context, owner, principal string, ttl time.Duration) (backend.Session, error) {
	secs := int64((ttl + time.Second - 1) / time.Second)
	lr, err := b.cli.Grant(ctx, secs)
	if err != nil {
		return backend.Session{}, classify("create session", err)
	}
	id := sessionID(lr.ID)
	now := time.Now()
	applied := time.Duration(lr.TTL) * time.Second
	rec := sessionValue{Owner: owner, Principal: principal, TTLMS: applied.Milliseconds(), CreatedAt: now.UTC()}
	if _, err := b.cli.Txn(ctx).Then(clientv3.OpPut(b.sessionPath(id), mustJSON(rec)),
		clientv3.OpPut(b.alivePath(id), "", clientv3.WithLease(lr.ID))).Commit(); err != nil {
		// The lease goes now rather than at its TTL, whether or not the
		// caller still waits; bounded, as etcd may not answer at all.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.stepTimeout)
		_, _ = b.cli.Revoke(rctx, lr.ID)
		cancel()
		return backend.Session{}, classify("create session", err)
	}
	b.cache.putSession(id, sessInfo{owner: owner, principal: principal, createdAt: rec.CreatedAt, ttl: applied, renewed: now})
	return backend.Session{ID: id, Owner: owner, Principal: principal, TTL: applied, State: backend.StateActive, CreatedAt: now,
		LastHeartbeatAt: now, ExpiresAt: now.Add(applied)}, nil
}

func (b *Backend) readSession(ctx context.Context, id string) (sessionValue, bool, error) {
	var rec sessionValue
	resp, err := b.cli.Get(ctx, b.sessionPath(id))
	if err != nil {
		return rec, false, classify("read session", err)
	}
	if len(resp.Kvs) == 0 {
		return rec, false, nil
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		return rec, false, problem.Wrap(problem.Internal, err, "session %s: corrupt record", id)
	}
	return rec, true, nil
}

// knownSession is what this process knows of session id, reading its
// record once when it knows nothing (found false: no such session, or
// closed). The renewal time of a session first seen here is unknown; it is
// taken as its creation, which only makes server_expiry earlier.
func (b *Backend) knownSession(ctx context.Context, id string) (sessInfo, bool, error) {
	if s, ok := b.cache.session(id); ok {
		return s, true, nil
	}
	rec, found, err := b.readSession(ctx, id)
	if err != nil || !found || rec.Closed {
		return sessInfo{}, false, err
	}
	s := sessInfo{owner: rec.Owner, principal: rec.Principal, createdAt: rec.CreatedAt, ttl: time.Duration(rec.TTLMS) * time.Millisecond, renewed: rec.CreatedAt}
	b.cache.putSession(id, s)
	return s, true, nil
}

// KeepAlive implements backend.Backend: KeepAliveOnce, which etcd refuses
// for an expired or revoked lease, so renewal never revives a session.
func (b *Backend) KeepAlive(ctx context.Context, id string) (backend.Session, error) {
	lease, ok := parseSessionID(id)
	if !ok {
		return backend.Session{}, backend.ErrSessionGone(id)
	}
	s, found, err := b.knownSession(ctx, id)
	if err != nil {
		return backend.Session{}, err
	}
	if !found {
		return backend.Session{}, backend.ErrSessionGone(id)
	}
	sent := time.Now()
	resp, err := b.cli.KeepAliveOnce(ctx, lease)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		b.cache.forgetSession(id)
		return backend.Session{}, backend.ErrSessionGone(id)
	}
	if err != nil {
		return backend.Session{}, classify("keepalive", err)
	}
	ttl := time.Duration(resp.TTL) * time.Second
	b.cache.renewed(id, sent, ttl)
	return backend.Session{ID: id, Owner: s.owner, Principal: s.principal, TTL: ttl, State: backend.StateActive, CreatedAt: s.createdAt,
		LastHeartbeatAt: sent, ExpiresAt: sent.Add(ttl)}, nil
}

// Session implements backend.Backend. etcd does not record heartbeats: the
// last one is what this process saw of the lease's renewal when that agrees
// with the lease's remaining TTL (a keepalive through this process: known
// to the millisecond), else inferred from that TTL.
func (b *Backend) Session(ctx context.Context, id string) (backend.Session, error) {
	lease, ok := parseSessionID(id)
	if !ok {
		return backend.Session{}, problem.New(problem.NotFound, "session %s does not exist", id)
	}
	rec, found, err := b.readSession(ctx, id)
	if err != nil {
		return backend.Session{}, err
	}
	if !found {
		return backend.Session{}, problem.New(problem.NotFound, "session %s does not exist", id)
	}
	s := backend.Session{ID: id, Owner: rec.Owner, Principal: rec.Principal, TTL: time.Duration(rec.TTLMS) * time.Millisecond, CreatedAt: rec.CreatedAt}
	if rec.Closed {
		s.State = backend.StateClosed
		s.LastHeartbeatAt, s.ExpiresAt = rec.LastHeartbeatAt, rec.ClosedAt
		return s, nil
	}
	ttl, err := b.cli.TimeToLive(ctx, lease)
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return s, classify("read session", err)
	}
	if err != nil || ttl.TTL < 0 { // -1: expired or revoked
		s.State = backend.StateExpired
		return s, nil
	}
	now := time.Now()
	granted, remaining := time.Duration(ttl.GrantedTTL)*time.Second, time.Duration(ttl.TTL)*time.Second
	s.TTL = granted
	known, _ := b.cache.session(id)
	s.LastHeartbeatAt = heartbeat(now.Add(remaining-granted), s.CreatedAt, now, known.renewed)
	s.ExpiresAt = s.LastHeartbeatAt.Add(granted)
	s.State = backend.SessionState(s.LastHeartbeatAt, now, granted)
	return s, nil
}

// CloseSession implements backend.Backend: end the session's alive key (no
// acquire succeeds after that), release every lock of the session (grants
// end as released), mark the record closed, revoke the lease. A close that
// fails after the alive key is gone revokes the lease before it answers
// the failure: the session ends (its keys go with the lease, recorded as
// expired by the watch) instead of staying half closed, renewable but
// unable to acquire, its keys held for as long as something renews it.
func (b *Backend) CloseSession(ctx context.Context, id string) (s backend.Session, err error) {
	lease, ok := parseSessionID(id)
	if !ok {
		return backend.Session{}, backend.ErrSessionGone(id)
	}
	s, err = b.Session(ctx, id)
	if problem.Has(err, problem.NotFound) {
		return s, backend.ErrSessionGone(id)
	}
	if err != nil {
		return s, err
	}
	switch s.State {
	case backend.StateClosed:
		return s, nil
	case backend.StateExpired:
		b.cache.forgetSession(id)
		return s, backend.ErrSessionGone(id)
	}
	b.cache.forgetSession(id)
	if _, err := b.cli.Delete(ctx, b.alivePath(id)); err != nil {
		return s, classify("close session", err)
	}
	defer func() {
		if err != nil {
			b.revokeAfterFailedClose(ctx, id, lease, err)
		}
	}()
	resp, err := b.cli.Get(ctx, b.prefix+"/locks/", clientv3.WithPrefix())
	if err != nil {
		return s, classify("close session", err)
	}
	var held []*mvccpb.KeyValue
	for _, kv := range resp.Kvs {
		if clientv3.LeaseID(kv.Lease) == lease {
			held = append(held, kv)
		}
	}
	// Ended in batches, as the watch records expiries: a session closed
	// while holding 1,000 keys costs 16 transactions, not 1,000 in turn.
	if err := inBatches(held, expiryBatch, func(batch []*mvccpb.KeyValue) error {
		return b.endBatch(ctx, batch, lease, backend.EndReleased, "session closed", "")
	}); err != nil {
		return s, classify("close session", err)
	}
	if now := time.Now(); now.Before(s.ExpiresAt) {
		s.ExpiresAt = now
	}
	rec := sessionValue{Owner: s.Owner, Principal: s.Principal, TTLMS: s.TTL.Milliseconds(), CreatedAt: s.CreatedAt, Closed: true,
		LastHeartbeatAt: s.LastHeartbeatAt, ClosedAt: s.ExpiresAt}
	if _, err := b.cli.Put(ctx, b.sessionPath(id), mustJSON(rec)); err != nil {
		return s, classify("close session", err)
	}
	if _, err := b.cli.Revoke(ctx, lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return s, classify("close session", err)
	}
	s.State = backend.StateClosed
	return s, nil
}

// revokeAfterFailedClose ends the lease of session id, whose close failed
// (cause) after its alive key was deleted. It has a deadline of its own: the
// close's may be what ended it.
func (b *Backend) revokeAfterFailedClose(ctx context.Context, id string, lease clientv3.LeaseID, cause error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), failedCloseRevokeTimeout)
	defer cancel()
	_, err := b.cli.Revoke(rctx, lease)
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		b.log.Error("a session's close failed after its alive key was deleted, and revoking its lease failed too: "+
			"it holds its keys until its lease lapses or its close is retried", "session_id", id, "close_error", cause, "err", err)
		return
	}
	b.log.Warn("a session's close failed after its alive key was deleted: its lease was revoked, its keys end as expired",
		"session_id", id, "close_error", cause)
}

// failedCloseRevokeTimeout bounds revokeAfterFailedClose.
const failedCloseRevokeTimeout = 5 * time.Second

// heartbeat is a session's last renewal as best known. etcd answers the
// remaining TTL in whole seconds, rounded down, so the renewal it implies
// (inferred) is up to a second before the real one; a renewal this process
// saw itself (seen, zero if none) is the real one when it falls in that
// second (or just before it: seen is when the keepalive was sent), and
// otherwise the lease was renewed elsewhere since. Never before the
// session's creation, never after now.
func heartbeat(inferred, created, now, seen time.Time) time.Time {
	hb := inferred
	if !seen.IsZero() && !seen.Before(inferred.Add(-time.Second)) && !seen.After(now) {
		hb = seen
	}
	if hb.Before(created) {
		hb = created
	}
	if hb.After(now) {
		hb = now
	}
	return hb
}
