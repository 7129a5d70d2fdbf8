// Package etcdbackend is the lock service's etcd backend.
//
// A session is an etcd lease the service holds for its caller (session id
// = lease id, keepalive = KeepAliveOnce); a held lock is the key
// <prefix>/locks/<key> attached to that lease; the fencing token is that
// key's CreateRevision, which etcd makes cluster-wide monotonic (INV-04).
// Every grant writes <prefix>/grants/<id> in the acquiring transaction, so
// the grant record's CreateRevision is the token too (D-9). Expiry is etcd's
// decision; grants ended by it are recorded by watching the lock prefix.
package etcdbackend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/fencing"
)

// DefaultPrefix is where the lock service keeps its keys.
const DefaultPrefix = "/payouts/lock"

// Config configures the backend.
type Config struct {
	// Client is an etcd client; Endpoints is used when it is nil.
	Client    *clientv3.Client
	Endpoints []string
	Prefix    string
	Logger    *slog.Logger
	// SweepInterval is how often open grants are checked against their
	// keys, to record expiries the watch missed (default 5s).
	SweepInterval time.Duration
}

// Backend implements backend.Backend on etcd.
type Backend struct {
	cli     *clientv3.Client
	ownCli  bool
	prefix  string
	log     *slog.Logger
	sweepIv time.Duration

	watchCancel context.CancelFunc
	watchCh     clientv3.WatchChan

	mu       sync.Mutex
	observer backend.Observer
	waiters  backend.Waiters
}

var _ backend.Backend = (*Backend)(nil)

// Open connects (or uses cfg.Client) and starts watching the lock prefix.
func Open(ctx context.Context, cfg Config) (*Backend, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = 5 * time.Second
	}
	b := &Backend{cli: cfg.Client, prefix: strings.TrimRight(cfg.Prefix, "/"), log: cfg.Logger, sweepIv: cfg.SweepInterval,
		observer: backend.NopObserver{}}
	if b.cli == nil {
		if len(cfg.Endpoints) == 0 {
			return nil, errors.New("etcdbackend: no etcd endpoints")
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, fmt.Errorf("etcdbackend: connect: %w", err)
		}
		b.cli, b.ownCli = cli, true
	}
	if err := b.Ping(ctx); err != nil {
		b.Close()
		return nil, fmt.Errorf("etcdbackend: %w", err)
	}
	if err := b.startWatch(ctx); err != nil {
		b.Close()
		return nil, fmt.Errorf("etcdbackend: watch: %w", err)
	}
	return b, nil
}

func (b *Backend) lockPath(key string) string   { return b.prefix + "/locks/" + key }
func (b *Backend) grantPath(id string) string   { return b.prefix + "/grants/" + id }
func (b *Backend) openPath(id string) string    { return b.prefix + "/open/" + id }
func (b *Backend) sessionPath(id string) string { return b.prefix + "/sessions/" + id }

// lockValue is the value of a lock key: enough to write the grant's end
// without reading it first.
type lockValue struct {
	Owner     string    `json:"owner"`
	SessionID string    `json:"session_id"`
	GrantID   string    `json:"grant_id"`
	GrantedAt time.Time `json:"granted_at"`
}

