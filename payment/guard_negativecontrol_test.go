//go:build negativecontrol

package payment

import (
	"testing"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

// TestNegativeControlStaleWriteLands: with guard 1's fence condition
// compiled out, the UC-03 scenario's stale write lands — the scenario
// TestGuard shows refused with the guard in place. The fence still records
// the highest token, so the evidence (a payout_event below the fence) is
// there for the detective controls.
func TestNegativeControlStaleWriteLands(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 100)
	e.drive(t, "po-1", pc.Claimed, 10, "new-holder")
	p, err := e.exec.Submitting(bg, "po-1", 9, "old-holder")
	if err != nil {
		t.Fatalf("negative control: stale write refused: %v", err)
	}
	if p.State != pc.RailSubmitted || p.Token != 9 {
		t.Fatalf("stale write did not land: %+v", p)
	}
	if a, _ := e.exec.Account(bg, "acc-1"); a.FenceToken != 10 || a.FenceHolder != "new-holder" {
		t.Fatalf("fence must still record the highest token: %+v", a)
	}
}

// TestNegativeControlGuardDisabledIsOne: the negative-control build says
// so on /metrics, where the PayoutsGuardDisabled alert pages on it.
func TestNegativeControlGuardDisabledIsOne(t *testing.T) {
	if v := guardDisabledGauge(t); v != 1 {
		t.Fatalf("negativecontrol build: payouts_payment_guard_disabled = %v, want 1", v)
	}
}
