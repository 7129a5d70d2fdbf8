package executor

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/wire"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// unknownSubmitWait bounds how long the proxy's record is polled after a
// submission got no usable answer, waiting for the rail's outcome.
const unknownSubmitWait = 10 * time.Second

// submitted handles a RAIL_SUBMITTED payout (D-4): ask the proxy first.
// No forwarded submission -> submit now; a recorded outcome -> apply it;
// no outcome or TIMEOUT -> RAIL_AMBIGUOUS. Never resubmit a forwarded one.
func (r *run) submitted(p pc.Payout) (pc.Payout, error) {
	rec, found, err := r.lookup(p)
	if err != nil {
		return p, err
	}
	if !found {
		return r.resubmit(p)
	}
	r.log.Info("the proxy already holds the payout's submission; applying its outcome",
		obs.KeyPayoutID, p.ID, "outcome", outcomeText(rec.Outcome), "submission_token", int64(rec.FenceToken))
	return r.apply(p, rec)
}

// lookup asks the proxy for the payout's forwarded submission. found is
// false when there is none (404, or only FENCED attempts).
func (r *run) lookup(p pc.Payout) (proxyclient.Record, bool, error) {
	ctx, cancel := r.e.callCtx()
	defer cancel()
	start := time.Now()
	rec, err := r.e.proxy.Get(ctx, p.ID)
	r.e.m.stepLatency.WithLabelValues("lookup").Observe(time.Since(start).Seconds())
	switch {
	case err == nil && rec.Forwarded():
		r.heard("proxy", "lookup")
		r.e.m.steps.WithLabelValues("lookup", resultOK).Inc()
		return rec, true, nil
	case err == nil || problem.Has(err, problem.NotFound):
		r.heard("proxy", "lookup")
		r.e.m.steps.WithLabelValues("lookup", resultOK).Inc()
		return proxyclient.Record{}, false, nil
	default:
		// As any other call to a guard: a refused token stops the executor
		// (exit 2), a request the proxy will never answer leaves the
		// account, anything else is retried.
		return proxyclient.Record{}, false, r.failed("lookup", "proxy", p, err)
	}
}

// submit makes the payout's one submission. It is never retried: an
// unclear answer is settled from the proxy's record.
func (r *run) submit(p pc.Payout) (pc.Payout, error) {
	rec, err := r.send(p, false)
	return r.answered(p, rec, err, r.apply)
}

// resubmit submits a payout an earlier holder marked RAIL_SUBMITTED and
// the proxy holds no forwarded submission of (D-4). It is marked as such:
// the proxy sends it only once the rail says it holds no payment of it,
// which a proxydb that lost rows (restored from a backup) would otherwise
// have the rail pay twice.
// A 503 with "forwarded": false says the rail could not yet confirm that
// (or is paused): nothing was recorded or sent, the payout stays
// RAIL_SUBMITTED for a later pass, and the executor's rail pause is not
// fed (a rail whose answer is not final yet is answering).
func (r *run) resubmit(p pc.Payout) (pc.Payout, error) {
	rec, err := r.send(p, true)
	if proxyclient.PausedUnforwarded(err) {
		r.e.m.steps.WithLabelValues("submit", resultTransient).Inc()
		r.log.Info("the proxy recorded and sent nothing: it forwards a resubmission only once the rail says it holds no payment of it, and the rail could not say so yet (or is paused); the payout stays RAIL_SUBMITTED for a later pass",
			obs.KeyPayoutID, p.ID, obs.KeyError, err.Error())
		return p, errLeave
	}
	return r.answered(p, rec, err, r.apply)
}

// submission is what the proxy is asked to forward for p.
func submission(p pc.Payout) proxyclient.Submission {
	clientRef := p.ClientRef
	if clientRef == "" {
		clientRef = pc.ClientRef(p.ID)
	}
	return proxyclient.Submission{
		PayoutID: p.ID, AccountID: p.AccountID, ClientRef: clientRef,
		Amount: p.Amount, Currency: p.Currency, BeneficiaryRef: p.BeneficiaryRef,
	}
}

