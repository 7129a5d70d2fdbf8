package reconcile

import (
	"context"

	"github.com/payouts/payouts/lock/fencing"
)

// ---- accounts: balance == sum of entries (INV-03) ----

// checkAccounts compares every balance with the ledger read before it and
// returns each account's fence for the high-water check.
func (r *Reconciler) checkAccounts(ctx context.Context, rep *Report, ls *ledgerScan) (map[string]fencing.Token, error) {
	fences := map[string]fencing.Token{}
	var suspects []string // accounts whose balance differed from the ledger read before it
	after := ""
	for {
		page, err := r.c.Payment.Accounts(ctx, after, r.opts.PageSize)
		if err != nil {
			return nil, cannotRun("read the accounts", err)
		}
		for _, a := range page.Items {
			rep.Scanned.Accounts++
			fences[a.ID] = a.FenceToken
			if a.Balance != ls.sums[a.ID] {
				suspects = append(suspects, a.ID)
			}
		}
		if page.Next == "" || len(page.Items) == 0 {
			break
		}
		after = page.Next
	}
	if len(suspects) == 0 {
		return fences, nil
	}
	// A posting may have landed between the ledger read and the account
	// read. Each suspect is checked again with its balance and the sum of
	// its entries read in one statement (one snapshot): exact however
	// busy the account, payout-clearing included, which a posting moves
	// every time.
	for _, id := range suspects {
		l, err := r.c.Payment.LedgerSum(ctx, id)
		if err != nil {
			return nil, cannotRun("read the ledger sum of account "+id, err)
		}
		if l.Balance != l.LedgerSum {
			rep.add(CheckBalanceDrift, map[string]any{"account_id": id, "balance": l.Balance, "ledger_sum": l.LedgerSum, "entries": l.Entries, "drift": l.Balance - l.LedgerSum},
				"account %s has balance %d but its %d ledger entries sum to %d (drift %d)", id, l.Balance, l.Entries, l.LedgerSum, l.Balance-l.LedgerSum)
		}
	}
	return fences, nil
}
