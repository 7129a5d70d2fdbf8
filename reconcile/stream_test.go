package reconcile_test

import (
	"fmt"
	"slices"
	"testing"

	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/reconcile"
)

// findingKeys names every finding of a report by its check and the objects
// that identify it.
func findingKeys(rep *reconcile.Report) []string {
	var out []string
	for _, f := range rep.Findings {
		out = append(out, fmt.Sprintf("%s %v %v %v", f.Check, f.Objects["payout_id"], f.Objects["client_ref"], f.Objects["event_id"]))
	}
	slices.Sort(out)
	return out
}

// The merge of the payout, submission and settlement-report streams finds
// the same things whatever the page size: page boundaries between a
// payout's attempts, between a reference's payments, or between a payout
// and the payments that sort around it lose nothing and invent nothing.
func TestStreamsFindTheSameWithAnyPageSize(t *testing.T) {
	e := setup(t)
	ctx := ctxT(t)
	acc := e.newAccount(t, 10_000)
	// Paid twice at the rail.
	dup := e.payOut(t, e.newPayout(t, acc, 31))
	if _, err := e.railPay.Pay(ctx, railclient.PaymentRequest{ClientRef: dup.ClientRef, Amount: dup.Amount, Currency: dup.Currency, BeneficiaryRef: dup.BeneficiaryRef}); err != nil {
		t.Fatal(err)
	}
	// A payment under a reference that sorts right after a payout's and
	// belongs to none.
	orphan := dup.ClientRef + "-x"
	if _, err := e.railPay.Pay(ctx, railclient.PaymentRequest{ClientRef: orphan, Amount: 5, Currency: "EUR", BeneficiaryRef: "BEN-x"}); err != nil {
		t.Fatal(err)
	}
	// A history whose tokens go down.
	back := e.newPayout(t, acc, 32)
	e.exec(t, "paydb", false, `INSERT INTO payout_event (payout_id, from_state, to_state, token, holder, actor) VALUES
		($1, 'PENDING', 'CLAIMED', 900, 'h-new', 'planted'), ($1, 'CLAIMED', 'CLAIMED', 800, 'h-old', 'planted')`, back.ID)

	var want []string
	for _, size := range []int{0, 1, 2, 3} {
		rep := pass(t, e.reconciler(t, reconcile.Options{BulkPageSize: size, MaxFindings: 100_000}, e.st.Ready.Tokens.Operator))
		mustFind(t, rep, reconcile.INV02, reconcile.CheckSettledPerClientRef, map[string]any{"payout_id": dup.ID})
		mustFind(t, rep, reconcile.INV02, reconcile.CheckRailWithoutSubmission, map[string]any{"client_ref": orphan})
		mustFind(t, rep, reconcile.INV01, reconcile.CheckClaimTokenOrder, map[string]any{"payout_id": back.ID, "token": 800, "previous_token": 900})
		got := findingKeys(rep)
		if size == 0 {
			want = got
			continue
		}
		if !slices.Equal(got, want) {
			t.Fatalf("pages of %d find\n%v\nwhile the default pages find\n%v", size, got, want)
		}
	}
}

// A payout whose stored client reference is not its D-10 one is looked up
// at the rail on its own: its payments are its own, not money sent around
// the system, while a payment under its D-10 reference belongs to no
// payout.
func TestPayoutWithForeignReferenceIsLookedUpOnItsOwn(t *testing.T) {
	e := setup(t)
	ctx := ctxT(t)
	acc := e.newAccount(t, 10_000)
	p := e.newPayout(t, acc, 44)
	foreign := "zz-" + p.ID
	e.exec(t, "paydb", true, `UPDATE payout SET client_ref = $2 WHERE id = $1`, p.ID, foreign)
	for _, ref := range []string{foreign, pc.ClientRef(p.ID)} {
		if _, err := e.railPay.Pay(ctx, railclient.PaymentRequest{ClientRef: ref, Amount: p.Amount, Currency: p.Currency, BeneficiaryRef: p.BeneficiaryRef}); err != nil {
			t.Fatal(err)
		}
	}
	rep := pass(t, e.reconciler(t, reconcile.Options{BulkPageSize: 2, MaxFindings: 100_000}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV03, reconcile.CheckSettledNotPosted, map[string]any{"payout_id": p.ID, "client_ref": foreign})
	// (The payout was never submitted: its payment is reported as the
	// payout's, not as a reference that belongs to no payout.)
	mustFind(t, rep, reconcile.INV02, reconcile.CheckRailWithoutSubmission, map[string]any{"client_ref": foreign, "payout_id": p.ID})
	mustNotFind(t, rep, reconcile.CheckRailWithoutSubmission, map[string]any{"client_ref": foreign, "payments": 1})
	mustFind(t, rep, reconcile.INV02, reconcile.CheckRailWithoutSubmission, map[string]any{"client_ref": pc.ClientRef(p.ID), "payments": 1})
}
