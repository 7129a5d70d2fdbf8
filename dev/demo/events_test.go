package demo

import "testing"

// TestUnfencedNeedsEachHolderFencedAtItsGuard: two events at the payment
// guard for one holder do not make up for none at the proxy for the other.
func TestUnfencedNeedsEachHolderFencedAtItsGuard(t *testing.T) {
	frozen := []stale{
		{name: "exec-2", key: "payout:a", token: 5, guard: "payment"},
		{name: "exec-3", key: "payout:b", token: 7, guard: "proxy"},
	}
	twiceAtPayment := []fenceEvent{
		{guard: "payment", key: "payout:a", presented: 5, stored: 9},
		{guard: "payment", key: "payout:a", presented: 5, stored: 9},
	}
	if got := unfenced(twiceAtPayment, frozen); len(got) != 1 || got[0].name != "exec-3" {
		t.Fatalf("unfenced = %+v, want exec-3", got)
	}
	atWrongGuard := append(twiceAtPayment, fenceEvent{guard: "payment", key: "payout:b", presented: 7, stored: 9})
	if got := unfenced(atWrongGuard, frozen); len(got) != 1 || got[0].name != "exec-3" {
		t.Fatalf("unfenced = %+v, want exec-3 (fenced at the payment guard, not at the proxy)", got)
	}
	both := append(twiceAtPayment, fenceEvent{guard: "proxy", key: "payout:b", presented: 7, stored: 8})
	if got := unfenced(both, frozen); len(got) != 0 {
		t.Fatalf("unfenced = %+v, want none", got)
	}
}
