package reconcile

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// ---- ledger (INV-03, INV-07) ----

type openGroup struct {
	sum      int64
	firstID  int64
	accounts []string // distinct; a group has two or three
}

type ledgerScan struct {
	open map[string]*openGroup // groups whose running sum is not zero
	sums map[string]int64      // account -> sum of its entries
	// highest is, per customer account, the payout entry with the highest
	// token read so far (ledgerTokenOrder).
	highest map[string]postedUnder
}

// postedUnder is the part of a ledger entry ledgerTokenOrder keeps.
type postedUnder struct {
	id       int64
	payoutID string
	token    fencing.Token
}

// customerAccount is the account whose lock a payout's ledger entry was
// posted under: the leg that is not the clearing account.
func customerAccount(e pc.LedgerEntry) string {
	if e.AccountID == pc.ClearingAccount {
		return e.CounterpartyAccountID
	}
	return e.AccountID
}

// scanLedger reads the whole ledger once, page by page. Groups are kept
// only while their running sum is not zero (the entries of a group are
// written together, so few are open at once).
func (r *Reconciler) scanLedger(ctx context.Context, rep *Report, grants *grantIndex) (*ledgerScan, error) {
	ls := &ledgerScan{open: map[string]*openGroup{}, sums: map[string]int64{}, highest: map[string]postedUnder{}}
	var grantErr error
	err := r.eachLedgerEntry(ctx, func(e pc.LedgerEntry) {
		rep.Scanned.LedgerEntries++
		ls.sums[e.AccountID] += e.Amount
		g := ls.open[e.GroupID]
		if g == nil {
			g = &openGroup{firstID: e.ID}
			ls.open[e.GroupID] = g
		}
		g.sum += e.Amount
		if !slices.Contains(g.accounts, e.AccountID) {
			g.accounts = append(g.accounts, e.AccountID)
		}
		if g.sum == 0 {
			delete(ls.open, e.GroupID)
		}
		if e.PayoutID != "" && grantErr == nil {
			grantErr = r.checkLedgerGrant(ctx, rep, e, grants)
		}
		if e.PayoutID == "" && e.AccountID == pc.ClearingAccount {
			rep.add(CheckPayoutPosting, map[string]any{"entry_id": e.ID, "group_id": e.GroupID, "account_id": e.AccountID, "amount": e.Amount,
				"counterparty_account_id": e.CounterpartyAccountID},
				"ledger entry %d (group %s) moves %+d on %s, with %s, and names no payout: only a payout's posting moves money through %s",
				e.ID, e.GroupID, e.Amount, pc.ClearingAccount, e.CounterpartyAccountID, pc.ClearingAccount)
		}
		ls.ledgerTokenOrder(rep, e)
	})
	if err != nil {
		return nil, err
	}
	if grantErr != nil {
		return nil, grantErr
	}
	if len(ls.open) > 0 {
		if err := r.recheckGroups(ctx, rep, ls.open); err != nil {
			return nil, err
		}
	}
	return ls, nil
}

// eachLedgerEntry reads the whole ledger in id order, in bulk pages, the
// next page read while fn works through the current one.
func (r *Reconciler) eachLedgerEntry(ctx context.Context, fn func(pc.LedgerEntry)) error {
	return eachInIDOrder(ctx, "the ledger", func(ctx context.Context, after int64) ([]pc.LedgerEntry, string, error) {
		page, err := r.c.Payment.Ledger(ctx, after, r.opts.BulkPageSize)
		return page.Items, page.Next, err
	}, fn)
}

// eachInIDOrder reads a list paged by id (read: the page after id after,
// and the next cursor), the next page read while fn works through the
// current one.
func eachInIDOrder[T any](ctx context.Context, what string, read func(ctx context.Context, after int64) ([]T, string, error), fn func(T)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	items := openStream(ctx, what, nil, func(ctx context.Context, cursor string) ([]T, string, error) {
		var after int64
		if cursor != "" {
			n, err := strconv.ParseInt(cursor, 10, 64)
			if err != nil {
				return nil, "", fmt.Errorf("%s: the service answered the cursor %q: %w", what, cursor, err)
			}
			after = n
		}
		return read(ctx, after)
	})
	for {
		v, ok, err := items.head()
		if err != nil || !ok {
			return err
		}
		fn(v)
		items.next()
	}
}