// send is the proxy call of the payout's one submission; it only checks the
// grant, calls and times, so several may run at once under one grant
// (sendEach). The grant is checked here, right before the call, because
// every path to it makes a call first (the lookup of a resubmission, the
// batch refused for its input) that can outlive the grant or put its
// session in jeopardy (D-11): nothing is then sent, and the payout stays
// RAIL_SUBMITTED for the next holder to settle (D-4).
func (r *run) send(p pc.Payout, resubmission bool) (proxyclient.Record, error) {
	if err := r.check(); err != nil {
		return proxyclient.Record{}, err
	}
	sub := submission(p)
	sub.Resubmission = resubmission
	// The proxy waits for the rail: --proxy-timeout, not --call-timeout;
	// and a stop gives up on it after --shutdown-grace.
	ctx, cancel := r.e.proxyCtx(p.ID)
	defer cancel()
	start := time.Now()
	rec, err := r.e.proxy.Submit(ctx, sub, r.g.Token(), r.g.Holder())
	r.e.m.stepLatency.WithLabelValues("submit").Observe(time.Since(start).Seconds())
	return rec, err
}

// sendBatch is the proxy call submitting ps together (sendAll). An answer
// with another number of items than ps is an error of the call: which were
// forwarded is unknown.
func (r *run) sendBatch(ps []pc.Payout) ([]proxyclient.BatchResult, error) {
	items := make([]proxyclient.BatchItem, len(ps))
	for i, p := range ps {
		sub := submission(p)
		items[i] = proxyclient.BatchItem{PayoutID: sub.PayoutID, ClientRef: sub.ClientRef,
			Amount: sub.Amount, Currency: sub.Currency, BeneficiaryRef: sub.BeneficiaryRef}
	}
	ids := make([]string, len(ps))
	for i, p := range ps {
		ids[i] = p.ID
	}
	ctx, cancel := r.e.proxyCtx(ids...)
	defer cancel()
	start := time.Now()
	res, err := r.e.proxy.SubmitBatch(ctx, r.account, r.g.Token(), r.g.Holder(), items)
	r.e.m.stepLatency.WithLabelValues("submit_batch").Observe(time.Since(start).Seconds())
	if err == nil && len(res) != len(ps) {
		r.log.Error("the proxy answered a batch submission with the wrong number of items; asking it about each payout",
			"items", len(ps), "answers", len(res))
		return nil, fmt.Errorf("the proxy answered %d items for %d payouts", len(res), len(ps))
	}
	return res, err
}

// unforwarded leaves a payout whose submission the proxy neither recorded
// nor forwarded (PausedUnforwarded): the proxy has paused forwarding while
// the rail gives no usable answer, or is shutting down. The payout stays
// RAIL_SUBMITTED; a later pass asks the proxy first (D-4), then submits it
// again. feed: the answer counts toward the executor's rail pause (a
// batch counts its unforwarded items once, sendAll).
func (r *run) unforwarded(log *slog.Logger, p pc.Payout, err error, feed bool) (pc.Payout, error) {
	r.e.m.steps.WithLabelValues("submit", resultTransient).Inc()
	if proxyclient.ShuttingDown(err) {
		// A proxy going away says nothing of the rail.
		log.Info("the proxy is shutting down: the payout stays RAIL_SUBMITTED for a later pass (nothing was sent)", obs.KeyError, err.Error())
		return p, errLeave
	}
	log.Info("the proxy forwards nothing while the rail gives no usable answer: the payout stays RAIL_SUBMITTED for a later pass (nothing was sent)",
		obs.KeyError, err.Error())
	if feed {
		r.e.railAnswer(log, false)
	}
	return p, errLeave
}

// railAnswered reports whether rec is the rail's own answer (ACKED or
// REJECTED by the rail, not refused unsent by the proxy).
func railAnswered(rec proxyclient.Record) bool {
	return rec.ErrorCode != proxyclient.ErrorCodeNotForwardedInTime &&
		(rec.Outcome == proxyclient.OutcomeAcked || rec.Outcome == proxyclient.OutcomeRejected)
}

