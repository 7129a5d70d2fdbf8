package reconcile

import (
	"context"
	"strconv"
	"sync"
	"time"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

// ---- payouts (INV-01, INV-02, INV-03, INV-07, cross-service) ----

func inFlight(s pc.State) bool { return s == pc.Claimed || s == pc.RailSubmitted || s == pc.RailAcked }

func (r *Reconciler) checkPayouts(ctx context.Context, rep *Report, grants *grantIndex) error {
	// The rail is read before the proxy and paydb: a payment the rail holds
	// was preceded by its submission's intent row (and the payout's
	// RAIL_SUBMITTED), so later reads of those must show them.
	ri, err := r.loadRail(ctx, rep)
	if err != nil {
		return err
	}
	now := r.opts.Now()
	flying := map[string][]string{} // account -> payouts seen in flight
	after := ""
	for {
		page, err := r.c.Payment.Payouts(ctx, pc.PayoutFilter{After: after, Limit: r.opts.PageSize})
		if err != nil {
			return cannotRun("read the payouts", err)
		}
		for _, p := range page.Items {
			rep.Scanned.Payouts++
			if inFlight(p.State) {
				flying[p.AccountID] = append(flying[p.AccountID], p.ID)
			}
			if p.State == pc.RailAmbiguous {
				since := ambiguousSince(p)
				if age := now.Sub(since); age > r.opts.AmbiguitySLA {
					rep.add(CheckAmbiguousOverSLA, map[string]any{"payout_id": p.ID, "account_id": p.AccountID, "client_ref": p.ClientRef, "amount": p.Amount, "ambiguous_since": since.UTC(), "age_seconds": int64(age.Seconds())},
						"payout %s has been RAIL_AMBIGUOUS for %s, longer than the SLA %s: the rail has not given final evidence; an operator must decide (abandon to finance)", p.ID, age.Round(time.Second), r.opts.AmbiguitySLA)
				}
			}
		}
		if err := r.checkPage(ctx, rep, page.Items, ri, grants); err != nil {
			return err
		}
		if page.Next == "" || len(page.Items) == 0 {
			break
		}
		after = page.Next
	}
	if err := r.checkInFlight(ctx, rep, flying); err != nil {
		return err
	}
	for ref := range ri.orphan {
		pays := ri.byRef[ref]
		refs := make([]string, 0, len(pays))
		for _, p := range pays {
			refs = append(refs, p.RailRef)
		}
		rep.add(CheckRailWithoutSubmission, map[string]any{"client_ref": ref, "rail_refs": refs, "payments": len(pays)},
			"the rail holds %d payment(s) with client reference %s, which belongs to no payout: money was sent around the system", len(pays), ref)
	}
	return nil
}

// checkPage runs the per-payout checks of one page on up to
// Options.Workers goroutines. Each payout's checks are round trips to the
// payment resource and the proxy; one at a time, the pass would wait on
// the network, not work. The first error stops the page.
func (r *Reconciler) checkPage(ctx context.Context, rep *Report, items []pc.Payout, ri *railIndex, grants *grantIndex) error {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sem := make(chan struct{}, r.opts.Workers)
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for _, p := range items {
		select {
		case sem <- struct{}{}:
		case <-pctx.Done():
		}
		if pctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func(p pc.Payout) {
			defer func() { <-sem; wg.Done() }()
			err := r.checkClaimHistory(pctx, rep, p)
			if err == nil {
				err = r.checkPayout(pctx, rep, p, ri, grants)
			}
			if err != nil {
				once.Do(func() { first = err; cancel() })
			}
		}(p)
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		return cannotRun("check the payouts", ctx.Err())
	}
	return first
}

// ambiguousSince is when a payout's ending became unknown.
func ambiguousSince(p pc.Payout) time.Time {
	switch {
	case p.SubmittedAt != nil:
		return *p.SubmittedAt
	case p.ClaimedAt != nil:
		return *p.ClaimedAt
	default:
		return p.CreatedAt
	}
}

// checkClaimHistory: a payout's accepted changes carry non-decreasing
// tokens (INV-01): each later holder's grant is newer.
func (r *Reconciler) checkClaimHistory(ctx context.Context, rep *Report, p pc.Payout) error {
	var (
		after     int64
		prev      pc.PayoutEvent
		havePrev  bool
		reported  bool
		pageLimit = r.opts.PageSize
	)
	for {
		page, err := r.c.Payment.PayoutEvents(ctx, p.ID, after, pageLimit)
		if err != nil {
			return cannotRun("read the history of payout "+p.ID, err)
		}
		for _, ev := range page.Items {
			after = max(after, ev.ID)
			if ev.Token == 0 {
				continue
			}
			if havePrev && ev.Token < prev.Token && !reported {
				reported = true
				rep.add(CheckClaimTokenOrder, map[string]any{"payout_id": p.ID, "account_id": p.AccountID, "key": lockKey(p.AccountID),
					"event_id": ev.ID, "token": ev.Token, "holder": string(ev.Holder), "to_state": string(ev.ToState),
					"previous_event_id": prev.ID, "previous_token": prev.Token, "previous_holder": string(prev.Holder)},
					"payout %s moved to %s under token %d after an earlier change under token %d: an older holder wrote after a newer one", p.ID, ev.ToState, ev.Token, prev.Token)
			}
			if !havePrev || ev.Token >= prev.Token {
				prev, havePrev = ev, true
			}
		}
		if page.Next == "" || len(page.Items) == 0 {
			return nil
		}
		if n, err := strconv.ParseInt(page.Next, 10, 64); err == nil && n > after {
			after = n
		}
	}
}

// payoutView is what the services say about one payout.
// checkInFlight: at most one payout per account in CLAIMED, RAIL_SUBMITTED
// or RAIL_ACKED (INV-01). Suspects are read again: a payout can finish
// and its successor start while the list is being paged.
func (r *Reconciler) checkInFlight(ctx context.Context, rep *Report, flying map[string][]string) error {
	for account, ids := range flying {
		if len(ids) < 2 {
			continue
		}
		var still []string
		states := map[string]any{}
		for _, id := range ids {
			p, err := r.c.Payment.Payout(ctx, id)
			if err != nil {
				return cannotRun("read payout "+id, err)
			}
			if inFlight(p.State) {
				still = append(still, id)
				states[id] = string(p.State)
			}
		}
		if len(still) < 2 {
			continue
		}
		rep.add(CheckInFlightPerAccount, map[string]any{"account_id": account, "key": lockKey(account), "payouts": still, "states": states},
			"account %s has %d payouts in flight at once (%v): two holders worked the account together", account, len(still), still)
	}
	return nil
}
