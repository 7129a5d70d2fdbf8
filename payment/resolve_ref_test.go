package payment

import (
	"testing"

	"github.com/payouts/payouts/internal/problem"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// A payout resolved SETTLED carries the rail's reference of the settled
// payment, as an ACKED outcome's does, and is posted with it: the posted
// payout is reconciled against the payment it names. ABSENT names no
// payment: a rail_ref with it is refused, nothing changed.
func TestASettledResolutionCarriesTheRailsReference(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 10)
	e.payout(t, "po-2", "acc-1", 20)
	e.drive(t, "po-1", pc.RailAmbiguous, 5, "holder-a")

	_, err := e.recon.Resolve(tctx(t), "po-1", 6, "holder-r", pc.ResolutionAbsent, "rail: no payment", "rl-1")
	wantCode(t, err, problem.InvalidRequest)
	if p, _ := e.exec.Payout(tctx(t), "po-1"); p.State != pc.RailAmbiguous {
		t.Fatalf("a refused resolution changed the payout: %s", p.State)
	}
	p, err := e.recon.Resolve(tctx(t), "po-1", 6, "holder-r", pc.ResolutionSettled, "rail: settled rl-1", "rl-1")
	if err != nil || p.State != pc.RailAcked || p.RailRef != "rl-1" {
		t.Fatalf("resolve SETTLED with rail_ref: %v %s %q, want RAIL_ACKED carrying rl-1", err, p.State, p.RailRef)
	}
	p, err = e.exec.Post(tctx(t), "po-1", 7, "holder-b")
	if err != nil || p.State != pc.Posted || p.RailRef != "rl-1" {
		t.Fatalf("post: %v %s %q, want POSTED carrying rl-1", err, p.State, p.RailRef)
	}

	// Without one, as before: resolved and posted, no reference.
	e.drive(t, "po-2", pc.RailAmbiguous, 8, "holder-b")
	p, err = e.recon.Resolve(tctx(t), "po-2", 9, "holder-r", pc.ResolutionSettled, "rail: settled", "")
	if err != nil || p.State != pc.RailAcked || p.RailRef != "" {
		t.Fatalf("resolve SETTLED without rail_ref: %v %s %q", err, p.State, p.RailRef)
	}
	e.assertLedger(t)
}
