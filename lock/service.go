// Package lock is the lock service: HTTP sessions, leases and fencing
// tokens over a backend (PostgreSQL or etcd). It knows nothing about money.
// It keeps no state of its own beyond the backend, so any number of
// service processes on one backend behave as one service.
package lock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
)

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
	waiters map[string]int
}

type metrics struct {
	grants, releases, expirations, revocations, graces prometheus.Counter
	activeSessions, waiters                            prometheus.Gauge
	acquire                                            *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer, name string) *metrics {
	l := prometheus.Labels{"backend": name}
	m := &metrics{
		grants:         prometheus.NewCounter(prometheus.CounterOpts{Name: "payouts_lock_grants_total", Help: "Grants made (new tokens minted).", ConstLabels: l}),
		releases:       prometheus.NewCounter(prometheus.CounterOpts{Name: "payouts_lock_releases_total", Help: "Grants ended by release.", ConstLabels: l}),
		expirations:    prometheus.NewCounter(prometheus.CounterOpts{Name: "payouts_lock_expirations_total", Help: "Grants ended because their session expired (observed by this process).", ConstLabels: l}),
		revocations:    prometheus.NewCounter(prometheus.CounterOpts{Name: "payouts_lock_revocations_total", Help: "Grants force-revoked by an operator. Alert on any increase.", ConstLabels: l}),
		graces:         prometheus.NewCounter(prometheus.CounterOpts{Name: "payouts_lock_grace_periods_total", Help: "Grace periods started (service start, database failover or restart).", ConstLabels: l}),
		activeSessions: prometheus.NewGauge(prometheus.GaugeOpts{Name: "payouts_lock_active_sessions", Help: "Live sessions in the backend.", ConstLabels: l}),
		waiters:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "payouts_lock_waiters", Help: "Acquires waiting for a key on this process.", ConstLabels: l}),
		acquire: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "payouts_lock_acquire_duration_seconds", Help: "Acquire latency by result (granted, held, error), waiting included.",
			ConstLabels: l, Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}, []string{"result"}),
	}
	reg.MustRegister(m.grants, m.releases, m.expirations, m.revocations, m.graces, m.activeSessions, m.waiters, m.acquire)
	return m
}

// NewService builds the API over b, registering its metrics on reg.
func NewService(b backend.Backend, reg prometheus.Registerer, log *slog.Logger) *Service {
	if log == nil {
		log = slog.Default()
	}
	s := &Service{b: b, log: log, m: newMetrics(reg, b.Name()), waiters: map[string]int{}}
	b.SetObserver(observer{s})
	return s
}

type observer struct{ s *Service }

func (o observer) Expired(grants []backend.GrantRecord) {
	o.s.m.expirations.Add(float64(len(grants)))
	for _, g := range grants {
		o.s.log.Info("lock expired: session lapsed", obs.KeyKey, g.Key, obs.KeyToken, int64(g.Token), obs.KeyHolder, g.SessionID, "owner", g.Owner)
	}
}

func (o observer) Grace(until time.Time, why string) { o.s.m.graces.Inc() }

func (o observer) ActiveSessions(n int) { o.s.m.activeSessions.Set(float64(n)) }

