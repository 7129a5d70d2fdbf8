package railproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// validateSubmit checks a submission against the limits every role shares
// (internal/wire: the payment resource accepted this payout under the same
// ones) and that client_ref is the payout's own reference (D-10): a
// reference that is not derived from payout_id could plant a payment under
// another payout's reference and mislead its later lookup.
func validateSubmit(r proxyclient.SubmitRequest) error {
	if err := wire.ValidID("payout_id", r.PayoutID); err != nil {
		return err
	}
	if err := wire.ValidID("account_id", r.AccountID); err != nil {
		return err
	}
	if err := wire.ValidFence(r.Token, r.Holder); err != nil {
		return err
	}
	if want := wire.ClientRef(r.PayoutID); r.ClientRef != want {
		return wire.BadField("client_ref", "must be the payout's client reference %q (DESIGN D-10), got %q", want, r.ClientRef)
	}
	if err := wire.ValidAmount("amount", r.Amount, false); err != nil {
		return err
	}
	if err := wire.ValidCurrency("currency", r.Currency); err != nil {
		return err
	}
	return wire.ValidRef("beneficiary_ref", r.BeneficiaryRef)
}

// refusedUnforwarded marks a refusal made before anything was written or
// forwarded: the submission can never succeed as sent, and nothing reached
// the rail (the executor may end the payout, POST /payouts/{id}/refuse).
func refusedUnforwarded(err error, payoutID string) error {
	e := problem.From(err).With(proxyclient.ForwardedExtension, false)
	if wire.IDPattern.MatchString(payoutID) { // an id no payout can have is not echoed
		e = e.With("payout_id", payoutID)
	}
	return e
}

// payoutParam reads the payout id of the path: an id that cannot exist is
// not found, and never reaches SQL.
func payoutParam(r *http.Request) (string, error) {
	id := httpx.PathParam(r, "payout_id")
	if !wire.IDPattern.MatchString(id) {
		return "", problem.New(problem.NotFound, "no payout %q: payout ids are 1-%d characters of A-Z a-z 0-9 . _ -", id, wire.MaxIDLen)
	}
	return id, nil
}

// dbTimeout bounds each detached database step of a submission.
const dbTimeout = 15 * time.Second

func (s *Server) submit(w http.ResponseWriter, r *http.Request) error {
	var req proxyclient.SubmitRequest
	if err := httpx.DecodeJSON(r, &req); err != nil {
		return refusedUnforwarded(err, req.PayoutID)
	}
	if err := validateSubmit(req); err != nil {
		httpx.Log(r.Context()).Warn("submission refused without forwarding: it can never be accepted",
			obs.KeyPayoutID, problem.Echo(req.PayoutID), obs.KeyAccountID, problem.Echo(req.AccountID), obs.KeyError, err.Error())
		return refusedUnforwarded(err, req.PayoutID)
	}
	log := httpx.Log(r.Context()).With(obs.KeyPayoutID, req.PayoutID, obs.KeyAccountID, req.AccountID,
		obs.KeyKey, fencing.Key(req.AccountID), obs.KeyToken, int64(req.Token), obs.KeyHolder, string(req.Holder))

	// From here on the caller going away changes nothing: an interrupted
	// commit would leave us not knowing whether the intent was written.
	detached := context.WithoutCancel(r.Context())
	if !s.enter() {
		return shuttingDown()
	}
	defer s.forwards.Done()
	if s.gate.Admit(s.now(), 1) == 0 {
		return s.paused(detached, w, log, []proxyclient.SubmitRequest{req})
	}
	var held *railclient.Payment
	if req.Resubmission {
		var err error
		if held, err = s.railHolds(detached, log, req); err != nil {
			return err
		}
	}
	begun := time.Now()
	ctx, cancel := context.WithTimeout(detached, dbTimeout)
	rec, hw, res, err := s.st.writeIntent(ctx, req)
	cancel()
	if err != nil {
		return problem.Wrap(problem.Unavailable, err, "the submission could not be recorded; it was not forwarded")
	}
	switch res {
	case intentFenced:
		if hook := s.afterRefusal.Load(); hook != nil {
			(*hook)()
		}
		return s.fencedOut(detached, log, []proxyclient.SubmitRequest{req}, hw)
	case intentExists:
		return s.duplicate(detached, log, req)
	}

	log.Info("submission intent recorded", "submission_id", rec.ID, "client_ref", rec.ClientRef)
	s.crash(log, CrashAfterIntent)

	select {
	case fr := <-s.startForward(detached, log, rec, nil, begun, held):
		if fr.err != nil {
			return forwardFailed(fr.err)
		}
		httpx.WriteJSON(w, http.StatusOK, fr.rec)
		return nil
	case <-r.Context().Done():
		return problem.New(problem.Unavailable,
			"the rail has not answered yet; the proxy will record the outcome of payout %s (GET /v1/submissions/%s)", rec.PayoutID, rec.PayoutID)
	}
}

