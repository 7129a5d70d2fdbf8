//go:build !negativecontrol

package payment

import (
	"strings"
	"testing"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// TestStepsFencedBatchChangesNothing: a batch presenting a stale token, or
// an equal token from another holder, is refused as a whole by guard 1 — the
// same 409 fenced_out as a single mutation — changes no payout and no fence,
// and leaves one fenced_out (and a token_regression when the token is
// equal) with the usual evidence; a higher token is accepted.
func TestStepsFencedBatchChangesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for i, c := range []struct {
		token      fencing.Token
		holder     fencing.Holder
		regression bool
	}{{9, "holder-b", false}, {10, "holder-b", true}} {
		acct := []string{"acc-stale", "acc-equal"}[i]
		e.account(t, acct, 10_000)
		ids := []string{acct + "-1", acct + "-2", acct + "-3"}
		for _, id := range ids {
			e.payout(t, id, acct, 100)
		}
		e.drive(t, ids[0], pc.Claimed, 10, "holder-a")
		before := e.counts(t)
		fenced0, regress0 := counterValue(e.svc.m.fencedOut), counterValue(e.svc.m.tokenRegressions)

		_, err := e.exec.Steps(bg, acct, c.token, c.holder, pc.StepClaim, items(ids[1], ids[2]))
		pe := wantCode(t, err, problem.FencedOut)
		if pe.Status() != 409 || pe.Key != fencing.Key(acct) || pe.PresentedToken != int64(c.token) || pe.StoredToken != 10 {
			t.Fatalf("fenced_out answer %+v (status %d)", pe, pe.Status())
		}
		var pid string
		if !pe.Extension("payout_id", &pid) || pid != ids[1] {
			t.Fatalf("fenced_out answer names payout %q, want the batch's first, %s", pid, ids[1])
		}
		if a, _ := e.exec.Account(bg, acct); a.FenceToken != 10 || a.FenceHolder != "holder-a" {
			t.Fatalf("fence moved on refusal: %+v", a)
		}
		for _, id := range ids[1:] {
			if p, _ := e.exec.Payout(bg, id); p.State != pc.Pending {
				t.Fatalf("%s is %s after a fenced batch", id, p.State)
			}
		}
		want := []string{pc.KindFencedOut}
		if c.regression {
			want = append(want, pc.KindTokenRegression)
		}
		if k := e.safetyKinds(t, ids[1]); strings.Join(k, ",") != strings.Join(want, ",") {
			t.Fatalf("safety events %v, want %v", k, want)
		}
		after := e.counts(t)
		if after["payout_event"] != before["payout_event"] || after["ledger_entry"] != before["ledger_entry"] ||
			after["safety_event"] != before["safety_event"]+int64(len(want)) {
			t.Fatalf("rows %v -> %v: a fenced batch may only add its evidence", before, after)
		}
		if d := counterValue(e.svc.m.fencedOut) - fenced0; d != 1 {
			t.Fatalf("fenced_out counter moved by %v, want 1", d)
		}
		wantReg := 0.0
		if c.regression {
			wantReg = 1
		}
		if d := counterValue(e.svc.m.tokenRegressions) - regress0; d != wantReg {
			t.Fatalf("token_regression counter moved by %v, want %v", d, wantReg)
		}
		if !containsAll(e.logs.String(), `"event":"fenced_out"`, `"key":"payout:`+acct+`"`) {
			t.Fatal("no fenced_out log line")
		}
		// A later holder's batch goes through.
		for _, r := range e.steps(t, acct, 11, "holder-c", pc.StepClaim, items(ids...)) {
			wantState(t, r, pc.Claimed)
		}
	}
	e.assertLedger(t)
}