// grantValue is a grant record; its token is the key's CreateRevision.
type grantValue struct {
	Key       string     `json:"key"`
	Owner     string     `json:"owner"`
	SessionID string     `json:"session_id"`
	GrantedAt time.Time  `json:"granted_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	EndReason string     `json:"end_reason,omitempty"`
	Actor     string     `json:"actor,omitempty"`
	Reason    string     `json:"reason,omitempty"`
}

// sessionValue is the session's record (not attached to the lease, so it
// outlives it and GET /sessions/{id} can say EXPIRED or CLOSED).
type sessionValue struct {
	Owner     string    `json:"owner"`
	TTLMS     int64     `json:"ttl_ms"`
	CreatedAt time.Time `json:"created_at"`
	Closed    bool      `json:"closed,omitempty"`
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only plain structs are marshalled
	}
	return string(b)
}

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "etcd" }

// SetObserver implements backend.Backend.
func (b *Backend) SetObserver(o backend.Observer) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.observer = o
}

func (b *Backend) obs() backend.Observer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.observer
}

// Ping implements backend.Backend: a linearizable read.
func (b *Backend) Ping(ctx context.Context) error {
	if _, err := b.cli.Get(ctx, b.prefix+"/ping", clientv3.WithCountOnly()); err != nil {
		return classify("ping", err)
	}
	return nil
}

// Close implements backend.Backend.
func (b *Backend) Close() error {
	if b.watchCancel != nil {
		b.watchCancel()
	}
	if b.ownCli {
		return b.cli.Close()
	}
	return nil
}

func classify(what string, err error) error {
	if err == nil {
		return nil
	}
	var p *problem.Error
	if errors.As(err, &p) {
		return p
	}
	return backend.Unavailable(what, err)
}

func parseSessionID(id string) (clientv3.LeaseID, bool) {
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil || n <= 0 {
		return 0, false
	}
	return clientv3.LeaseID(n), true
}

func sessionID(l clientv3.LeaseID) string { return strconv.FormatInt(int64(l), 10) }

// CreateSession implements backend.Backend. etcd leases are whole seconds:
// the TTL is rounded up and the applied TTL reported.
func (b *Backend) CreateSession(ctx context.Context, owner string, ttl time.Duration) (backend.Session, error) {
	secs := int64((ttl + time.Second - 1) / time.Second)
	lr, err := b.cli.Grant(ctx, secs)
	if err != nil {
		return backend.Session{}, classify("create session", err)
	}
	id := sessionID(lr.ID)
	now := time.Now()
	applied := time.Duration(lr.TTL) * time.Second
	rec := sessionValue{Owner: owner, TTLMS: applied.Milliseconds(), CreatedAt: now.UTC()}
	if _, err := b.cli.Put(ctx, b.sessionPath(id), mustJSON(rec)); err != nil {
		_, _ = b.cli.Revoke(context.WithoutCancel(ctx), lr.ID)
		return backend.Session{}, classify("create session", err)
	}
	return backend.Session{ID: id, Owner: owner, TTL: applied, State: backend.StateActive, CreatedAt: now,
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

// KeepAlive implements backend.Backend: KeepAliveOnce, which etcd refuses
// for an expired or revoked lease, so renewal never revives a session.
func (b *Backend) KeepAlive(ctx context.Context, id string) (backend.Session, error) {
	lease, ok := parseSessionID(id)
	if !ok {
		return backend.Session{}, backend.ErrSessionGone(id)
	}
	rec, found, err := b.readSession(ctx, id)
	if err != nil {
		return backend.Session{}, err
	}
	if !found || rec.Closed {
		return backend.Session{}, backend.ErrSessionGone(id)
	}
	resp, err := b.cli.KeepAliveOnce(ctx, lease)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return backend.Session{}, backend.ErrSessionGone(id)
	}
	if err != nil {
		return backend.Session{}, classify("keepalive", err)
	}
	now := time.Now()
	ttl := time.Duration(resp.TTL) * time.Second
	return backend.Session{ID: id, Owner: rec.Owner, TTL: ttl, State: backend.StateActive, CreatedAt: rec.CreatedAt,
		LastHeartbeatAt: now, ExpiresAt: now.Add(ttl)}, nil
}

// Session implements backend.Backend. etcd does not record heartbeats: the
// last one is inferred from the lease's remaining TTL.
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
	s := backend.Session{ID: id, Owner: rec.Owner, TTL: time.Duration(rec.TTLMS) * time.Millisecond, CreatedAt: rec.CreatedAt}
	if rec.Closed {
		s.State = backend.StateClosed
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
	s.ExpiresAt = now.Add(remaining)
	s.LastHeartbeatAt = now.Add(remaining - granted)
	s.State = backend.SessionState(s.LastHeartbeatAt, now, granted)
	return s, nil
}

// CloseSession implements backend.Backend: release every lock of the session
// (grants end as released), mark the record closed, revoke the lease.
func (b *Backend) CloseSession(ctx context.Context, id string) (backend.Session, error) {
	lease, ok := parseSessionID(id)
	if !ok {
		return backend.Session{}, backend.ErrSessionGone(id)
	}
	s, err := b.Session(ctx, id)
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
		return s, backend.ErrSessionGone(id)
	}
	resp, err := b.cli.Get(ctx, b.prefix+"/locks/", clientv3.WithPrefix())
	if err != nil {
		return s, classify("close session", err)
	}
	for _, kv := range resp.Kvs {
		if clientv3.LeaseID(kv.Lease) != lease {
			continue
		}
		if _, err := b.end(ctx, kv, lease, backend.EndReleased, "session closed", ""); err != nil && !problem.Has(err, problem.NotHeld) {
			return s, err
		}
	}
	rec := sessionValue{Owner: s.Owner, TTLMS: s.TTL.Milliseconds(), CreatedAt: s.CreatedAt, Closed: true}
	if _, err := b.cli.Put(ctx, b.sessionPath(id), mustJSON(rec)); err != nil {
		return s, classify("close session", err)
	}
	if _, err := b.cli.Revoke(ctx, lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return s, classify("close session", err)
	}
	s.State = backend.StateClosed
	return s, nil
}

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

// Changed implements backend.Backend: signalled from the watch.
func (b *Backend) Changed(key string) (<-chan struct{}, func()) { return b.waiters.Changed(key) }

func (b *Backend) signal(key string) { b.waiters.Signal(key) }

func (b *Backend) startWatch(ctx context.Context) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	ch := b.cli.Watch(wctx, b.prefix+"/locks/", clientv3.WithPrefix(), clientv3.WithPrevKV(),
		clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	select {
	case resp, ok := <-ch:
		if !ok || resp.Err() != nil || !resp.Created {
			cancel()
			if ok && resp.Err() != nil {
				return resp.Err()
			}
			return errors.New("watch was not created")
		}
	case <-ctx.Done():
		cancel()
		return ctx.Err()
	}
	b.mu.Lock()
	if b.watchCancel != nil {
		b.watchCancel()
	}
	b.watchCancel, b.watchCh = cancel, ch
	b.mu.Unlock()
	return nil
}

// Run implements backend.Backend: records grants ended by lease expiry (from
// the watch, and by a periodic sweep for anything the watch missed, e.g.
// while no lock service was running).
func (b *Backend) Run(ctx context.Context) error {
	t := time.NewTicker(b.sweepIv)
	defer t.Stop()
	b.sweep(ctx)
	for ctx.Err() == nil {
		b.mu.Lock()
		ch := b.watchCh
		b.mu.Unlock()
		if ch == nil {
			if err := b.startWatch(ctx); err != nil {
				if ctx.Err() == nil {
					b.log.Warn("etcd watch failed; retrying", "error", err.Error())
				}
				select {
				case <-ctx.Done():
				case <-time.After(500 * time.Millisecond):
				}
				continue
			}
			b.sweep(ctx) // catch what happened while not watching
			continue
		}
		select {
		case <-ctx.Done():
		case <-t.C:
			b.sweep(ctx)
		case resp, ok := <-ch:
			if !ok || resp.Err() != nil || resp.Canceled {
				b.mu.Lock()
				if b.watchCancel != nil {
					b.watchCancel()
				}
				b.watchCh, b.watchCancel = nil, nil
				b.mu.Unlock()
				continue
			}
			for _, ev := range resp.Events {
				if ev.Type != mvccpb.DELETE || ev.PrevKv == nil {
					continue
				}
				key := strings.TrimPrefix(string(ev.Kv.Key), b.prefix+"/locks/")
				b.signal(key)
				b.recordExpiry(ctx, ev.PrevKv)
			}
		}
	}
	return nil
}

// recordExpiry ends the grant of a lock key that vanished without a release
// or revoke transaction (those rewrite the grant record, so the CAS on its
// ModRevision == token fails and nothing is written twice).
func (b *Backend) recordExpiry(ctx context.Context, prev *mvccpb.KeyValue) {
	var lv lockValue
	if err := json.Unmarshal(prev.Value, &lv); err != nil {
		return
	}
	key := strings.TrimPrefix(string(prev.Key), b.prefix+"/locks/")
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
// expired those whose key is gone or belongs to a newer grant.
func (b *Backend) sweep(ctx context.Context) {
	resp, err := b.cli.Get(ctx, b.prefix+"/open/", clientv3.WithPrefix())
	if err != nil {
		if ctx.Err() == nil {
			b.log.Warn("sweep of open grants failed", "error", err.Error())
		}
		return
	}
	for _, kv := range resp.Kvs {
		gid := strings.TrimPrefix(string(kv.Key), b.prefix+"/open/")
		key := string(kv.Value)
		token := kv.CreateRevision
		lr, err := b.cli.Get(ctx, b.lockPath(key))
		if err != nil {
			return
		}
		if len(lr.Kvs) > 0 && lr.Kvs[0].CreateRevision == token {
			continue // still held
		}
		gr, err := b.cli.Get(ctx, b.grantPath(gid))
		if err != nil || len(gr.Kvs) == 0 {
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
