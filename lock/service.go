// Package lock is the lock service: HTTP sessions, leases and fencing
// tokens over a backend (PostgreSQL or etcd). It knows nothing about money.
// It keeps no state of its own beyond the backend, so any number of
// service processes on one backend behave as one service.
package lock

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/lockclient"
)

// maxSessionTTL is the longest a session lives without a keepalive.
const maxSessionTTL = backend.MaxTTL

// opTimeout bounds one backend call.
const opTimeout = 10 * time.Second

// retryInterval is how often a waiting acquire retries without a signal
// (a lapsed session's lock is free before anything signals it).
const retryInterval = 500 * time.Millisecond

// Service is the lock service's HTTP API over one backend.
type Service struct {
	b   backend.Backend
	log *slog.Logger
	m   *metrics

	mu      sync.Mutex
	waiters map[string]*keyWaiters
	owners  owners
	expired recentSet // sessions already counted in expiredSessions

	// stopping is closed when the service drains (StopWaiting): a waiting
	// acquire then answers at once, as if its wait had run out, instead
	// of holding the server's shutdown past its grace.
	stopping chan struct{}
	stopOnce sync.Once
}

// StopWaiting ends every waiting acquire, now and later, with the answer
// its last try got (lock_held): the server is draining, and a wait of up
// to backend.MaxWait would outlast its shutdown grace. Callers try again,
// on another replica.
func (s *Service) StopWaiting() { s.stopOnce.Do(func() { close(s.stopping) }) }

// recentSet remembers the last recentSetSize ids added: a backend reports
// an expired session's grants one by one or together, and the session is
// counted once.
type recentSet struct {
	ids  map[string]struct{}
	ring []string
	next int
}

const recentSetSize = 4096

// add reports whether id is new, remembering it.
func (r *recentSet) add(id string) bool {
	if _, ok := r.ids[id]; ok {
		return false
	}
	if r.ids == nil {
		r.ids, r.ring = map[string]struct{}{}, make([]string, recentSetSize)
	}
	if old := r.ring[r.next]; old != "" {
		delete(r.ids, old)
	}
	r.ring[r.next], r.next = id, (r.next+1)%recentSetSize
	r.ids[id] = struct{}{}
	return true
}

func (s *Service) countExpiredSessions(grants []backend.GrantRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range grants {
		if s.expired.add(g.SessionID) {
			s.m.expiredSessions.Inc()
		}
	}
}

type metrics struct {
	grants, releases, expirations, revocations, graces, notOwner prometheus.Counter
	expiredSessions                                              prometheus.Counter
	activeSessions, waiters, storeBytes, storeQuota              prometheus.Gauge
	acquire, storeBatch                                          *prometheus.HistogramVec
	handoffs                                                     *prometheus.CounterVec
	// The acquire histogram's series, resolved once: no label lookup per
	// request.
	acquireGranted, acquireHeld, acquireError prometheus.Observer
}

func newMetrics(reg prometheus.Registerer, name string) *metrics {
	l := prometheus.Labels{"backend": name}
	m := &metrics{
		grants:      prometheus.NewCounter(prometheus.CounterOpts{Name: "payouts_lock_grants_total", Help: "Grants made (new tokens minted).", ConstLabels: l}),
		releases:    prometheus.NewCounter(prometheus.CounterOpts{Name: "payouts_lock_releases_total", Help: "Grants ended by release.", ConstLabels: l}),
		expirations: prometheus.NewCounter(prometheus.CounterOpts{Name: "payouts_lock_expirations_total", Help: "Grants ended because their session expired (observed by this process).", ConstLabels: l}),
		expiredSessions: prometheus.NewCounter(prometheus.CounterOpts{Name: "payouts_lock_expired_sessions_total",
			Help: "Sessions whose expiry ended grants (observed by this process; each session once, however many grants it held).", ConstLabels: l}),
		revocations:    prometheus.NewCounter(prometheus.CounterOpts{Name: "payouts_lock_revocations_total", Help: "Grants force-revoked by an operator. Alert on any increase.", ConstLabels: l}),
		notOwner:       prometheus.NewCounter(prometheus.CounterOpts{Name: "payouts_lock_not_session_owner_total", Help: "Requests refused because the caller does not own the session they name.", ConstLabels: l}),
		graces:         prometheus.NewCounter(prometheus.CounterOpts{Name: "payouts_lock_grace_periods_total", Help: "Grace periods started (service start, database failover or restart).", ConstLabels: l}),
		activeSessions: prometheus.NewGauge(prometheus.GaugeOpts{Name: "payouts_lock_active_sessions", Help: "Live sessions in the backend.", ConstLabels: l}),
		waiters:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "payouts_lock_waiters", Help: "Acquires waiting for a key on this process.", ConstLabels: l}),
		storeBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "payouts_lock_store_bytes",
			Help: "Size of the lock store where it has a write limit (etcd: the database of the member nearest its quota), read every compaction interval.", ConstLabels: l}),
		storeQuota: prometheus.NewGauge(prometheus.GaugeOpts{Name: "payouts_lock_store_quota_bytes",
			Help: "The size at which that store refuses every write (etcd: --quota-backend-bytes; NOSPACE alarm).", ConstLabels: l}),
		storeBatch: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "payouts_lock_store_batch_calls",
			Help:        "Calls one store statement or transaction carried, by op (acquire, release): calls that arrive while one is in flight go together (PostgreSQL: acquires and releases; etcd: releases and revokes, as op release).",
			ConstLabels: l, Buckets: []float64{1, 2, 4, 8, 16, 32, 64}}, []string{"op"}),
		handoffs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "payouts_lock_handoffs_total",
			Help:        "Releases and revokes that waited, before answering, for an acquire waiting for the key: one on this process tried or none was left (local), the key was taken again, normally by a waiter on another process (remote), or the wait ended first (timed_out).",
			ConstLabels: l}, []string{"result"}),
		acquire: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "payouts_lock_acquire_duration_seconds", Help: "Acquire latency by result (granted, held, error), waiting included.",
			ConstLabels: l, Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}, []string{"result"}),
	}
	reg.MustRegister(m.grants, m.releases, m.expirations, m.expiredSessions, m.revocations, m.graces, m.notOwner, m.activeSessions, m.waiters, m.storeBytes, m.storeQuota, m.acquire, m.storeBatch, m.handoffs)
	m.acquireGranted, m.acquireHeld, m.acquireError = m.acquire.WithLabelValues("granted"), m.acquire.WithLabelValues("held"), m.acquire.WithLabelValues("error")
	for _, r := range []string{"local", "remote", "timed_out"} {
		m.handoffs.WithLabelValues(r)
	}
	return m
}

