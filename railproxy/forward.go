package railproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/safetylog"
	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/lock/fencing"
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
// held, for a resubmission the rail already holds a payment of
// (railHolds), is recorded from the rail's record instead of being sent.
func (s *Server) forward(ctx context.Context, log *slog.Logger, rec proxyclient.Record, begun time.Time, held *railclient.Payment) forwardResult {
	start := time.Now()
	var outcome proxyclient.Outcome
	var railRef, code, why string
	switch waited := start.Sub(begun); {
	case held != nil:
		outcome, railRef, code, why = s.fromRail(ctx, log, rec, *held)
	case waited > s.cfg.SendWindow:
		outcome, code = proxyclient.OutcomeRejected, proxyclient.ErrorCodeNotForwardedInTime
		why = fmt.Sprintf("not sent: its rail call could not start within %s of its intent (waited %s for a slot)", s.cfg.SendWindow, waited.Round(time.Millisecond))
	default:
		if s.cfg.beforeRailCall != nil {
			s.cfg.beforeRailCall() // tests: the process stalls between the window's check and the call
		}
		// However late the call starts (the process stalled since the
		// check above), it ends by the time a lookup may take the
		// submission as finished: its intent, the send window and the
		// rail timeout (resolvableAge).
		pctx, cancel := context.WithDeadline(ctx, begun.Add(s.resolvableAge()))
		p, err := s.rail.Pay(pctx, railclient.PaymentRequest{
			ClientRef: rec.ClientRef, Amount: rec.Amount, Currency: rec.Currency, BeneficiaryRef: rec.BeneficiaryRef,
		})
		cancel()
		outcome, railRef, code, why = classify(rec, p, err)
		s.m.railLatency.WithLabelValues(string(outcome)).Observe(time.Since(start).Seconds())
		s.railAnswer(log, outcome != proxyclient.OutcomeTimeout)
		s.crash(log, CrashAfterRailAnswer)
	}

	out, rerr := s.recordAnswer(ctx, log, rec, outcome, railRef, code)
	if errors.Is(rerr, pgx.ErrNoRows) {
		// The outcome is already recorded. In the ordinary case it is this
		// very one: an earlier attempt gave up waiting (its timeout) while
		// its group was still being written, and the group wrote it. Only
		// an outcome that differs was written by another writer (the first
		// one stands, write-once): this rail answer is then not recorded.
		wctx, cancel := context.WithTimeout(ctx, dbTimeout)
		now, err := s.st.forwarded(wctx, rec.PayoutID)
		cancel()
		switch {
		case err == nil && now.ID == rec.ID && now.Outcome == outcome && now.RailRef == railRef && now.ErrorCode == code:
			out, rerr = now, nil // ours: counted and logged below
		case err == nil && now.ID == rec.ID:
			s.m.recordFailure.Inc()
			log.Error("the submission's outcome was already recorded by another writer and differs from the rail's answer; the first one stands, this answer is not recorded",
				"outcome", string(outcome), "rail_ref", railRef, "error_code", code,
				"recorded_outcome", outcomeText(now.Outcome), "recorded_rail_ref", now.RailRef, "recorded_error_code", now.ErrorCode)
			return forwardResult{rec: now}
		case err == nil || errors.Is(err, pgx.ErrNoRows):
			s.m.recordFailure.Inc()
			log.Error("the rail's answer could not be recorded: the submission is no longer in proxydb; this line is its only record",
				"submission_id", rec.ID, "outcome", string(outcome), "rail_ref", railRef, "error_code", code)
			return forwardResult{err: fmt.Errorf("submission %d of payout %s is no longer in proxydb", rec.ID, rec.PayoutID)}
		default:
			s.m.recordFailure.Inc()
			log.Error("an outcome is already recorded for the submission, but it could not be read back to tell whether it is the rail's answer (ambiguous)",
				"outcome", string(outcome), "rail_ref", railRef, "error_code", code, obs.KeyError, err.Error())
			return forwardResult{err: fmt.Errorf("the submission's outcome is recorded but could not be read back: %w", err)}
		}
	}
	if rerr != nil {
		s.m.recordFailure.Inc()
		log.Error("the rail's answer could not be recorded; the submission stays without outcome (ambiguous)",
			"outcome", string(outcome), "rail_ref", railRef, "error_code", code, obs.KeyError, rerr.Error())
		return forwardResult{err: rerr}
	}
	s.m.submissions.WithLabelValues(string(outcome)).Inc()
	lvl := slog.LevelInfo
	if outcome == proxyclient.OutcomeTimeout || code == proxyclient.ErrorCodeNotForwardedInTime || held != nil {
		lvl = slog.LevelWarn
	}
	log.Log(ctx, lvl, "submission outcome recorded", "submission_id", out.ID, "outcome", string(outcome),
		"rail_ref", railRef, "error_code", code, "why", why, "rail_ms", time.Since(start).Milliseconds())
	return forwardResult{rec: out}
}

