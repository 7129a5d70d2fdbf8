package reconcile

import (
	"context"

	"github.com/payouts/payouts/railproxy/proxyclient"
)

// ---- the proxy's forwarded submissions in commit order (INV-05) ----

// checkSubmissionOrder: guard 2's own detective. A submission is forwarded
// in the transaction whose first statement is the account's guard at the
// proxy, which holds the account's high-water row until the commit, so an
// account's forwarded submissions are numbered in the order they
// committed and their tokens never go down. One forwarded under a token
// lower than an earlier one's passed below the high-water mark the proxy
// had stored: a stale holder the guard should have fenced out (the only
// guard where the payment resource cannot be changed). Unlike
// ledger_token_order, this needs nothing of paydb: a stale submission of a
// payout a later holder then finishes from the proxy's record (D-4) leaves
// no other trace. Memory: one entry per account.
func (r *Reconciler) checkSubmissionOrder(ctx context.Context, rep *Report) error {
	highest := map[string]proxyclient.SubmissionOrder{}
	return eachInIDOrder(ctx, "the rail proxy's forwarded submissions", func(ctx context.Context, after int64) ([]proxyclient.SubmissionOrder, string, error) {
		page, err := r.c.Proxy.SubmissionOrder(ctx, after, r.opts.BulkPageSize)
		return page.Items, page.Next, err
	}, func(s proxyclient.SubmissionOrder) {
		prev, seen := highest[s.AccountID]
		if !seen || s.FenceToken >= prev.FenceToken {
			highest[s.AccountID] = s
			return
		}
		rep.add(CheckSubmissionTokenOrder, map[string]any{"submission_id": s.ID, "payout_id": s.PayoutID, "account_id": s.AccountID,
			"key": lockKey(s.AccountID), "token": s.FenceToken,
			"previous_submission_id": prev.ID, "previous_payout_id": prev.PayoutID, "previous_token": prev.FenceToken},
			"submission %d of payout %s was forwarded for account %s under token %d after submission %d of payout %s under token %d: a holder passed the proxy below the high-water mark it had stored",
			s.ID, s.PayoutID, s.AccountID, s.FenceToken, prev.ID, prev.PayoutID, prev.FenceToken)
	})
}
