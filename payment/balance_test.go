package payment

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/pgpool"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// TestPostingsOfDifferentAccountsDoNotWaitForEachOther: every posting
// credits payout-clearing, but a posting in flight (its transaction not yet
// committed) holds only the part of that balance its account hashes to, so
// another account's posting commits meanwhile. Afterwards the clearing
// balance (its row plus its parts) is the sum of its entries, and a part
// edited behind the service's back is drift the ledger check reports.
func TestPostingsOfDifferentAccountsDoNotWaitForEachOther(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := tctx(t)
	other := ""
	for i := 0; other == ""; i++ {
		if id := fmt.Sprintf("acc-b-%d", i); balancePart(id) != balancePart("acc-a") {
			other = id
		}
	}
	e.account(t, "acc-a", 1_000)
	e.account(t, other, 1_000)
	e.payout(t, "po-a", "acc-a", 100)
	e.payout(t, "po-b", other, 200)
	pa := e.drive(t, "po-a", pc.RailAcked, 1, "h")
	e.drive(t, "po-b", pc.RailAcked, 1, "h")

	// acc-a's posting, written as every posting is and left uncommitted.
	tx, err := pgpool.Begin(ctx, e.svc.pool)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	cmd := Command{Op: OpPost, Token: 1, Holder: "h", Actor: "test"}
	if _, err := writeChanges(ctx, tx, cmd, "acc-a", []change{{from: pa, to: pc.Posted, settled: true, reason: "posted"}}); err != nil {
		t.Fatal(err)
	}

	// The other account's posting does not wait for it.
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pb, err := e.exec.Post(pctx, "po-b", 1, "h")
	if err != nil {
		t.Fatalf("a posting of %s while one of acc-a is in flight: %v (it waited for acc-a's commit)", other, err)
	}
	if pb.State != pc.Posted {
		t.Fatalf("po-b is %s, want POSTED", pb.State)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	clearing, err := e.recon.Account(ctx, pc.ClearingAccount)
	if err != nil {
		t.Fatal(err)
	}
	if clearing.Balance != 300 {
		t.Fatalf("payout-clearing balance %d, want 300 (both postings)", clearing.Balance)
	}
	e.assertLedger(t)

	if _, err := e.svc.pool.Exec(ctx, `UPDATE account_balance_part SET amount = amount + 3 WHERE account_id = $1 AND part = $2`,
		pc.ClearingAccount, balancePart(other)); err != nil {
		t.Fatal(err)
	}
	rep, err := e.svc.CheckLedger(ctx, time.Now().Add(-time.Minute), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Accounts) != 1 || rep.Accounts[0].AccountID != pc.ClearingAccount || rep.Accounts[0].Difference != 3 {
		t.Fatalf("drift of a part: %+v, want payout-clearing off by 3", rep.Accounts)
	}
}
