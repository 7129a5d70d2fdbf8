package reconcile

import (
	"context"
	"fmt"

	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// ---- one payout across paydb, the proxy and the rail (INV-02, INV-03, INV-07) ----

type payoutView struct {
	first   pc.Payout // read before the proxy and the rail
	last    pc.Payout // read after them
	subs    []proxyclient.Record
	payment []railclient.Payment
}

func (v payoutView) forwarded() []proxyclient.Record {
	var out []proxyclient.Record
	for _, s := range v.subs {
		if s.Forwarded() {
			out = append(out, s)
		}
	}
	return out
}

func (v payoutView) settled() []railclient.Payment {
	var out []railclient.Payment
	for _, p := range v.payment {
		if p.Status == railclient.StatusSettled {
			out = append(out, p)
		}
	}
	return out
}

func railRefs(ps []railclient.Payment) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.RailRef)
	}
	return out
}

type candidate struct {
	check    string
	objects  map[string]any
	evidence string
}

// evaluate applies the cross-service rules to one view. Rules about a
// terminal state use the first read (a terminal payout no longer changes,
// and everything it implies happened before it); rules of the form "the
// proxy or rail shows X, so the payout must be past Y" use the last read.
func evaluate(v payoutView) []candidate {
	var out []candidate
	p := v.last
	add := func(check string, extra map[string]any, format string, args ...any) {
		objs := map[string]any{"payout_id": p.ID, "account_id": p.AccountID, "client_ref": p.ClientRef, "state": string(p.State)}
		for k, x := range extra {
			objs[k] = x
		}
		out = append(out, candidate{check: check, objects: objs, evidence: fmt.Sprintf(format, args...)})
	}
	fwd := v.forwarded()
	settled := v.settled()
	if len(fwd) > 1 {
		ids := make([]int64, 0, len(fwd))
		for _, s := range fwd {
			ids = append(ids, s.ID)
		}
		add(CheckForwardedSubmissions, map[string]any{"submission_ids": ids}, "payout %s has %d forwarded submissions at the proxy; at most one may ever exist", p.ID, len(fwd))
	}
	if len(settled) > 1 {
		add(CheckSettledPerClientRef, map[string]any{"rail_refs": railRefs(settled), "amount": p.Amount},
			"the rail settled %d payments for client reference %s: payout %s was paid %d times", len(settled), p.ClientRef, p.ID, len(settled))
	}
	if len(v.payment) > 0 && len(fwd) == 0 {
		add(CheckRailWithoutSubmission, map[string]any{"rail_refs": railRefs(v.payment)},
			"the rail holds %d payment(s) for payout %s but the proxy never forwarded a submission: money was sent around the proxy", len(v.payment), p.ID)
	}
	for _, s := range settled {
		if s.Amount != p.Amount || s.Currency != p.Currency {
			add(CheckAmountMismatch, map[string]any{"rail_ref": s.RailRef, "rail_amount": s.Amount, "rail_currency": s.Currency, "amount": p.Amount, "currency": p.Currency},
				"the rail settled %d %s for payout %s, which is for %d %s", s.Amount, s.Currency, p.ID, p.Amount, p.Currency)
		}
	}
	var sub *proxyclient.Record
	if len(fwd) > 0 {
		sub = &fwd[0]
	}
	acked := sub != nil && (sub.Outcome == proxyclient.OutcomeAcked || sub.Resolution == proxyclient.ResolutionSettled)
	subDesc := "no forwarded submission"
	if sub != nil {
		subDesc = fmt.Sprintf("submission %d outcome %s resolution %s", sub.ID, orNone(string(sub.Outcome)), orNone(string(sub.Resolution)))
	}

	// RAIL_ACKED and the terminal states, from the first read (a payout
	// becomes RAIL_ACKED only after the proxy recorded the rail's
	// acknowledgement, or the rail's settlement as its resolution).
	switch f := v.first; f.State {
	case pc.RailAcked:
		if !acked {
			add(CheckSubmissionStateMismatch, map[string]any{"submission": subDesc},
				"payout %s is RAIL_ACKED (money has left, and it will be posted) but the proxy has %s, not an acknowledged one", f.ID, subDesc)
		}
	case pc.Posted:
		if len(settled) == 0 {
			add(CheckPostedNotSettled, map[string]any{"amount": f.Amount},
				"payout %s is POSTED (its ledger shows %d paid) but the rail holds no settled payment for %s", f.ID, f.Amount, f.ClientRef)
		}
		if !acked {
			add(CheckSubmissionStateMismatch, map[string]any{"submission": subDesc},
				"payout %s is POSTED but the proxy has %s, not an acknowledged one", f.ID, subDesc)
		}
	case pc.Failed, pc.Abandoned:
		if len(settled) > 0 {
			add(CheckSettledNotPosted, map[string]any{"rail_refs": railRefs(settled), "amount": f.Amount},
				"payout %s is %s but the rail settled %d payment(s) for it: money left with no ledger entry", f.ID, f.State, len(settled))
		}
		// A forwarded submission leaves a payout FAILED only once the rail
		// declined it or a lookup found nothing (the proxy records either
		// before paydb): one the rail may have paid (no outcome, TIMEOUT,
		// no resolution) released its money too early.
		if f.State == pc.Failed && (acked || (sub != nil && sub.Outcome != proxyclient.OutcomeRejected && sub.Resolution != proxyclient.ResolutionAbsent)) {
			add(CheckSubmissionStateMismatch, map[string]any{"submission": subDesc},
				"payout %s is FAILED but the proxy has %s", f.ID, subDesc)
		}
	}
	// Causal rules, from the last read.
	switch p.State {
	case pc.Pending, pc.Claimed:
		if len(settled) > 0 {
			add(CheckSettledNotPosted, map[string]any{"rail_refs": railRefs(settled), "amount": p.Amount},
				"the rail settled payment(s) for payout %s, which is still %s", p.ID, p.State)
		}
		if sub != nil {
			add(CheckSubmissionStateMismatch, map[string]any{"submission": subDesc},
				"payout %s is %s but the proxy already has %s (RAIL_SUBMITTED must be written first, D-4)", p.ID, p.State, subDesc)
		}
	case pc.RailAmbiguous:
		if sub == nil {
			add(CheckAmbiguousNoSubmission, nil,
				"payout %s is RAIL_AMBIGUOUS but the proxy has no forwarded submission for it: nothing can be looked up; an operator must decide", p.ID)
		}
		// The rail declined it, by the proxy's record, and settled it: the
		// resolution leaves such a payout for a human (the rail contradicts
		// itself), so nothing else would ever say that money left.
		if sub != nil && sub.Outcome == proxyclient.OutcomeRejected && len(settled) > 0 {
			add(CheckSettledNotPosted, map[string]any{"rail_refs": railRefs(settled), "amount": p.Amount, "submission": subDesc},
				"payout %s is RAIL_AMBIGUOUS and the proxy recorded the rail's decline, but the rail settled %d payment(s) for it: money left with no ledger entry, and the rail contradicts itself", p.ID, len(settled))
		}
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// checkPayout runs the per-payout cross-service rules and INV-07 on the
// payout's forwarded submission, given what the proxy (subs: every
// attempt) and the rail (pays) were read to hold for it.
func (r *Reconciler) checkPayout(ctx context.Context, rep *Report, p pc.Payout, subs []proxyclient.Record, pays []railclient.Payment, grants *grantIndex) error {
	view := payoutView{first: p, last: p, subs: subs, payment: pays}

	for _, s := range view.forwarded() {
		if err := r.checkSubmissionGrant(ctx, rep, p, s, grants); err != nil {
			return err
		}
	}

	cands := evaluate(view)
	if len(cands) == 0 {
		return nil
	}
	// Read again, fresh and in write order, before reporting anything.
	first, err := r.c.Payment.Payout(ctx, p.ID)
	if err != nil {
		return cannotRun("read payout "+p.ID, err)
	}
	l, err := r.c.Rail.Find(ctx, p.ClientRef)
	if err != nil {
		return cannotRun("ask the rail about "+p.ClientRef, err)
	}
	pays = l.Items
	subs, err = r.c.Proxy.GetAll(ctx, p.ID)
	if err != nil && !isNotFound(err) {
		return cannotRun("read the submissions of payout "+p.ID, err)
	}
	last, err := r.c.Payment.Payout(ctx, p.ID)
	if err != nil {
		return cannotRun("read payout "+p.ID, err)
	}
	for _, c := range evaluate(payoutView{first: first, last: last, subs: subs, payment: pays}) {
		rep.add(c.check, c.objects, "%s", c.evidence)
	}
	return nil
}

// checkSubmissionGrant: a forwarded submission carries a token the lock
// service granted for its payout's account, to the session that wrote it
// (INV-07). The account is paydb's: a submission naming another account
// passed the proxy's guard of that account, under its grant, not this one's.
func (r *Reconciler) checkSubmissionGrant(ctx context.Context, rep *Report, p pc.Payout, s proxyclient.Record, grants *grantIndex) error {
	key := lockKey(p.AccountID)
	// Its grant ended after the submission was written. A proxy older
	// than the digests' created_at leaves only a bound from below: the
	// payout became RAIL_SUBMITTED before (a resubmission by a later
	// holder comes long after).
	at := s.CreatedAt
	if at.IsZero() && p.SubmittedAt != nil {
		at = *p.SubmittedAt
	}
	if (!at.IsZero() && grants.beyondRetention(at, "submission")) || grants.lostGrant(s.FenceToken, "submission") {
		return nil
	}
	ok, other, err := grants.granted(ctx, s.FenceToken, key)
	if err != nil {
		return cannotRun("read the lock service's grant log", err)
	}
	objs := func() map[string]any {
		return map[string]any{"payout_id": p.ID, "submission_id": s.ID, "account_id": s.AccountID, "payout_account_id": p.AccountID,
			"token": s.FenceToken, "holder": string(s.Holder), "key": key}
	}
	if ok {
		// The token was granted for this key, but to whom? A holder other
		// than the grant's session means the token was issued twice
		// (a rewound lock service) and this write rode on a grant that
		// was never its own.
		if sess := grants.session(s.FenceToken); sess != "" && sess != string(s.Holder) {
			o := objs()
			o["granted_session"] = sess
			rep.add(CheckSubmissionWithoutGrant, o, "submission %d of payout %s was forwarded with token %d by holder %s, but the lock service granted that token to session %s", s.ID, p.ID, s.FenceToken, s.Holder, sess)
		}
		return nil
	}
	if other != "" {
		o := objs()
		o["granted_key"] = other
		what := fmt.Sprintf("submission %d of payout %s was forwarded with token %d, which the lock service granted for %s, not %s", s.ID, p.ID, s.FenceToken, other, key)
		if s.AccountID != p.AccountID {
			what += fmt.Sprintf(" (the submission names account %s; the payout is account %s's)", s.AccountID, p.AccountID)
		}
		rep.add(CheckSubmissionWithoutGrant, o, "%s", what)
	} else {
		rep.add(CheckSubmissionWithoutGrant, objs(), "submission %d of payout %s was forwarded with token %d, which the lock service's grant log does not contain", s.ID, p.ID, s.FenceToken)
	}
	return nil
}
