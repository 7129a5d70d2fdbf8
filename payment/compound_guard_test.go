//go:build !negativecontrol

package payment

import (
	"strings"
	"testing"

	"github.com/payouts/payouts/internal/problem"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// TestCompoundFencedBatchChangesNothing: a compound batch presenting a
// stale token is refused as a whole by guard 1, once: no payout, fence,
// event or ledger row changes, and one fenced_out is recorded (row, counter,
// log line) naming both ops. TestNegativeControlStaleCompoundBatchLands
// shows the same request landing with the guard's condition removed.
func TestCompoundFencedBatchChangesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 10_000)
	for _, id := range []string{"po-1", "po-2", "po-3"} {
		e.payout(t, id, "acc-1", 100)
	}
	e.drive(t, "po-1", pc.RailSubmitted, 10, "holder-a")
	before := e.counts(t)
	fenced0 := counterValue(e.svc.m.fencedOut)

	for _, c := range []struct {
		op, then pc.StepOp
		its      []pc.StepItem
		first    string
	}{
		{pc.StepClaim, pc.StepSubmitting, items("po-2", "po-3"), "po-2"},
		{pc.StepOutcome, pc.StepPost, []pc.StepItem{{PayoutID: "po-1", Outcome: pc.OutcomeAcked, RailRef: "r-1"}}, "po-1"},
	} {
		_, err := e.exec.StepsThen(bg, "acc-1", 9, "holder-b", c.op, c.then, c.its)
		pe := wantCode(t, err, problem.FencedOut)
		if pe.PresentedToken != 9 || pe.StoredToken != 10 {
			t.Fatalf("%s+%s: fenced_out answer %+v", c.op, c.then, pe)
		}
		if k := e.safetyKinds(t, c.first); strings.Join(k, ",") != pc.KindFencedOut {
			t.Fatalf("%s+%s: safety events of %s %v, want one fenced_out", c.op, c.then, c.first, k)
		}
	}
	after := e.counts(t)
	if after["payout_event"] != before["payout_event"] || after["ledger_entry"] != before["ledger_entry"] ||
		after["safety_event"] != before["safety_event"]+2 {
		t.Fatalf("rows %v -> %v: a fenced batch may only add its one fenced_out", before, after)
	}
	if d := counterValue(e.svc.m.fencedOut) - fenced0; d != 2 {
		t.Fatalf("fenced_out counter moved by %v for two refused batches, want 2", d)
	}
	var detail string
	if err := e.svc.pool.QueryRow(tctx(t), `SELECT detail FROM safety_event WHERE payout_id = 'po-2'`).Scan(&detail); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(detail, "claim+submitting refused") {
		t.Fatalf("fenced_out detail %q does not name the compound step", detail)
	}
	if a, _ := e.exec.Account(bg, "acc-1"); a.FenceToken != 10 || a.FenceHolder != "holder-a" {
		t.Fatalf("fence moved on refusal: %+v", a)
	}
	for id, want := range map[string]pc.State{"po-1": pc.RailSubmitted, "po-2": pc.Pending, "po-3": pc.Pending} {
		if p, _ := e.exec.Payout(bg, id); p.State != want {
			t.Fatalf("%s is %s after a fenced batch, want %s", id, p.State, want)
		}
	}
	e.assertLedger(t)
}
