package demo

import (
	"context"
	"fmt"

	"github.com/payouts/payouts/lock/lockclient"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// payout reads one payout.
func (dm *demo) payout(ctx context.Context, id string) (pc.Payout, error) {
	cctx, cancel := callCtx(ctx)
	defer cancel()
	p, err := dm.pay.Payout(cctx, id)
	if err != nil {
		return p, fmt.Errorf("read payout %s: %w", id, err)
	}
	return p, nil
}

// payoutsOf lists every payout, or those of one account.
func (dm *demo) payoutsOf(ctx context.Context, account string) ([]pc.Payout, error) {
	return dm.list(ctx, pc.PayoutFilter{AccountID: account, Limit: 1000})
}

// payoutsIn lists every payout in state s.
func (dm *demo) payoutsIn(ctx context.Context, s pc.State) ([]pc.Payout, error) {
	return dm.list(ctx, pc.PayoutFilter{State: s, Limit: 1000})
}

func (dm *demo) list(ctx context.Context, f pc.PayoutFilter) ([]pc.Payout, error) {
	cctx, cancel := callCtx(ctx)
	defer cancel()
	var out []pc.Payout
	for {
		page, err := dm.pay.Payouts(cctx, f)
		if err != nil {
			return nil, fmt.Errorf("list payouts: %w", err)
		}
		out = append(out, page.Items...)
		if page.Next == "" || len(page.Items) == 0 {
			return out, nil
		}
		f.After = page.Next
	}
}

// counts is the number of payouts in each state.
func (dm *demo) counts(ctx context.Context) (map[pc.State]int, error) {
	all, err := dm.payoutsOf(ctx, "")
	if err != nil {
		return nil, err
	}
	c := map[pc.State]int{}
	for _, p := range all {
		c[p.State]++
	}
	return c, nil
}

// accounts lists every account, the system ones (funding, clearing)
// included.
func (dm *demo) accounts(ctx context.Context) ([]pc.Account, error) {
	cctx, cancel := callCtx(ctx)
	defer cancel()
	var out []pc.Account
	after := ""
	for {
		page, err := dm.pay.Accounts(cctx, after, 1000)
		if err != nil {
			return nil, fmt.Errorf("list accounts: %w", err)
		}
		out = append(out, page.Items...)
		if page.Next == "" || len(page.Items) == 0 {
			return out, nil
		}
		after = page.Next
	}
}

// liveGrants are owner's grants the lock service's grant log shows still
// in force.
func (dm *demo) liveGrants(ctx context.Context, owner string) ([]lockclient.GrantRecord, error) {
	cctx, cancel := callCtx(ctx)
	defer cancel()
	all, err := dm.lock.AllGrants(cctx, 0)
	if err != nil {
		return nil, fmt.Errorf("read the lock service's grant log: %w", err)
	}
	var out []lockclient.GrantRecord
	for _, g := range all {
		if g.Owner == owner && g.EndedAt == nil {
			out = append(out, g)
		}
	}
	return out, nil
}

// paidOut is the money the ledger says left for payouts: the sum of the
// payout entries on payout-clearing (each posting credits it with the
// payout's amount), read from the whole ledger.
func (dm *demo) paidOut(ctx context.Context) (int64, error) {
	cctx, cancel := callCtx(ctx)
	defer cancel()
	var sum, after int64
	for {
		page, err := dm.pay.Ledger(cctx, after, 1000)
		if err != nil {
			return 0, fmt.Errorf("read the ledger: %w", err)
		}
		for _, e := range page.Items {
			if e.PayoutID != "" && e.AccountID == pc.ClearingAccount {
				sum += e.Amount
			}
			after = e.ID
		}
		if page.Next == "" || len(page.Items) == 0 {
			return sum, nil
		}
	}
}
