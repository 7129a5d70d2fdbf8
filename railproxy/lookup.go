package railproxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

type evidence struct {
	Source    string                    `json:"source"`
	ClientRef string                    `json:"client_ref"`
	Final     bool                      `json:"final"`
	Items     []proxyclient.RailPayment `json:"items"`
	AskedAt   time.Time                 `json:"asked_at"`
}

func (s *Server) lookup(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	payoutID, err := payoutParam(r)
	if err != nil {
		return err
	}
	if err := httpx.DecodeEmpty(r); err != nil {
		return err
	}
	log := httpx.Log(ctx).With(obs.KeyPayoutID, payoutID)
	rec, err := s.st.forwarded(ctx, payoutID)
	if errors.Is(err, pgx.ErrNoRows) {
		return problem.New(problem.NotFound, "payout %s has no forwarded submission: nothing can have reached the rail", payoutID)
	}
	if err != nil {
		return err
	}
	if rec.Resolution != proxyclient.ResolutionNone {
		var ev evidence
		_ = json.Unmarshal(rec.ResolutionEvidence, &ev)
		httpx.WriteJSON(w, http.StatusOK, proxyclient.LookupResult{
			Final: true, Resolution: rec.Resolution, RailItems: nonNil(ev.Items), Submission: rec,
			Detail: "already resolved; the recorded evidence is returned",
		})
		return nil
	}
	// In flight first: evidence gathered while this proxy's own rail call
	// runs says nothing about that call, so the rail is not even asked.
	if _, running := s.inflight.Load(payoutID); running {
		httpx.WriteJSON(w, http.StatusOK, proxyclient.LookupResult{
			RailItems: []proxyclient.RailPayment{}, Submission: rec,
			Detail: "the rail call of this submission is still running; the rail was not asked and nothing recorded",
		})
		return nil
	}
	// A submission without outcome is judged only once older than its send
	// window and rail call together, and that before the rail is asked:
	// evidence gathered earlier could predate a call still to come.
	if rec.Outcome == proxyclient.OutcomeNone {
		old, err := s.st.olderThan(ctx, rec.ID, s.resolvableAge())
		if err != nil {
			return problem.Wrap(problem.Unavailable, err, "could not read the submission's age; nothing recorded")
		}
		if !old {
			httpx.WriteJSON(w, http.StatusOK, proxyclient.LookupResult{
				RailItems: []proxyclient.RailPayment{}, Submission: rec, Detail: s.tooYoung(false),
			})
			return nil
		}
	}
	l, err := s.rail.Find(ctx, rec.ClientRef)
	if err != nil {
		return problem.Wrap(problem.Unavailable, err, "could not ask the rail about client reference %s; nothing recorded", rec.ClientRef)
	}
	ev := evidence{Source: "rail_lookup", ClientRef: rec.ClientRef, Final: l.Final, Items: []proxyclient.RailPayment{}, AskedAt: time.Now().UTC()}
	held := paymentsOf(log, rec.ClientRef, l.Items)
	for _, p := range held.items {
		ev.Items = append(ev.Items, proxyclient.RailPayment(p))
	}
	out := proxyclient.LookupResult{Final: l.Final, RailItems: ev.Items, Submission: rec}
	if !l.Final {
		out.Detail = "the rail's answer is not final yet (its settlement window has not passed); nothing recorded"
		httpx.WriteJSON(w, http.StatusOK, out)
		return nil
	}
	// Only a settled payment of the submission's own amount and currency
	// settles it (the match classify and fromRail hold the rail's answer
	// to). A settled payment of the client reference for another amount
	// or currency moved money, but not this submission's: SETTLED would
	// post the payout at its own amount, ABSENT would release money the
	// rail moved. Neither is recorded; a human decides.
	if other := othersSettled(rec, held.settled); len(other) > 0 {
		p := other[0]
		out.Detail = fmt.Sprintf("the rail settled payment %+q of client reference %s for %d %s, not the submission's %d %s (%d settled payment(s) of another amount or currency): not resolved, nothing recorded; resolve it by hand",
			p.RailRef, rec.ClientRef, p.Amount, p.Currency, rec.Amount, rec.Currency, len(other))
		log.Error("the rail settled a payment of the submission's client reference for another amount or currency; not resolved, left for a human",
			"client_ref", rec.ClientRef, "rail_ref", p.RailRef, "rail_amount", p.Amount, "rail_currency", p.Currency,
			"amount", rec.Amount, "currency", rec.Currency, "outcome", outcomeText(rec.Outcome), "mismatched", len(other))
		httpx.WriteJSON(w, http.StatusOK, out)
		return nil
	}
	// A payment neither settled nor declined (a status this proxy does
	// not know) may move money yet: without a settled one it is no
	// evidence for either resolution.
	if len(held.settled) == 0 && len(held.unknown) > 0 {
		p := held.unknown[0]
		out.Detail = fmt.Sprintf("the rail holds payment %+q of client reference %s with status %+q, neither settled nor declined: not resolved, nothing recorded; ask again later, or resolve it by hand",
			p.RailRef, rec.ClientRef, p.Status)
		log.Warn("the rail holds a payment of the submission's client reference that is neither settled nor declined; not resolved",
			"client_ref", rec.ClientRef, "rail_ref", p.RailRef, "rail_status", p.Status, "outcome", outcomeText(rec.Outcome))
		httpx.WriteJSON(w, http.StatusOK, out)
		return nil
	}
	out.Resolution = proxyclient.ResolutionAbsent
	if len(held.settled) > 0 {
		out.Resolution = proxyclient.ResolutionSettled
	}
	if !rec.Outcome.Ambiguous() {
		out.Detail = fmt.Sprintf("the outcome %s is not ambiguous; nothing recorded", rec.Outcome)
		httpx.WriteJSON(w, http.StatusOK, out)
		return nil
	}
	raw, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
	defer cancel()
	// Recorded only if the outcome is still the one read before the rail was
	// asked: a forward that finished meanwhile makes this evidence stale.
	updated, ok, err := s.st.recordResolution(wctx, rec.ID, rec.Outcome, out.Resolution, raw, s.resolvableAge())
	if err != nil {
		return problem.Wrap(problem.Unavailable, err, "could not record the resolution")
	}
	if ok {
		out.Recorded, out.Submission = true, updated
		s.m.resolutions.WithLabelValues(string(out.Resolution)).Inc()
		log.Info("ambiguous submission resolved from rail evidence", "resolution", string(out.Resolution),
			"outcome", outcomeText(rec.Outcome), "client_ref", rec.ClientRef, "rail_items", len(ev.Items))
		httpx.WriteJSON(w, http.StatusOK, out)
		return nil
	}
	// Not written: resolved concurrently, or the outcome recorded meanwhile
	// (the age was checked before the rail was asked; only a clock that
	// went back could fail it here).
	now, err := s.st.forwarded(wctx, payoutID)
	if err != nil {
		return err
	}
	out.Submission = now
	switch {
	case now.Resolution != proxyclient.ResolutionNone:
		out.Resolution = now.Resolution
		out.Detail = "resolved concurrently by another lookup; the recorded resolution is returned"
	case now.Outcome != rec.Outcome:
		out.Final, out.Resolution = false, proxyclient.ResolutionNone
		out.Detail = fmt.Sprintf("the outcome changed from %s to %s while the rail was asked: that evidence may predate the rail call; nothing recorded, ask again",
			outcomeText(rec.Outcome), outcomeText(now.Outcome))
	default:
		out.Final, out.Resolution = false, proxyclient.ResolutionNone
		out.Detail = s.tooYoung(true)
	}
	httpx.WriteJSON(w, http.StatusOK, out)
	return nil
}

func nonNil(p []proxyclient.RailPayment) []proxyclient.RailPayment {
	if p == nil {
		return []proxyclient.RailPayment{}
	}
	return p
}

// tooYoung is a lookup's answer for a submission without outcome that may
// still be forwarded; asked: the rail was asked before that was known.
func (s *Server) tooYoung(asked bool) string {
	what := "the rail was not asked and nothing recorded"
	if asked {
		what = "nothing recorded"
	}
	return fmt.Sprintf("the submission has no outcome and is younger than %s (its send window and the rail timeout): its forwarding may still be under way; %s", s.resolvableAge(), what)
}

// othersSettled are the settled payments that are not the payment rec
// asked for (isPaymentOf): of another amount or currency.
func othersSettled(rec proxyclient.Record, settled []railclient.Payment) []railclient.Payment {
	var out []railclient.Payment
	for _, p := range settled {
		if !isPaymentOf(rec, p) {
			out = append(out, p)
		}
	}
	return out
}