// recordAnswer records the rail's answer to submission rec. Recording is a
// local write with no external effect, and the answer exists nowhere else
// (the rail may not be asked again for it, and a submission left without
// outcome becomes an ambiguity a human or the reconciler must resolve):
// while proxydb is unreachable it is retried for as long as the proxy
// serves, and once the shutdown has begun for closingPatience more, logged
// as an outage of proxydb (obs.Outage: one WARN, a reminder a minute, an
// INFO when it was written after all).
func (s *Server) recordAnswer(ctx context.Context, log *slog.Logger, rec proxyclient.Record, outcome proxyclient.Outcome, railRef, code string) (proxyclient.Record, error) {
	outage := obs.NewOutage(log)
	for wait := 50 * time.Millisecond; ; wait = min(wait*2, 2*time.Second) {
		wctx, cancel := context.WithTimeout(ctx, s.cfg.outcomeAttemptTimeout)
		out, err := s.st.recordOutcome(wctx, rec.ID, outcome, railRef, code)
		cancel()
		if err == nil || errors.Is(err, pgx.ErrNoRows) {
			outage.Recover(ctx, "the rail's answer was recorded after proxydb did not take it", "outcome", string(outcome), "rail_ref", railRef)
			return out, err
		}
		if closing, since := s.closingSince(); closing && time.Since(since) > closingPatience {
			return out, err
		}
		outage.Fail(ctx, "could not record the rail's answer; retrying until proxydb takes it", err, "outcome", string(outcome), "rail_ref", railRef)
		time.Sleep(wait)
	}
}

