//go:build negativecontrol

package payment

import (
	"testing"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

// TestNegativeControlStaleBatchLands: the batch path runs the same guard 1
// statement, so with its fence condition compiled out a stale batch lands
// too — the scenario TestStepsFencedBatchChangesNothing shows refused.
func TestNegativeControlStaleBatchLands(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 100)
	e.payout(t, "po-2", "acc-1", 100)
	e.drive(t, "po-1", pc.Claimed, 10, "new-holder")
	res, err := e.exec.Steps(bg, "acc-1", 9, "old-holder", pc.StepClaim, items("po-2"))
	if err != nil {
		t.Fatalf("negative control: stale batch refused: %v", err)
	}
	if len(res) != 1 || res[0].Err != nil || res[0].Payout.State != pc.Claimed || res[0].Payout.Token != 9 {
		t.Fatalf("stale batch did not land: %+v", res)
	}
	if a, _ := e.exec.Account(bg, "acc-1"); a.FenceToken != 10 || a.FenceHolder != "new-holder" {
		t.Fatalf("fence must still record the highest token: %+v", a)
	}
}

// TestNegativeControlStaleCompoundBatchLands: a compound batch runs the
// same guard 1 statement, once, first, so with its fence condition compiled
// out a stale claim+submitting lands both transitions — the request
// TestCompoundFencedBatchChangesNothing shows refused.
func TestNegativeControlStaleCompoundBatchLands(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 100)
	e.payout(t, "po-2", "acc-1", 100)
	e.drive(t, "po-1", pc.Claimed, 10, "new-holder")
	res, err := e.exec.StepsThen(bg, "acc-1", 9, "old-holder", pc.StepClaim, pc.StepSubmitting, items("po-2"))
	if err != nil {
		t.Fatalf("negative control: stale compound batch refused: %v", err)
	}
	if len(res) != 1 || res[0].Err != nil || res[0].Payout.State != pc.RailSubmitted || res[0].Payout.Token != 9 {
		t.Fatalf("stale compound batch did not land: %+v", res)
	}
	if n := e.eventCount(t, "po-2"); n != 3 { // created, claimed, submitting
		t.Fatalf("po-2 has %d events, want 3", n)
	}
	if a, _ := e.exec.Account(bg, "acc-1"); a.FenceToken != 10 || a.FenceHolder != "new-holder" {
		t.Fatalf("fence must still record the highest token: %+v", a)
	}
}