// NewService builds the API over b, registering its metrics on reg.
func NewService(b backend.Backend, reg prometheus.Registerer, log *slog.Logger) *Service {
	if log == nil {
		log = slog.Default()
	}
	s := &Service{b: b, log: log, m: newMetrics(reg, b.Name()), waiters: map[string]*keyWaiters{}, stopping: make(chan struct{})}
	b.SetObserver(observer{s})
	return s
}

type observer struct{ s *Service }

func (o observer) Expired(grants []backend.GrantRecord) {
	o.s.m.expirations.Add(float64(len(grants)))
	o.s.countExpiredSessions(grants)
	for _, g := range grants {
		o.s.log.Info("lock expired: session lapsed", obs.KeyKey, g.Key, obs.KeyToken, int64(g.Token), obs.KeyHolder, g.SessionID, "owner", g.Owner)
	}
}

func (o observer) Grace(until time.Time, why string) { o.s.m.graces.Inc() }

func (o observer) ActiveSessions(n int) { o.s.m.activeSessions.Set(float64(n)) }

func (o observer) StoreSize(bytes, quota int64) {
	o.s.m.storeBytes.Set(float64(bytes))
	o.s.m.storeQuota.Set(float64(quota))
}

func (o observer) StoreBatch(op string, calls int) {
	o.s.m.storeBatch.WithLabelValues(op).Observe(float64(calls))
}

// Mount adds the /v1 routes to r (an authenticated router).
func (s *Service) Mount(r chi.Router) {
	r.Route("/v1", func(r chi.Router) {
		// In a group, not on /v1 itself: middleware of a subrouter runs
		// before it routes, and would answer an unrouted path or method
		// 401/403 instead of 404/405.
		r.Group(func(r chi.Router) {
			r.Use(auth.Require(auth.Executor, auth.Reconciler, auth.Operator)) // the proxy role is a credential at the rail only
			r.Post("/sessions", httpx.Handler(s.createSession))
			r.Get("/sessions/{id}", httpx.Handler(s.getSession))
			r.Delete("/sessions/{id}", httpx.Handler(s.closeSession))
			r.Post("/sessions/{id}/keepalive", httpx.Handler(s.keepAlive))
			r.Get("/locks", httpx.Handler(s.listLocks))
			r.Get("/locks/{key}", httpx.Handler(s.getLock))
			r.Post("/locks/{key}/acquire", httpx.Handler(s.acquire))
			r.Post("/locks/{key}/release", httpx.Handler(s.release))
			r.With(auth.Require(auth.Operator)).Post("/locks/{key}/revoke", httpx.Handler(s.revoke))
			r.Get("/grants", httpx.Handler(s.grants))
			r.Get("/tokens/high", httpx.Handler(s.highToken))
		})
	})
}

func op(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), opTimeout)
}

func tptr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func sessionInfo(x backend.Session) lockclient.SessionInfo {
	return lockclient.SessionInfo{SessionID: x.ID, Owner: x.Owner, TTLMS: x.TTL.Milliseconds(), State: x.State,
		CreatedAt: tptr(x.CreatedAt), LastHeartbeatAt: tptr(x.LastHeartbeatAt), ExpiresAt: tptr(x.ExpiresAt)}
}

func grantRecord(g backend.GrantRecord) lockclient.GrantRecord {
	r := lockclient.GrantRecord{Token: g.Token, Key: g.Key, Owner: g.Owner, SessionID: g.SessionID, GrantedAt: g.GrantedAt.UTC(),
		EndedAt: nil, Actor: g.Actor, Reason: g.Reason}
	if g.EndedAt != nil {
		r.EndedAt = tptr(*g.EndedAt)
		reason := g.EndReason
		r.EndReason = &reason
	}
	return r
}

func (s *Service) lockInfo(l backend.Lock) lockclient.LockInfo {
	info := lockclient.LockInfo{Key: l.Key, Held: l.Held, Waiters: s.waiting(l.Key)}
	if l.Held {
		info.Owner, info.SessionID, info.Token = l.Owner, l.SessionID, l.Token
		info.AcquiredAt, info.ServerExpiry = tptr(l.AcquiredAt), tptr(l.ServerExpiry)
	}
	return info
}

func queryInt(q url.Values, name string, def, lo, hi int64) (int64, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, wire.BadField(name, "must be an integer between %d and %d, got %q", lo, hi, v)
	}
	return n, nil
}

// errBackend names an unknown backend.
func errBackend(name string) error {
	return fmt.Errorf("unknown lock backend %q: want etcd or postgres", name)
}
