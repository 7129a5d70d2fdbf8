package lock

import (
	"net/http"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/lockclient"
)

// Session handlers: open, read, renew and close; every use of a session
// but reading it is its owner's alone.

func (s *Service) createSession(w http.ResponseWriter, r *http.Request) error {
	var req lockclient.CreateSessionRequest
	if err := httpx.DecodeJSON(r, &req); err != nil {
		return err
	}
	if err := backend.CheckOwner(req.Owner); err != nil {
		return err
	}
	ttl, err := backend.CheckTTL(req.TTLMS)
	if err != nil {
		return err
	}
	p, _ := auth.FromContext(r.Context())
	ctx, cancel := op(r)
	defer cancel()
	x, err := s.b.CreateSession(ctx, req.Owner, p.Name, ttl)
	if err != nil {
		return err
	}
	s.owners.put(x.ID, x.Principal)
	s.log.Debug("session opened", "session_id", x.ID, "owner", x.Owner, "principal", x.Principal, "ttl_ms", x.TTL.Milliseconds())
	httpx.WriteJSON(w, http.StatusCreated, sessionInfo(x))
	return nil
}

func sessionParam(r *http.Request) (string, error) {
	id := httpx.PathParam(r, "id")
	return id, backend.CheckSessionID(id)
}

func (s *Service) getSession(w http.ResponseWriter, r *http.Request) error {
	if _, err := wire.Query(r.URL.RawQuery); err != nil {
		return err
	}
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
	if err := httpx.DecodeEmpty(r); err != nil {
		return err
	}
	if err := s.checkOwner(r, id); err != nil {
		return err
	}
	ctx, cancel := op(r)
	defer cancel()
	x, err := s.b.CloseSession(ctx, id)
	if err == nil || problem.Has(err, problem.SessionExpired) {
		s.owners.forget(id)
	}
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
	if err := httpx.DecodeEmpty(r); err != nil {
		return err
	}
	if err := s.checkOwner(r, id); err != nil {
		return err
	}
	ctx, cancel := op(r)
	defer cancel()
	x, err := s.b.KeepAlive(ctx, id)
	s.sessionAnswered(id, err)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, sessionInfo(x))
	return nil
}

// checkOwner refuses the request unless its caller (the authenticated
// principal) owns session id. An unknown session passes: the operation
// itself answers session_expired. Sessions opened before ownership was
// recorded have no principal and are not tied to anyone.
func (s *Service) checkOwner(r *http.Request, id string) error {
	p, _ := auth.FromContext(r.Context())
	owner, ok := s.owners.get(id)
	if !ok {
		ctx, cancel := op(r)
		defer cancel()
		x, err := s.b.Session(ctx, id)
		if problem.Has(err, problem.NotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		owner = x.Principal
		s.owners.put(id, owner)
	}
	if owner != "" && owner != p.Name {
		s.m.notOwner.Inc()
		s.log.Warn("session used by a principal that does not own it", obs.KeyEvent, "not_session_owner", "session_id", id,
			"principal", p.Name, "principal_role", string(p.Role), "path", r.URL.Path)
		return problem.New(problem.NotSessionOwner, "session %s belongs to another principal: only the principal that opened it may use or close it (an operator ends another's lock with revoke)", id)
	}
	return nil
}

// sessionAnswered forgets a session the backend no longer knows as live.
func (s *Service) sessionAnswered(id string, err error) {
	if problem.Has(err, problem.SessionExpired) {
		s.owners.forget(id)
	}
}
