//go:build negativecontrol

package railproxy

import (
	"testing"

	"github.com/payouts/payouts/railproxy/proxyclient"
)

// With the fence condition compiled out, a stale token lands at the rail
// (the hole the guard closes), while the high-water mark still never moves
// backwards — which is what the detective controls compare against.
func TestNegativeControlStaleTokenLands(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := ctxFor(t)
	if _, err := b.pc.Submit(ctx, sub("p-1", "acc-nc"), 10, holder(10)); err != nil {
		t.Fatal(err)
	}
	rec, err := b.pc.Submit(ctx, sub("p-2", "acc-nc"), 5, holder(5))
	if err != nil || rec.Outcome != proxyclient.OutcomeAcked {
		t.Fatalf("stale submit under negativecontrol: %+v %v, want it forwarded", rec, err)
	}
	if got := b.atRail(t, "po-p-2"); len(got) != 1 {
		t.Fatalf("stale payment at the rail: %d, want 1", len(got))
	}
	if hw, _ := b.highWater(t, "acc-nc"); hw.Token != 10 {
		t.Fatalf("high-water %d, want 10 (never backwards)", hw.Token)
	}
	if rec.FenceToken >= 10 {
		t.Fatalf("recorded token %d: the detective control needs the stale token on the record", rec.FenceToken)
	}
}

// The batch path runs the same guard statement: with its fence condition
// compiled out, a stale batch lands at the rail too.
func TestNegativeControlStaleBatchLands(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := ctxFor(t)
	if _, err := b.pc.Submit(ctx, sub("p-1", "acc-ncb"), 10, holder(10)); err != nil {
		t.Fatal(err)
	}
	res, err := b.pc.SubmitBatch(ctx, "acc-ncb", 5, holder(5), batchItems("acc-ncb", "p-2", "p-3"))
	if err != nil || len(res) != 2 || res[0].Err != nil || res[1].Record.Outcome != proxyclient.OutcomeAcked {
		t.Fatalf("stale batch under negativecontrol: %+v %v, want it forwarded", res, err)
	}
	if got := b.atRail(t, "po-p-3"); len(got) != 1 {
		t.Fatalf("stale batch's payment at the rail: %d, want 1", len(got))
	}
	if hw, _ := b.highWater(t, "acc-ncb"); hw.Token != 10 {
		t.Fatalf("high-water %d, want 10 (never backwards)", hw.Token)
	}
}
