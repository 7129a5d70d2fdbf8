package reconcile_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/reconcile"
)

func TestStateFileRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	st, err := reconcile.LoadState(path)
	if err != nil || st != (reconcile.State{}) {
		t.Fatalf("missing file: %+v, %v; want the zero state", st, err)
	}
	want := reconcile.State{SafetyEventsAfter: reconcile.EventCursor{Payment: 7, Proxy: 3}}
	if err := reconcile.SaveState(path, want); err != nil {
		t.Fatal(err)
	}
	if got, err := reconcile.LoadState(path); err != nil || got != want {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, want)
	}
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := reconcile.LoadState(path); err == nil {
		t.Fatal("a corrupt state file was accepted")
	}
}

// TestSafetyEventsReportedOncePerCursor: with the cursor of the previous
// pass, an event already reported is not reported again, and a new one is.
func TestSafetyEventsReportedOncePerCursor(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	done := e.payOut(t, e.newPayout(t, acc, 10))
	stale := done.Token
	key := fencing.Key(acc)
	p := e.newPayout(t, acc, 10)
	g := e.grant(t, acc)
	defer e.release(t, g)
	ctx := ctxT(t)
	if _, err := e.pay.Claim(ctx, p.ID, g.Token, g.Holder()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pay.Claim(ctx, p.ID, stale, "stale-1"); !problem.Has(err, problem.FencedOut) {
		t.Fatalf("stale claim: %v, want fenced_out", err)
	}
	first := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	mustFind(t, first, reconcile.INV05, reconcile.CheckFencedOut, map[string]any{"key": key, "holder": "stale-1"})
	if first.SafetyEventsSeen.Payment == 0 {
		t.Fatal("the report does not say how far it read the payment resource's safety events")
	}

	second := pass(t, e.reconciler(t, reconcile.Options{SafetyEventsAfter: first.SafetyEventsSeen}, e.st.Ready.Tokens.Operator))
	mustNotFind(t, second, reconcile.CheckFencedOut, map[string]any{"key": key, "holder": "stale-1"})

	if _, err := e.pay.Claim(ctx, p.ID, stale, "stale-2"); !problem.Has(err, problem.FencedOut) {
		t.Fatalf("second stale claim: %v, want fenced_out", err)
	}
	third := pass(t, e.reconciler(t, reconcile.Options{SafetyEventsAfter: second.SafetyEventsSeen}, e.st.Ready.Tokens.Operator))
	mustFind(t, third, reconcile.INV05, reconcile.CheckFencedOut, map[string]any{"key": key, "holder": "stale-2"})
	mustNotFind(t, third, reconcile.CheckFencedOut, map[string]any{"key": key, "holder": "stale-1"})
}