// ledgerTokenOrder: a payout's entries are posted in the transaction whose
// first statement is the account's guard, which holds the account's row
// until the commit, so an account's entries are numbered in the order of
// their commits and their tokens never go down: an entry under a token
// lower than an earlier entry's was written below the stored fence
// (INV-05), by a holder the guard should have fenced out. This outlives the
// moment: in_flight_per_account sees two holders only while both payouts
// are in flight. Each posting is judged once, by its customer's leg.
func (ls *ledgerScan) ledgerTokenOrder(rep *Report, e pc.LedgerEntry) {
	acc := customerAccount(e)
	if e.PayoutID == "" || e.Token == 0 || e.AccountID != acc {
		return
	}
	prev, seen := ls.highest[acc]
	if !seen || e.Token >= prev.token {
		ls.highest[acc] = postedUnder{e.ID, e.PayoutID, e.Token}
		return
	}
	rep.add(CheckLedgerTokenOrder, map[string]any{"entry_id": e.ID, "payout_id": e.PayoutID, "account_id": acc, "token": e.Token,
		"previous_entry_id": prev.id, "previous_payout_id": prev.payoutID, "previous_token": prev.token},
		"ledger entry %d of payout %s was posted on %s under token %d after entry %d of payout %s under token %d: a holder wrote below the fence the account had stored",
		e.ID, e.PayoutID, acc, e.Token, prev.id, prev.payoutID, prev.token)
}

// recheckGroups sums the suspect groups again over a second full read:
// every entry of a group seen in the first read had committed before the
// second began, so the second read sees each suspect group whole.
func (r *Reconciler) recheckGroups(ctx context.Context, rep *Report, open map[string]*openGroup) error {
	sums := make(map[string]int64, len(open))
	counts := make(map[string]int, len(open))
	err := r.eachLedgerEntry(ctx, func(e pc.LedgerEntry) {
		if _, ok := open[e.GroupID]; ok {
			sums[e.GroupID] += e.Amount
			counts[e.GroupID]++
		}
	})
	if err != nil {
		return err
	}
	for id, g := range open {
		if sums[id] == 0 {
			continue
		}
		rep.add(CheckLedgerGroupSum, map[string]any{"group_id": id, "sum": sums[id], "entries": counts[id], "first_entry_id": g.firstID, "accounts": g.accounts},
			"ledger group %s sums to %d, not zero, over %d entries: money appeared or disappeared", id, sums[id], counts[id])
	}
	return nil
}

// checkLedgerGrant: a payout's ledger entry carries a token the lock
// service granted for that payout's account (INV-07).
func (r *Reconciler) checkLedgerGrant(ctx context.Context, rep *Report, e pc.LedgerEntry, grants *grantIndex) error {
	key := lockKey(customerAccount(e))
	objs := func() map[string]any {
		return map[string]any{"entry_id": e.ID, "group_id": e.GroupID, "payout_id": e.PayoutID, "account_id": e.AccountID, "token": e.Token, "key": key}
	}
	if e.Token == 0 {
		rep.add(CheckLedgerWithoutGrant, objs(), "ledger entry %d of payout %s carries no token: it was posted outside any grant", e.ID, e.PayoutID)
		return nil
	}
	if grants.beyondRetention(e.CreatedAt, "ledger") || grants.lostGrant(e.Token, "ledger") {
		return nil
	}
	ok, other, err := grants.granted(ctx, e.Token, key)
	if err != nil {
		return cannotRun("read the lock service's grant log", err)
	}
	switch {
	case ok:
	case other != "":
		o := objs()
		o["granted_key"] = other
		rep.add(CheckLedgerWithoutGrant, o, "ledger entry %d of payout %s was posted with token %d, which the lock service granted for %s, not %s", e.ID, e.PayoutID, e.Token, other, key)
	default:
		rep.add(CheckLedgerWithoutGrant, objs(), "ledger entry %d of payout %s was posted with token %d, which the lock service's grant log does not contain", e.ID, e.PayoutID, e.Token)
	}
	return nil
}