// Mount adds the /v1 routes to r (an authenticated router).
func (s *Service) Mount(r chi.Router) {
	r.Route("/v1", func(r chi.Router) {
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

func (s *Service) createSession(w http.ResponseWriter, r *http.Request) error {
	var req lockclient.CreateSessionRequest
	if err := httpx.DecodeJSON(r, &req); err != nil {
		return err
	}
	if err := backend.CheckOwner(req.Owner); err != nil {
		return err
	}
	if err := backend.CheckTTL(time.Duration(req.TTLMS) * time.Millisecond); err != nil {
		return err
	}
	ctx, cancel := op(r)
	defer cancel()
	x, err := s.b.CreateSession(ctx, req.Owner, time.Duration(req.TTLMS)*time.Millisecond)
	if err != nil {
		return err
	}
	s.log.Debug("session opened", "session_id", x.ID, "owner", x.Owner, "ttl_ms", x.TTL.Milliseconds())
	httpx.WriteJSON(w, http.StatusCreated, sessionInfo(x))
	return nil
}

func sessionParam(r *http.Request) (string, error) {
	id := chi.URLParam(r, "id")
	return id, backend.CheckSessionID(id)
}

func (s *Service) getSession(w http.ResponseWriter, r *http.Request) error {
	id, err := sessionParam(r)
	if err != nil {
		return err
	}
	ctx, cancel := op(r)
	defer cancel()
	x, err := s.b.Session(ctx, id)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, sessionInfo(x))
	return nil
}

func (s *Service) closeSession(w http.ResponseWriter, r *http.Request) error {
	id, err := sessionParam(r)
	if err != nil {
		return err
	}
	ctx, cancel := op(r)
	defer cancel()
	x, err := s.b.CloseSession(ctx, id)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, sessionInfo(x))
	return nil
}

func (s *Service) keepAlive(w http.ResponseWriter, r *http.Request) error {
	id, err := sessionParam(r)
	if err != nil {
		return err
	}
	// The body is optional; when sent it must be an empty JSON object.
	if r.ContentLength != 0 {
		var empty struct{}
		if err := httpx.DecodeJSON(r, &empty); err != nil && r.ContentLength > 0 {
			return err
		}
	}
	ctx, cancel := op(r)
	defer cancel()
	x, err := s.b.KeepAlive(ctx, id)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, sessionInfo(x))
	return nil
}

func keyParam(r *http.Request) (string, error) {
	key := chi.URLParam(r, "key")
	return key, backend.CheckKey(key)
}

func (s *Service) getLock(w http.ResponseWriter, r *http.Request) error {
	key, err := keyParam(r)
	if err != nil {
		return err
	}
	ctx, cancel := op(r)
	defer cancel()
	l, err := s.b.Lock(ctx, key)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, s.lockInfo(l))
	return nil
}

func queryInt(r *http.Request, name string, def, lo, hi int64) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, problem.New(problem.InvalidRequest, "query parameter %s must be an integer between %d and %d, got %q", name, lo, hi, v)
	}
	return n, nil
}

func (s *Service) listLocks(w http.ResponseWriter, r *http.Request) error {
	prefix := r.URL.Query().Get("prefix")
	if err := backend.CheckPrefix(prefix); err != nil {
		return err
	}
	limit, err := queryInt(r, "limit", 1000, 1, 10000)
	if err != nil {
		return err
	}
	ctx, cancel := op(r)
	defer cancel()
	ls, err := s.b.Locks(ctx, prefix, int(limit))
	if err != nil {
		return err
	}
	out := lockclient.LockList{Items: make([]lockclient.LockInfo, 0, len(ls))}
	for _, l := range ls {
		out.Items = append(out.Items, s.lockInfo(l))
	}
	httpx.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Service) waiting(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiters[key]
}

func (s *Service) addWaiter(key string, d int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waiters[key] += d
	if s.waiters[key] == 0 {
		delete(s.waiters, key)
	}
	s.m.waiters.Add(float64(d))
}

func (s *Service) acquire(w http.ResponseWriter, r *http.Request) error {
	start := time.Now()
	key, err := keyParam(r)
	if err != nil {
		return err
	}
	var req lockclient.AcquireRequest
	if err := httpx.DecodeJSON(r, &req); err != nil {
		return err
	}
	if err := backend.CheckSessionID(req.SessionID); err != nil {
		return err
	}
	if req.WaitMS < 0 || time.Duration(req.WaitMS)*time.Millisecond > backend.MaxWait {
		return problem.New(problem.InvalidRequest, "wait_ms must be between 0 and %d, got %d", backend.MaxWait.Milliseconds(), req.WaitMS)
	}
	g, err := s.acquireWaiting(r.Context(), key, req.SessionID, time.Duration(req.WaitMS)*time.Millisecond)
	result := "granted"
	switch {
	case problem.Has(err, problem.LockHeld):
		result = "held"
	case err != nil:
		result = "error"
	}
	s.m.acquire.WithLabelValues(result).Observe(time.Since(start).Seconds())
	if err != nil {
		var pe *problem.Error
		if errors.As(err, &pe) && pe.Code == problem.LockHeld {
			pe = pe.With("waiters", s.waiting(key))
			return pe
		}
		return err
	}
	if !g.Existing {
		s.m.grants.Inc()
		s.log.Debug("lock granted", obs.KeyKey, key, obs.KeyToken, int64(g.Token), obs.KeyHolder, g.SessionID, "owner", g.Owner)
	}
	httpx.WriteJSON(w, http.StatusOK, lockclient.GrantInfo{Key: g.Key, Owner: g.Owner, Token: g.Token, SessionID: g.SessionID, ServerExpiry: g.ServerExpiry.UTC()})
	return nil
}

