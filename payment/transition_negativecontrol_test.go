//go:build negativecontrol

package payment

import (
	"testing"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

// TestNegativeControlTerminalStateReExecuted: with the transition table's
// refusal compiled out, a completed payout is re-executed (an operator
// cancel of a POSTED payout lands) — the request TestReleaseBuildPrimariesOn
// and the state machine tests show refused in a release build.
func TestNegativeControlTerminalStateReExecuted(t *testing.T) {
	if transitionTableEnabled {
		t.Fatal("negativecontrol build still enforces the transition table")
	}
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 100)
	e.drive(t, "po-1", pc.Posted, 10, "holder")
	p, err := e.oper.Cancel(tctx(t), "po-1", 10, "holder", "cleanup job")
	if err != nil {
		t.Fatalf("negative control: re-execution of a POSTED payout refused: %v", err)
	}
	if p.State != pc.Abandoned {
		t.Fatalf("POSTED payout cancelled to %s, want ABANDONED", p.State)
	}
}
