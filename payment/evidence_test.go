package payment

import (
	"context"
	"testing"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
)

// A token_regression is judged from the fence that refused the request, as
// guard 1's statement returned it — not from a fence read afterwards, which
// a newer holder may have moved meanwhile (and which then hid the
// regression).
func TestTokenRegressionJudgedFromTheRefusingStatement(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 100)
	if _, err := e.exec.Claim(tctx(t), "po-1", 5, "holder-a"); err != nil {
		t.Fatal(err)
	}
	// Between the refusal and its evidence, a newer holder moves the fence.
	moved := func() {
		if _, err := e.svc.pool.Exec(context.Background(),
			`UPDATE account SET fence_token = 9, fence_holder = 'holder-c' WHERE id = 'acc-1'`); err != nil {
			t.Error(err)
		}
	}
	e.svc.afterRefusal.Store(&moved)
	_, err := e.exec.Claim(tctx(t), "po-1", 5, "holder-b") // token 5 again, from another holder
	pe := wantCode(t, err, problem.FencedOut)
	if pe.StoredToken != 5 {
		t.Errorf("fenced_out answer names stored token %d, want 5 (the fence that refused)", pe.StoredToken)
	}
	if got := e.safetyKinds(t, "po-1"); len(got) != 2 || got[0] != "fenced_out" || got[1] != "token_regression" {
		t.Fatalf("safety events %v, want [fenced_out token_regression]", got)
	}
	var stored int64
	var storedHolder string
	if err := e.svc.pool.QueryRow(tctx(t), `SELECT stored_token, stored_holder FROM safety_event WHERE kind = 'token_regression'`).
		Scan(&stored, &storedHolder); err != nil {
		t.Fatal(err)
	}
	if stored != 5 || fencing.Holder(storedHolder) != "holder-a" {
		t.Fatalf("token_regression evidence stored (%d, %s), want (5, holder-a)", stored, storedHolder)
	}
	if n := counterValue(e.svc.m.tokenRegressions); n != 1 {
		t.Fatalf("token regression counter %v, want 1", n)
	}
}
