package reconcile

import (
	"context"

	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// ---- proxy high-water vs paydb fence (INV-04) ----

// checkHighWater: a holder writes paydb (claim, submitting) before it
// calls the proxy with the same token, so the proxy's high-water for an
// account is above paydb's fence only when paydb was restored from an older
// backup or written around — or in one path of the design: a later holder
// that finds a payout RAIL_SUBMITTED and never forwarded submits it at once
// (D-4), and paydb sees its token only when it reports the outcome. A
// high-water that such a submission explains (resubmittedUnder) is not
// reported.
func (r *Reconciler) checkHighWater(ctx context.Context, rep *Report, fences map[string]fencing.Token) error {
	after := ""
	for {
		page, err := r.c.Proxy.HighWater(ctx, after, r.opts.PageSize)
		if err != nil {
			return cannotRun("read the rail proxy's high-water marks", err)
		}
		for _, hw := range page.Items {
			rep.Scanned.HighWater++
			fence, known := fences[hw.AccountID]
			if known && hw.Token <= fence {
				continue
			}
			// Read paydb again, after the proxy (the order a holder writes in).
			a, err := r.c.Payment.Account(ctx, hw.AccountID)
			switch {
			case isNotFound(err):
				rep.add(CheckHighWaterAboveFence, map[string]any{"account_id": hw.AccountID, "high_water": hw.Token, "high_water_holder": string(hw.Holder), "paydb_fence": 0},
					"the proxy holds high-water %d for account %s, which paydb does not know", hw.Token, hw.AccountID)
				continue
			case err != nil:
				return cannotRun("read account "+hw.AccountID, err)
			}
			if hw.Token > a.FenceToken {
				explained, err := r.resubmittedUnder(ctx, hw.AccountID, hw.Token)
				if err != nil {
					return err
				}
				if explained {
					continue
				}
				// The holder may have reported its outcome since the fence
				// was read (the payout left RAIL_SUBMITTED, the fence rose
				// in the same write): read it once more.
				if a, err = r.c.Payment.Account(ctx, hw.AccountID); err != nil {
					return cannotRun("read account "+hw.AccountID, err)
				}
				if hw.Token <= a.FenceToken {
					continue
				}
				rep.add(CheckHighWaterAboveFence, map[string]any{"account_id": hw.AccountID, "key": lockKey(hw.AccountID), "high_water": hw.Token, "high_water_holder": string(hw.Holder), "paydb_fence": a.FenceToken, "paydb_fence_holder": string(a.FenceHolder)},
					"the proxy's high-water %d for account %s is above paydb's fence %d: paydb was restored from an older backup or written around the guard", hw.Token, hw.AccountID, a.FenceToken)
			}
		}
		if page.Next == "" || len(page.Items) == 0 {
			return nil
		}
		after = page.Next
	}
}

// resubmittedUnder reports whether a payout of account that paydb holds
// RAIL_SUBMITTED, marked so under an earlier token, was forwarded under
// token: a later holder's D-4 submission, whose token paydb learns with the
// outcome.
func (r *Reconciler) resubmittedUnder(ctx context.Context, account string, token fencing.Token) (bool, error) {
	f := pc.PayoutFilter{State: pc.RailSubmitted, AccountID: account, Limit: r.opts.PageSize}
	for {
		page, err := r.c.Payment.Payouts(ctx, f)
		if err != nil {
			return false, cannotRun("list the RAIL_SUBMITTED payouts of account "+account, err)
		}
		for _, p := range page.Items {
			rec, err := r.c.Proxy.Get(ctx, p.ID)
			switch {
			case isNotFound(err):
				continue
			case err != nil:
				return false, cannotRun("read the submission of payout "+p.ID, err)
			}
			if rec.Forwarded() && rec.FenceToken == token && p.Token < token {
				return true, nil
			}
		}
		if page.Next == "" || len(page.Items) == 0 {
			return false, nil
		}
		f.After = page.Next
	}
}
