package reconcile

import (
	"context"

	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// ---- accounts: balance == sum of entries (INV-03) ----

// checkAccounts compares every balance with the ledger read before it and
// returns each account's fence for the high-water check.
func (r *Reconciler) checkAccounts(ctx context.Context, rep *Report, ls *ledgerScan) (map[string]fencing.Token, error) {
	fences := map[string]fencing.Token{}
	drift := map[string]int64{} // account -> balance seen
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
				drift[a.ID] = a.Balance
			}
		}
		if page.Next == "" || len(page.Items) == 0 {
			break
		}
		after = page.Next
	}
	if len(drift) == 0 {
		return fences, nil
	}
	// A posting may have landed between the ledger read and the account
	// read. Read each suspect's balance, the whole ledger, and the balance
	// again: when the balance did not move meanwhile, the sum is exact.
	before := map[string]int64{}
	for id := range drift {
		a, err := r.c.Payment.Account(ctx, id)
		if err != nil {
			return nil, cannotRun("read account "+id, err)
		}
		before[id] = a.Balance
	}
	sums := map[string]int64{}
	counts := map[string]int{}
	err := r.eachLedgerEntry(ctx, func(e pc.LedgerEntry) {
		if _, ok := drift[e.AccountID]; ok {
			sums[e.AccountID] += e.Amount
			counts[e.AccountID]++
		}
	})
	if err != nil {
		return nil, err
	}
	for id := range drift {
		a, err := r.c.Payment.Account(ctx, id)
		if err != nil {
			return nil, cannotRun("read account "+id, err)
		}
		if a.Balance != before[id] {
			rep.note("account %s moved while its balance was being checked; checked again next pass", id)
			continue
		}
		if a.Balance != sums[id] {
			rep.add(CheckBalanceDrift, map[string]any{"account_id": id, "balance": a.Balance, "ledger_sum": sums[id], "entries": counts[id], "drift": a.Balance - sums[id]},
				"account %s has balance %d but its %d ledger entries sum to %d (drift %d)", id, a.Balance, counts[id], sums[id], a.Balance-sums[id])
		}
	}
	return fences, nil
}