// answered acts on the proxy's answer to the payout's submission (the
// table of docs/executor.md). A record whose outcome is to be reported goes
// to report: r.apply reports it at once, a batch collects it.
func (r *run) answered(p pc.Payout, rec proxyclient.Record, err error, report func(pc.Payout, proxyclient.Record) (pc.Payout, error)) (pc.Payout, error) {
	log := r.log.With("step", "submit", obs.KeyPayoutID, p.ID)
	switch {
	case notSent(err):
		return p, err
	case err == nil:
		r.heard("proxy", "submit")
		r.e.m.steps.WithLabelValues("submit", resultOK).Inc()
		log.Debug("the proxy answered", "outcome", outcomeText(rec.Outcome), "rail_ref", rec.RailRef, "error_code", rec.ErrorCode)
		switch {
		case rec.ErrorCode == proxyclient.ErrorCodeNotForwardedInTime:
			// Not sent: it says nothing of the rail.
		case railAnswered(rec):
			r.e.railAnswer(log, true)
		case rec.Outcome == proxyclient.OutcomeTimeout:
			r.e.railAnswer(log, false)
		}
		r.hook(AfterSubmitted, p)
		return report(p, rec)
	case problem.Has(err, problem.SubmissionExists):
		// Someone forwarded it already: resolve from that record, never resend.
		r.e.m.steps.WithLabelValues("submit", resultExists).Inc()
		existing, ok := proxyclient.ExistingRecord(err)
		if !ok {
			found := false
			existing, found, err = r.lookup(p)
			if err != nil {
				return p, err
			}
			if !found {
				log.Error("the proxy said the submission exists but shows none; leaving the payout")
				return p, errLeave
			}
		}
		log.Warn("the proxy already forwarded this payout; resolving from the existing record",
			"outcome", outcomeText(existing.Outcome), "submission_token", int64(existing.FenceToken))
		return report(p, existing)
	case problem.Has(err, problem.FencedOut):
		return p, r.failed("submit", "proxy", p, err)
	case proxyclient.RefusedUnforwarded(err):
		r.e.m.steps.WithLabelValues("submit", resultRejected).Inc()
		return r.refused(p, err)
	case proxyclient.PausedUnforwarded(err):
		return r.unforwarded(log, p, err, true)
	}
	if !noUsableAnswer(err) {
		return p, r.failed("submit", "proxy", p, err)
	}
	// No usable answer: the submission may or may not have been forwarded.
	// Ask, never resend.
	r.e.m.steps.WithLabelValues("submit", resultTransient).Inc()
	log.Warn("the submission got no usable answer; asking the proxy what happened (never resent)", obs.KeyError, err.Error())
	r.e.railAnswer(log, false)
	return r.afterUnknownSubmit(p)
}

// noUsableAnswer reports whether err, a submission's error, leaves unknown
// whether it was forwarded: no answer, a timeout, a 5xx or unavailable —
// not a refusal the proxy explains (fenced out, exists, refused or paused
// unforwarded, or another 4xx).
func noUsableAnswer(err error) bool {
	if err == nil || notSent(err) || problem.Has(err, problem.SubmissionExists) || problem.Has(err, problem.FencedOut) ||
		proxyclient.RefusedUnforwarded(err) || proxyclient.PausedUnforwarded(err) {
		return false
	}
	return problem.NoVerdict(err)
}

// notSent reports whether err is send's own refusal to call: the grant can
// no longer be used, or a stop was requested.
func notSent(err error) bool { return errors.Is(err, errGrantLost) || errors.Is(err, errStop) }

// refused ends a payout whose submission the proxy refused without
// forwarding it (invalid input it will never accept): retrying cannot
// succeed, and left RAIL_SUBMITTED the payout would hold its money and
// stop its account for ever. Only once the proxy confirms it holds no
// forwarded submission (D-4) is the payout ended: RAIL_SUBMITTED -> FAILED
// (rail_refused) under this grant, its held amount released.
func (r *run) refused(p pc.Payout, refusal error) (pc.Payout, error) {
	var pe *problem.Error
	errors.As(refusal, &pe)
	code := "invalid_request"
	var field string
	if pe.Extension("field", &field) && field != "" {
		code += ":" + field
	}
	code = wire.OneLine(code, wire.MaxRefLen)
	// The proxy's words, as one line the payment resource takes: refused,
	// the payout would stay RAIL_SUBMITTED, its money held.
	evidence := wire.OneLine("proxy 400 forwarded=false: "+pe.Message, wire.MaxTextLen)
	log := r.log.With("step", "refuse", obs.KeyPayoutID, p.ID, "error_code", code)
	rec, found, err := r.lookup(p)
	if err != nil {
		return p, err
	}
	if found {
		// Forwarded after all (an earlier attempt): its outcome decides.
		log.Warn("the proxy refused the submission but holds a forwarded one; applying its outcome", "outcome", outcomeText(rec.Outcome))
		return r.apply(p, rec)
	}
	if err := r.check(); err != nil {
		return p, err
	}
	log.Error("the proxy refused the submission without forwarding it; ending the payout (FAILED, rail_refused, money released)", "evidence", evidence)
	return r.mutate("refuse", p, AfterOutcome, func() (pc.Payout, error) {
		ctx, cancel := r.e.callCtx()
		defer cancel()
		return r.e.pay.Refuse(ctx, p.ID, r.g.Token(), r.g.Holder(), code, evidence)
	})
}

