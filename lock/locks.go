package lock

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/lockclient"
)

// Lock handlers: acquire (waiting), release, revoke and introspection.

func keyParam(r *http.Request) (string, error) {
	key := httpx.PathParam(r, "key")
	return key, backend.CheckKey(key)
}

func (s *Service) getLock(w http.ResponseWriter, r *http.Request) error {
	if _, err := wire.Query(r.URL.RawQuery); err != nil {
		return err
	}
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

func (s *Service) listLocks(w http.ResponseWriter, r *http.Request) error {
	q, err := wire.Query(r.URL.RawQuery, "prefix", "limit")
	if err != nil {
		return err
	}
	prefix := q.Get("prefix")
	if err := backend.CheckPrefix(prefix); err != nil {
		return err
	}
	limit, err := queryInt(q, "limit", 1000, 1, 10000)
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
	wait, err := backend.CheckWait(req.WaitMS)
	if err != nil {
		return err
	}
	if err := s.checkOwner(r, req.SessionID); err != nil {
		return err
	}
	g, err := s.acquireWaiting(r.Context(), key, req.SessionID, wait)
	s.sessionAnswered(req.SessionID, err)
	took := s.m.acquireGranted
	switch {
	case problem.Has(err, problem.LockHeld):
		took = s.m.acquireHeld
	case err != nil:
		took = s.m.acquireError
	}
	took.Observe(time.Since(start).Seconds())
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
// the key may be free, and on a timer, until wait has passed. A try woken by
// a signal reports itself to the release waiting to hand the key over.
func (s *Service) acquireWaiting(ctx context.Context, key, sid string, wait time.Duration) (backend.Grant, error) {
	deadline := time.Now().Add(wait)
	var (
		changed <-chan struct{}
		w       *keyWaiters
	)
	if wait > 0 {
		ch, cancel := s.b.Changed(key) // subscribe first: a release in between is not missed
		defer cancel()
		changed = ch
		var done func()
		w, done = s.addWaiter(key)
		defer done()
	}
	woken := false
	var unmark func()
	for {
		var e uint64
		if woken {
			e = s.epochOf(w)
		}
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		g, err := s.b.Acquire(octx, key, sid)
		cancel()
		if err == nil || !problem.Has(err, problem.LockHeld) {
			return g, err
		}
		if woken {
			s.tried(w, e, heldBy(err))
		}
		left := time.Until(deadline)
		if left <= 0 {
			return g, err
		}
		if unmark == nil {
			octx, cancel := context.WithDeadline(ctx, deadline)
			unmark = s.b.Waiting(octx, key, sid, deadline) // for a release on another process to hand the key over
			cancel()
			defer unmark()
		}
		t := time.NewTimer(min(left, retryInterval))
		select {
		case <-changed:
			woken = true
		case <-t.C:
			woken = false
		case <-ctx.Done():
			t.Stop()
			return g, err
		case <-s.stopping:
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
		return wire.BadField("token", "must be a positive integer below 2^53, got %d", int64(req.Token))
	}
	if err := s.checkOwner(r, req.SessionID); err != nil {
		return err
	}
	ctx, cancel := op(r)
	defer cancel()
	rec, err := s.handingOver(ctx, key, func() (backend.GrantRecord, error) { return s.b.Release(ctx, key, req.SessionID, req.Token) })
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
		return wire.BadField("reason", "required: say why the lock is being revoked")
	}
	if err := wire.ValidText("reason", req.Reason, backend.MaxReason, true, false); err != nil {
		return err
	}
	p, _ := auth.FromContext(r.Context())
	ctx, cancel := op(r)
	defer cancel()
	rec, err := s.handingOver(ctx, key, func() (backend.GrantRecord, error) { return s.b.Revoke(ctx, key, p.Name, req.Reason) })
	if err != nil {
		return err
	}
	s.m.revocations.Inc()
	s.log.Error("lock force-revoked by an operator", obs.KeyEvent, "lock_revoked", obs.KeyKey, key, obs.KeyToken, int64(rec.Token),
		obs.KeyHolder, rec.SessionID, "owner", rec.Owner, "actor", p.Name, "reason", req.Reason)
	httpx.WriteJSON(w, http.StatusOK, grantRecord(rec))
	return nil
}

// heldBy is the session a lock_held error names as the holder ("" if none).
func heldBy(err error) string {
	var pe *problem.Error
	if !errors.As(err, &pe) {
		return ""
	}
	var sid string
	_ = json.Unmarshal(pe.Extensions["holder_session_id"], &sid)
	return sid
}
