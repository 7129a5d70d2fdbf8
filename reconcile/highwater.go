package reconcile

import (
	"context"

	"github.com/payouts/payouts/lock/fencing"
)

// ---- proxy high-water vs paydb fence (INV-04) ----

// checkHighWater: every holder writes paydb (claim, submitting) before it
// calls the proxy with the same token, so the proxy's high-water for an
// account can never be above paydb's fence; when it is, paydb was restored
// from an older backup or written around.
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