// startForward runs forward for a committed intent in a goroutine of its
// own, detached from the caller (the server's shutdown waits for it); with
// sem, at most cap(sem) such calls run at once. begun is when the intent's
// transaction began (forward).
func (s *Server) startForward(ctx context.Context, log *slog.Logger, rec proxyclient.Record, sem chan struct{}, begun time.Time, held *railclient.Payment) <-chan forwardResult {
	done := make(chan forwardResult, 1)
	s.forwards.Add(1)
	s.inflight.Store(rec.PayoutID, struct{}{})
	go func() {
		defer s.forwards.Done()
		defer s.inflight.Delete(rec.PayoutID)
		if sem != nil {
			sem <- struct{}{}
			defer func() { <-sem }()
		}
		done <- s.forward(ctx, log, rec, begun, held)
	}()
	return done
}

// forwardFailed is the answer for a submission forwarded to the rail whose
// outcome could not be recorded.
func forwardFailed(err error) error {
	return problem.Wrap(problem.Unavailable, err,
		"the submission was forwarded to the rail but its outcome could not be recorded; treat it as ambiguous")
}

// fencedOut records and answers a refused submission: reqs is the one
// submission, or every item of a refused batch, held ones included (each
// gets its FENCED row; the refusal is one event, counted once, for the
// first).
func (s *Server) fencedOut(ctx context.Context, log *slog.Logger, reqs []proxyclient.SubmitRequest, refusedBy mark) error {
	req := reqs[0]
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	key := fencing.Key(req.AccountID)
	ev, err := s.st.recordFenced(ctx, reqs, refusedBy, fmt.Sprintf("submission of payout %s refused at the proxy: token %d is not above the account's high-water mark", req.PayoutID, req.Token))
	s.m.fencedOut.Inc()
	s.m.submissions.WithLabelValues(string(proxyclient.OutcomeFenced)).Add(float64(len(reqs)))
	s.m.safetyEvents.WithLabelValues(proxyclient.KindFencedOut).Inc()
	attrs := []any{obs.KeyEvent, proxyclient.KindFencedOut, "stored_token", int64(ev.StoredToken), "stored_holder", string(ev.StoredHolder)}
	if err != nil {
		// The refusal stands; only its evidence row is missing. Say so loudly.
		s.m.evidenceLost.Inc()
		log.Error("fenced_out: submission refused, but its evidence could not be recorded", append(attrs, obs.KeyError, err.Error())...)
	} else {
		log.Warn("fenced_out: stale token refused at the proxy; nothing forwarded", append(attrs, "submission_id", ev.Record.ID)...)
	}
	if ev.Regression {
		s.m.safetyEvents.WithLabelValues(proxyclient.KindTokenRegression).Inc()
		log.Warn("token_regression: the same token was presented by a different holder; a token was re-issued (INV-04)",
			obs.KeyEvent, proxyclient.KindTokenRegression, "stored_token", int64(ev.StoredToken), "stored_holder", string(ev.StoredHolder))
		return problem.Fenced(key, int64(req.Token), int64(ev.StoredToken),
			"token %d for %s was already accepted at the rail proxy from another holder (%s): a token was issued twice (token_regression); the submission was not forwarded", req.Token, key, ev.StoredHolder).
			With(problem.TokenRegressionMember, true)
	}
	return problem.Fenced(key, int64(req.Token), int64(ev.StoredToken),
		"token %d is stale at the rail proxy for %s (high-water %d); the submission was not forwarded", req.Token, key, ev.StoredToken)
}

