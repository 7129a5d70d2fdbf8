package railproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

type forwardResult struct {
	rec proxyclient.Record
	err error
}

// forward makes the submission's one rail call and records its outcome.
// It runs detached from the caller and is never retried. begun is when the
// transaction that wrote the intent began, on this process's clock: a
// submission whose turn comes later than the send window after it (its
// batch's other calls took the slots meanwhile) is not sent, and is
// recorded REJECTED with error code not_forwarded_in_time. A lookup takes a
// submission without outcome as finished once it is older than the send
// window and the rail timeout together (resolvableAge); a rail call begun
// later could still pay after a lookup had recorded it ABSENT.
func (s *Server) forward(ctx context.Context, log *slog.Logger, rec proxyclient.Record, begun time.Time) forwardResult {
	start := time.Now()
	var outcome proxyclient.Outcome
	var railRef, code, why string
	if waited := start.Sub(begun); waited > s.cfg.SendWindow {
		outcome, code = proxyclient.OutcomeRejected, proxyclient.ErrorCodeNotForwardedInTime
		why = fmt.Sprintf("not sent: its rail call could not start within %s of its intent (waited %s for a slot)", s.cfg.SendWindow, waited.Round(time.Millisecond))
	} else {
		p, err := s.rail.Pay(ctx, railclient.PaymentRequest{
			ClientRef: rec.ClientRef, Amount: rec.Amount, Currency: rec.Currency, BeneficiaryRef: rec.BeneficiaryRef,
		})
		outcome, railRef, code, why = classify(rec, p, err)
		s.m.railLatency.WithLabelValues(string(outcome)).Observe(time.Since(start).Seconds())
		s.railAnswer(log, outcome != proxyclient.OutcomeTimeout)
		s.crash(log, CrashAfterRailAnswer)
	}

	// Recording is a local write with no external effect: safe to retry.
	var (
		out  proxyclient.Record
		rerr error
	)
	deadline := time.Now().Add(30 * time.Second)
	for wait := 50 * time.Millisecond; ; wait = min(wait*2, 2*time.Second) {
		wctx, cancel := context.WithTimeout(ctx, dbTimeout)
		out, rerr = s.st.recordOutcome(wctx, rec.ID, outcome, railRef, code)
		cancel()
		if rerr == nil || errors.Is(rerr, pgx.ErrNoRows) || time.Now().After(deadline) {
			break
		}
		log.Warn("could not record the rail's answer; retrying", obs.KeyError, rerr.Error())
		time.Sleep(wait)
	}
	if errors.Is(rerr, pgx.ErrNoRows) {
		// Cannot happen while this is the only writer of outcomes; if it
		// does, the first recorded outcome stands (write-once) and is returned.
		log.Error("the submission's outcome was already recorded by another writer; the first one stands",
			"outcome", string(outcome), "rail_ref", railRef)
		wctx, cancel := context.WithTimeout(ctx, dbTimeout)
		out, rerr = s.st.forwarded(wctx, rec.PayoutID)
		cancel()
		return forwardResult{rec: out, err: rerr}
	}
	if rerr != nil {
		s.m.recordFailure.Inc()
		log.Error("the rail's answer could not be recorded; the submission stays without outcome (ambiguous)",
			"outcome", string(outcome), "rail_ref", railRef, "error_code", code, obs.KeyError, rerr.Error())
		return forwardResult{err: rerr}
	}
	s.m.submissions.WithLabelValues(string(outcome)).Inc()
	lvl := slog.LevelInfo
	if outcome == proxyclient.OutcomeTimeout || code == proxyclient.ErrorCodeNotForwardedInTime {
		lvl = slog.LevelWarn
	}
	log.Log(ctx, lvl, "submission outcome recorded", "submission_id", out.ID, "outcome", string(outcome),
		"rail_ref", railRef, "error_code", code, "why", why, "rail_ms", time.Since(start).Milliseconds())
	return forwardResult{rec: out}
}

// classify maps the rail's answer to an outcome. Only a well-formed answer
// about this very payment is ACKED or REJECTED; everything else — no
// answer, a 5xx, any other error status, a body that cannot be read or does
// not match what was sent — is TIMEOUT: money may have moved.
func classify(rec proxyclient.Record, p railclient.Payment, err error) (outcome proxyclient.Outcome, railRef, code, why string) {
	var pe *problem.Error
	switch {
	case err == nil:
	case errors.As(err, &pe):
		return proxyclient.OutcomeTimeout, "", "rail_http_" + strconv.Itoa(pe.Status()),
			fmt.Sprintf("the rail answered HTTP %d (%s): whether it paid is unknown", pe.Status(), pe.Code)
	case errors.Is(err, context.DeadlineExceeded):
		return proxyclient.OutcomeTimeout, "", "rail_timeout", "the rail did not answer in time"
	case errors.Is(err, httpx.ErrTransport):
		return proxyclient.OutcomeTimeout, "", "rail_connection_failed", "no answer from the rail: " + err.Error()
	default:
		return proxyclient.OutcomeTimeout, "", "rail_answer_unparseable", "the rail's answer could not be read: " + err.Error()
	}
	if p.ClientRef != rec.ClientRef || p.Amount != rec.Amount || p.Currency != rec.Currency {
		return proxyclient.OutcomeTimeout, "", "rail_answer_mismatch",
			fmt.Sprintf("the rail answered about another payment (client_ref %q, amount %d %s)", p.ClientRef, p.Amount, p.Currency)
	}
	switch {
	case p.Status == railclient.StatusSettled && p.RailRef != "":
		return proxyclient.OutcomeAcked, p.RailRef, "", "the rail took the payment"
	case p.Status == railclient.StatusDeclined:
		code := p.DeclineCode
		if code == "" {
			code = "declined"
		}
		return proxyclient.OutcomeRejected, p.RailRef, code, "the rail declined the payment"
	default:
		return proxyclient.OutcomeTimeout, "", "rail_answer_unparseable",
			fmt.Sprintf("the rail answered with status %q and rail_ref %q", p.Status, p.RailRef)
	}
}