// closingPatience is how long a rail answer is still retried into proxydb
// once the shutdown has begun (the shutdown waits for it).
const closingPatience = 30 * time.Second

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
	if field, v := unstorable(p); field != "" {
		return proxyclient.OutcomeTimeout, "", "rail_answer_unparseable",
			fmt.Sprintf("the rail's answer could not be read: its %s %+q is not text proxydb can hold (a NUL byte or invalid UTF-8)", field, v)
	}
	if !isPaymentOf(rec, p) {
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

// railHolds asks the rail, before a resubmission's intent is written,
// what it holds for the payout's client reference. The executor resubmits
// a payout it finds RAIL_SUBMITTED when the proxy holds no forwarded
// submission of it (D-4): never forwarded, as long as proxydb keeps every
// row it committed. A proxydb restored from a backup, or failed over to a
// replica behind it, has lost the records of payouts the rail may already
// have paid; sent again, the rail would pay them twice. So:
//   - a payment of the reference at the rail: it is returned, and the
//     submission's outcome is recorded from it instead of sending (forward);
//   - no payment, and the rail's answer final: nil, and the submission is
//     sent as any other;
//   - no answer, or an answer not final: a 503 with "forwarded": false;
//     nothing is recorded or sent, and the payout stays RAIL_SUBMITTED for
//     the executor to submit again later, as while the rail is paused.
//
// The fence is checked first, so that a stale holder is fenced out rather
// than told to come back.
func (s *Server) railHolds(ctx context.Context, log *slog.Logger, req proxyclient.SubmitRequest) (*railclient.Payment, error) {
	cctx, cancel := context.WithTimeout(ctx, dbTimeout)
	hw, fenced, err := s.st.checkFence(cctx, req)
	cancel()
	if err != nil {
		return nil, problem.Wrap(problem.Unavailable, err, "the resubmission's fence could not be checked; it was not recorded or forwarded").
			With(proxyclient.ForwardedExtension, false)
	}
	if fenced {
		return nil, s.fencedOut(ctx, log, []proxyclient.SubmitRequest{req}, hw)
	}
	if _, sending := s.inflight.Load(req.PayoutID); sending {
		// A submission of it whose row proxydb lost (a failover behind
		// it) may still be waiting for a slot or on its way: the rail,
		// which has not seen it yet, would answer "no payment".
		s.m.resubmissionChecks.WithLabelValues("unconfirmed").Inc()
		log.Warn("resubmission not recorded, not forwarded: this proxy is still sending an earlier submission of the payout")
		return nil, problem.New(problem.Unavailable,
			"a resubmission is forwarded only once the rail says it holds no payment of its client reference, and this proxy is still sending an earlier submission of it: it was not recorded and not forwarded (nothing was sent); submit it again later").
			With(proxyclient.ForwardedExtension, false)
	}
	l, err := s.rail.Find(ctx, req.ClientRef)
	if err != nil {
		s.m.resubmissionChecks.WithLabelValues("unconfirmed").Inc()
		log.Warn("resubmission not recorded, not forwarded: the rail could not be asked whether it holds a payment of it", obs.KeyError, err.Error())
		return nil, problem.Wrap(problem.Unavailable, err,
			"a resubmission is forwarded only once the rail says it holds no payment of its client reference, and the rail could not be asked: it was not recorded and not forwarded (nothing was sent); submit it again later").
			With(proxyclient.ForwardedExtension, false)
	}
	held := paymentsOf(log, req.ClientRef, l.Items)
	switch {
	case len(held.settled) > 0:
		s.m.resubmissionChecks.WithLabelValues("held").Inc()
		return &held.settled[0], nil
	case len(held.unknown) > 0:
		// Neither settled nor declined (a status this proxy does not
		// know): money may move yet, so the payout is not sent again and
		// not recorded from it either.
		p := held.unknown[0]
		s.m.resubmissionChecks.WithLabelValues("unconfirmed").Inc()
		log.Warn("resubmission not recorded, not forwarded: the rail holds a payment of its client reference that is neither settled nor declined",
			"rail_ref", p.RailRef, "rail_status", p.Status)
		return nil, problem.New(problem.Unavailable,
			"a resubmission is forwarded only once the rail says it holds no payment of its client reference, and the rail holds payment %+q of it with status %+q, neither settled nor declined: it was not recorded and not forwarded (nothing was sent); submit it again later",
			p.RailRef, p.Status).With(proxyclient.ForwardedExtension, false)
	case held.declined != nil:
		s.m.resubmissionChecks.WithLabelValues("held").Inc()
		return held.declined, nil
	case !l.Final:
		s.m.resubmissionChecks.WithLabelValues("unconfirmed").Inc()
		log.Info("resubmission not recorded, not forwarded: the rail's answer about its client reference is not final yet")
		return nil, problem.New(problem.Unavailable,
			"a resubmission is forwarded only once the rail says it holds no payment of its client reference, and the rail's answer is not final yet (its settlement window): it was not recorded and not forwarded (nothing was sent); submit it again later").
			With(proxyclient.ForwardedExtension, false)
	}
	s.m.resubmissionChecks.WithLabelValues("absent").Inc()
	return nil, nil
}

// railPayments is what the rail's answer holds for one client reference.
type railPayments struct {
	items    []railclient.Payment // the reference's payments (others are no evidence about it)
	settled  []railclient.Payment // those settled
	declined *railclient.Payment  // the first declined, if any
	// unknown are those neither settled nor declined: a status this proxy
	// does not know, so not evidence that no money moved.
	unknown []railclient.Payment
}

// paymentsOf keeps of the rail's answer what concerns clientRef, and logs
// more than one settled payment of it: money moved twice.
func paymentsOf(log *slog.Logger, clientRef string, items []railclient.Payment) railPayments {
	var out railPayments
	for _, p := range items {
		if p.ClientRef != clientRef {
			continue
		}
		out.items = append(out.items, p)
		switch {
		case p.Status == railclient.StatusSettled:
			out.settled = append(out.settled, p)
		case p.Status == railclient.StatusDeclined:
			if out.declined == nil {
				d := p
				out.declined = &d
			}
		default:
			out.unknown = append(out.unknown, p)
		}
	}
	if len(out.settled) > 1 {
		log.Error("the rail holds more than one settled payment for one client reference: money moved twice",
			obs.KeyEvent, "duplicate_payment", "client_ref", clientRef, "settled", len(out.settled))
	}
	return out
}

// fromRail is the outcome of a resubmission the rail already holds a
// payment of (railHolds): the rail's own record, not sent again, and a
// duplicate_attempt safety event as the evidence that proxydb had lost
// the submission. A payment of another amount or currency is TIMEOUT, for
// a human.
func (s *Server) fromRail(ctx context.Context, log *slog.Logger, rec proxyclient.Record, held railclient.Payment) (outcome proxyclient.Outcome, railRef, code, why string) {
	field, bad := unstorable(held)
	switch {
	case field != "":
		outcome, code = proxyclient.OutcomeTimeout, "rail_answer_unparseable"
		why = fmt.Sprintf("not sent: the rail's record of its client reference could not be read: its %s %+q is not text proxydb can hold (a NUL byte or invalid UTF-8)", field, bad)
	case !isPaymentOf(rec, held):
		outcome, code = proxyclient.OutcomeTimeout, "rail_answer_mismatch"
		why = fmt.Sprintf("not sent: the rail holds payment %s of its client reference for %d %s, not %d %s", held.RailRef, held.Amount, held.Currency, rec.Amount, rec.Currency)
	case held.Status == railclient.StatusSettled:
		outcome, railRef, why = proxyclient.OutcomeAcked, held.RailRef, "not sent: the rail already holds a settled payment of its client reference"
	default:
		outcome, railRef, code = proxyclient.OutcomeRejected, held.RailRef, held.DeclineCode
		if code == "" {
			code = "declined"
		}
		why = "not sent: the rail already declined a payment of its client reference"
	}
	// The rail's reference goes into the event as one line proxydb can
	// hold: refused, the evidence would be lost.
	detail := fmt.Sprintf("payout %s was resubmitted with no forwarded submission in proxydb, but the rail already holds payment %s (%s) of client reference %s: proxydb has lost the record of its submission (restored from a backup, or failed over to a replica behind it?); not sent again",
		rec.PayoutID, wire.OneLine(held.RailRef, wire.MaxRefLen), held.Status, rec.ClientRef)
	wctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	err := s.st.recordEvents(wctx, safetylog.Event{Kind: proxyclient.KindDuplicateAttempt, Key: fencing.Key(rec.AccountID),
		Presented: rec.FenceToken, Holder: rec.Holder, PayoutID: rec.PayoutID, Detail: detail})
	s.countDuplicate()
	if err != nil {
		s.m.evidenceLost.Inc()
		log.Error("duplicate_attempt: the rail already holds the resubmitted payout; not sent again, but the evidence could not be recorded",
			obs.KeyEvent, proxyclient.KindDuplicateAttempt, "rail_ref", held.RailRef, obs.KeyError, err.Error())
	} else {
		log.Error("duplicate_attempt: the rail already holds the resubmitted payout, which proxydb had no record of; not sent again",
			obs.KeyEvent, proxyclient.KindDuplicateAttempt, "rail_ref", held.RailRef, "rail_status", string(held.Status), "client_ref", rec.ClientRef)
	}
	return outcome, railRef, code, why
}

// isPaymentOf reports whether the rail's payment p is the one submission
// rec asked for: its client reference, amount and currency. Only such a
// payment is the submission's outcome (classify, fromRail) or settles it
// (lookup); any other is an answer about another payment, for a human.
func isPaymentOf(rec proxyclient.Record, p railclient.Payment) bool {
	return p.ClientRef == rec.ClientRef && p.Amount == rec.Amount && p.Currency == rec.Currency
}

// unstorable names the first text field of the rail's payment p that
// proxydb cannot hold, with its value: PostgreSQL text takes no NUL byte
// and no invalid UTF-8 (internal/wire). Such an answer is unreadable
// (rail_answer_unparseable), as a body that cannot be parsed: recorded as
// it is, its group's outcome statement would fail, and with it the
// outcomes of every other submission written in that group.
func unstorable(p railclient.Payment) (field, value string) {
	for _, f := range []struct{ name, v string }{
		{"rail_ref", p.RailRef}, {"decline_code", p.DeclineCode}, {"client_ref", p.ClientRef},
		{"currency", p.Currency}, {"status", p.Status}, {"beneficiary_ref", p.BeneficiaryRef}, {"at", p.At},
	} {
		if strings.IndexByte(f.v, 0) >= 0 || !utf8.ValidString(f.v) {
			return f.name, f.v
		}
	}
	return "", ""
}