// countDuplicate counts a duplicate_attempt, recorded or not.
func (s *Server) countDuplicate() {
	s.m.duplicates.Inc()
	s.m.safetyEvents.WithLabelValues(proxyclient.KindDuplicateAttempt).Inc()
}

func (s *Server) duplicate(ctx context.Context, log *slog.Logger, req proxyclient.SubmitRequest) error {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	existing, err := s.st.recordDuplicate(ctx, req)
	s.countDuplicate()
	if err != nil {
		s.m.evidenceLost.Inc()
		log.Error("duplicate_attempt: payout already forwarded; refused, but the evidence could not be recorded",
			obs.KeyEvent, proxyclient.KindDuplicateAttempt, obs.KeyError, err.Error())
		return problem.Wrap(problem.SubmissionExists, err, "payout %s already has a forwarded submission; it was not forwarded again", req.PayoutID)
	}
	log.Error("duplicate_attempt: payout already has a forwarded submission; refused, nothing forwarded",
		obs.KeyEvent, proxyclient.KindDuplicateAttempt, "existing_submission_id", existing.ID,
		"stored_token", int64(existing.FenceToken), "stored_holder", string(existing.Holder), "existing_outcome", outcomeText(existing.Outcome))
	return problem.New(problem.SubmissionExists,
		"payout %s already has a forwarded submission (outcome %s); it was not forwarded again; resolve the payout from the existing record",
		req.PayoutID, outcomeText(existing.Outcome)).With(proxyclient.ExistingExtension, existing)
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) error {
	q, err := wire.Query(r.URL.RawQuery, "all")
	if err != nil {
		return err
	}
	payoutID, err := payoutParam(r)
	if err != nil {
		return err
	}
	all := q.Get("all")
	switch all {
	case "", "false":
	case "true":
		items, err := s.st.all(r.Context(), payoutID)
		if err != nil {
			return err
		}
		httpx.WriteJSON(w, http.StatusOK, proxyclient.RecordPage{Items: items})
		return nil
	default:
		return wire.BadField("all", "must be true or false, got %q", all)
	}
	rec, err := s.st.current(r.Context(), payoutID)
	if errors.Is(err, pgx.ErrNoRows) {
		return problem.New(problem.NotFound, "payout %s has no submission at the proxy: it was never forwarded", payoutID)
	}
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, rec)
	return nil
}

func (s *Server) highFence(w http.ResponseWriter, r *http.Request) error {
	if _, err := wire.Query(r.URL.RawQuery); err != nil {
		return err
	}
	t, err := s.st.highFence(r.Context())
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, proxyclient.HighToken{Token: t})
	return nil
}

func (s *Server) highWater(w http.ResponseWriter, r *http.Request) error {
	q, err := wire.Query(r.URL.RawQuery, "after", "limit")
	if err != nil {
		return err
	}
	limit, err := wire.ParseLimit(q)
	if err != nil {
		return err
	}
	after, err := wire.ParseKeyCursor(q)
	if err != nil {
		return err
	}
	items, err := s.st.highWater(r.Context(), after, limit)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, wire.NewPage(items, limit, func(h proxyclient.HighWater) string { return h.AccountID }))
	return nil
}