// afterUnknownSubmit settles an unclear submission from the proxy's record,
// waiting a while for the rail's outcome to be recorded.
func (r *run) afterUnknownSubmit(p pc.Payout) (pc.Payout, error) {
	return r.settleUnknown(p, time.Now().Add(unknownSubmitWait), r.apply)
}

// settleUnknown settles an unclear submission from the proxy's record,
// asking until deadline for the rail's outcome to be recorded; the record
// goes to report (r.apply, or a batch's collection of outcomes). A stop
// request ends the wait.
func (r *run) settleUnknown(p pc.Payout, deadline time.Time, report func(pc.Payout, proxyclient.Record) (pc.Payout, error)) (pc.Payout, error) {
	bo := backoff{min: 100 * time.Millisecond, max: 2 * time.Second}
	for {
		if r.e.stopRequested() {
			return p, errStop
		}
		rec, found, err := r.lookup(p)
		switch {
		case err == nil && found && rec.Outcome != proxyclient.OutcomeNone:
			return report(p, rec)
		case err == nil && found && time.Now().After(deadline):
			// Forwarded, no outcome recorded: as ambiguous as a timeout.
			return report(p, rec)
		case err == nil && !found && time.Now().After(deadline):
			// Intent is written before forwarding: no record, not forwarded.
			// The payout stays RAIL_SUBMITTED; the next pass applies D-4.
			r.log.Warn("the proxy has no forwarded submission for the payout: it was not sent; leaving it RAIL_SUBMITTED for the next pass",
				obs.KeyPayoutID, p.ID)
			return p, errLeave
		case err != nil && !errors.Is(err, errTransient):
			return p, err
		case err != nil && time.Now().After(deadline):
			return p, errLeave
		}
		if !r.e.sleep(bo.next()) {
			return p, errStop
		}
	}
}

// apply reports a forwarded submission's outcome to the payment resource:
// ACKED -> RAIL_ACKED, REJECTED -> FAILED, anything else -> RAIL_AMBIGUOUS.
func (r *run) apply(p pc.Payout, rec proxyclient.Record) (pc.Payout, error) {
	if err := r.check(); err != nil {
		return p, err
	}
	it := r.outcomeItem(p, rec)
	return r.mutate("outcome", p, AfterOutcome, func() (pc.Payout, error) {
		ctx, cancel := r.e.callCtx()
		defer cancel()
		return r.e.pay.ReportOutcome(ctx, p.ID, r.g.Token(), r.g.Holder(), it.Outcome, it.RailRef, it.ErrorCode)
	})
}

// outcomeItem is what a forwarded submission's record reports for the
// payout. A record that does not match the payout is never trusted either
// way: it is reported as ambiguous, for a human.
func (r *run) outcomeItem(p pc.Payout, rec proxyclient.Record) pc.StepItem {
	outcome, railRef, code := pc.OutcomeTimeout, "", rec.ErrorCode
	switch rec.Outcome {
	case proxyclient.OutcomeAcked:
		outcome, railRef = pc.OutcomeAcked, rec.RailRef
	case proxyclient.OutcomeRejected:
		outcome, railRef = pc.OutcomeRejected, rec.RailRef
	case proxyclient.OutcomeNone:
		code = "no_recorded_outcome"
	}
	if !rec.IsOf(p.ID, p.Amount, p.Currency, p.ClientRef) {
		r.log.Error("the proxy's submission does not match the payout; recording it as ambiguous for a human",
			obs.KeyPayoutID, p.ID, "submission_payout", rec.PayoutID, "submission_amount", rec.Amount, "submission_client_ref", rec.ClientRef)
		outcome, railRef, code = pc.OutcomeTimeout, "", "submission_mismatch"
	}
	// The rail's reference and decline code are the rail's text, kept as
	// it sent them in the proxy's record: the payment resource takes one
	// line of at most wire.MaxRefLen bytes, and refusing this report would
	// hold the payout's money, and its account, for ever.
	railRef, code = wire.OneLine(railRef, wire.MaxRefLen), wire.OneLine(code, wire.MaxRefLen)
	if railRef == "" && outcome == pc.OutcomeAcked {
		railRef = fmt.Sprintf("none given (proxy submission %d)", rec.ID)
	}
	if code == "" && outcome == pc.OutcomeTimeout {
		code = "rail_timeout"
	}
	return pc.StepItem{PayoutID: p.ID, Outcome: outcome, RailRef: railRef, ErrorCode: code}
}

func outcomeText(o proxyclient.Outcome) string {
	if o == proxyclient.OutcomeNone {
		return "none"
	}
	return string(o)
}