// acquireWaiting tries at once, then (wait > 0) again on every signal that
// the key may be free, and on a timer, until wait has passed.
func (s *Service) acquireWaiting(ctx context.Context, key, sid string, wait time.Duration) (backend.Grant, error) {
	deadline := time.Now().Add(wait)
	var changed <-chan struct{}
	if wait > 0 {
		ch, cancel := s.b.Changed(key) // subscribe first: a release in between is not missed
		defer cancel()
		changed = ch
		s.addWaiter(key, 1)
		defer s.addWaiter(key, -1)
	}
	for {
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		g, err := s.b.Acquire(octx, key, sid)
		cancel()
		if err == nil || !problem.Has(err, problem.LockHeld) {
			return g, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return g, err
		}
		t := time.NewTimer(min(left, retryInterval))
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return g, err
		}
		t.Stop()
	}
}

func (s *Service) release(w http.ResponseWriter, r *http.Request) error {
	key, err := keyParam(r)
	if err != nil {
		return err
	}
	var req lockclient.ReleaseRequest
	if err := httpx.DecodeJSON(r, &req); err != nil {
		return err
	}
	if err := backend.CheckSessionID(req.SessionID); err != nil {
		return err
	}
	if !req.Token.Valid() {
		return problem.New(problem.InvalidRequest, "token must be a positive integer below 2^53, got %d", int64(req.Token))
	}
	ctx, cancel := op(r)
	defer cancel()
	rec, err := s.b.Release(ctx, key, req.SessionID, req.Token)
	if err != nil {
		return err
	}
	s.m.releases.Inc()
	httpx.WriteJSON(w, http.StatusOK, grantRecord(rec))
	return nil
}

func (s *Service) revoke(w http.ResponseWriter, r *http.Request) error {
	key, err := keyParam(r)
	if err != nil {
		return err
	}
	var req lockclient.RevokeRequest
	if err := httpx.DecodeJSON(r, &req); err != nil {
		return err
	}
	if req.Reason == "" {
		return problem.New(problem.InvalidRequest, "reason is required: say why the lock is being revoked")
	}
	if len(req.Reason) > backend.MaxReason {
		return problem.New(problem.InvalidRequest, "reason is longer than %d characters", backend.MaxReason)
	}
	p, _ := auth.FromContext(r.Context())
	ctx, cancel := op(r)
	defer cancel()
	rec, err := s.b.Revoke(ctx, key, p.Name, req.Reason)
	if err != nil {
		return err
	}
	s.m.revocations.Inc()
	s.log.Error("lock force-revoked by an operator", obs.KeyEvent, "lock_revoked", obs.KeyKey, key, obs.KeyToken, int64(rec.Token),
		obs.KeyHolder, rec.SessionID, "owner", rec.Owner, "actor", p.Name, "reason", req.Reason)
	httpx.WriteJSON(w, http.StatusOK, grantRecord(rec))
	return nil
}

func (s *Service) grants(w http.ResponseWriter, r *http.Request) error {
	after, err := queryInt(r, "after_token", 0, 0, int64(fencing.MaxToken))
	if err != nil {
		return err
	}
	limit, err := queryInt(r, "limit", 100, 1, 1000)
	if err != nil {
		return err
	}
	ctx, cancel := op(r)
	defer cancel()
	recs, err := s.b.Grants(ctx, fencing.Token(after), int(limit))
	if err != nil {
		return err
	}
	out := lockclient.GrantPage{Items: make([]lockclient.GrantRecord, 0, len(recs))}
	for _, g := range recs {
		out.Items = append(out.Items, grantRecord(g))
	}
	if len(recs) == int(limit) {
		out.Next = strconv.FormatInt(int64(recs[len(recs)-1].Token), 10)
	}
	httpx.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Service) highToken(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := op(r)
	defer cancel()
	t, err := s.b.HighToken(ctx)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, lockclient.HighTokenResponse{Token: t})
	return nil
}

// errBackend names an unknown backend.
func errBackend(name string) error {
	return fmt.Errorf("unknown lock backend %q: want etcd or postgres", name)
}
