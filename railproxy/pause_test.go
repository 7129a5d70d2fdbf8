package railproxy

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/railgate"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// TestRailPauseStopsForwarding: after railgate.TripAfter submissions in a
// row got no usable answer from the rail, the proxy forwards no new one —
// from any executor — until the pause has run out: it answers 503
// unavailable with forwarded=false and Retry-After, records nothing and
// sends nothing. A stale token is still fenced out, with its evidence.
// Once the pause has run out one submission goes through as a probe (of a
// batch, the first item; the others are answered as paused); a probe with
// no answer doubles the pause, the first answer from the rail ends it, and
// a payout refused during the pause is then forwarded, once.
func TestRailPauseStopsForwarding(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	b := setup(t, options{now: clock.Now})
	ctx := ctxFor(t)

	// An account whose high-water is 5, for the stale token below.
	if _, err := b.pc.Submit(ctx, sub("pz-b0", "acc-b"), 5, holder(5)); err != nil {
		t.Fatal(err)
	}

	b.setFaults(t, railclient.Faults{ErrorBeforeAccept: 1}) // 503 from the rail: TIMEOUT
	for i := range railgate.TripAfter {
		id := "pz-a" + string(rune('0'+i))
		rec, err := b.pc.Submit(ctx, sub(id, "acc-a"), 1, holder(1))
		if err != nil || rec.Outcome != proxyclient.OutcomeTimeout {
			t.Fatalf("submission %d: %+v, %v; want a TIMEOUT record", i, rec, err)
		}
	}
	if testutil.ToFloat64(b.proxy.m.railPaused) != 1 || testutil.ToFloat64(b.proxy.m.railPauses) != 1 {
		t.Fatal("not paused after TripAfter submissions without an answer")
	}
	if !strings.Contains(b.logs.String(), "forwarding no new submissions for a while") {
		t.Error("no WARN line when forwarding paused")
	}

	// Paused: not recorded, not forwarded, and said so.
	_, err := b.pc.Submit(ctx, sub("pz-held", "acc-a"), 1, holder(1))
	if !proxyclient.PausedUnforwarded(err) {
		t.Fatalf("submission while paused: %v, want 503 unavailable with forwarded=false", err)
	}
	status, header, _ := postRawHeader(t, b.url+"/v1/submissions", `{"payout_id":"pz-held","account_id":"acc-a","token":1,"holder":"session-1","client_ref":"po-pz-held","amount":1250,"currency":"EUR","beneficiary_ref":"ben-pz-held"}`)
	if status != http.StatusServiceUnavailable || header.Get("Retry-After") != "2" {
		t.Fatalf("raw submission while paused: status %d, Retry-After %q; want 503 and 2", status, header.Get("Retry-After"))
	}
	if _, err := b.pc.Get(ctx, "pz-held"); !problem.Has(err, problem.NotFound) {
		t.Fatalf("a paused submission was recorded: %v", err)
	}
	if got := testutil.ToFloat64(b.proxy.m.pausedRefusals); got != 2 {
		t.Fatalf("payouts_proxy_paused_submissions_total = %v, want 2", got)
	}

	// A stale token during the pause is fenced out as always.
	before := len(b.safetyEvents(t))
	if _, err := b.pc.Submit(ctx, sub("pz-b1", "acc-b"), 3, holder(3)); !problem.Has(err, problem.FencedOut) {
		t.Fatalf("stale token while paused: %v, want fenced_out", err)
	}
	if evs := b.safetyEvents(t); len(evs) != before+1 || evs[len(evs)-1].Kind != proxyclient.KindFencedOut {
		t.Fatalf("no fenced_out evidence for a stale token refused during the pause: %+v", evs)
	}

	// A payout already forwarded, submitted again during the pause, is a
	// duplicate attempt as when the rail answers: 409 submission_exists
	// and its evidence (it was a 503 "submit it again later", no row).
	before = len(b.safetyEvents(t))
	if _, err := b.pc.Submit(ctx, sub("pz-a0", "acc-a"), 1, holder(1)); !problem.Has(err, problem.SubmissionExists) {
		t.Fatalf("a forwarded payout submitted again while paused: %v, want submission_exists", err)
	}
	if evs := b.safetyEvents(t); len(evs) != before+1 || evs[len(evs)-1].Kind != proxyclient.KindDuplicateAttempt {
		t.Fatalf("no duplicate_attempt evidence for a forwarded payout submitted again during the pause: %+v", evs)
	}

	// The pause runs out: the first item of a batch is the probe, the rest
	// are answered as paused. The rail still fails: the pause doubles.
	clock.Advance(railgate.PauseMin)
	items := []proxyclient.BatchItem{batchItem("pz-c0"), batchItem("pz-c1"), batchItem("pz-c2")}
	res, err := b.pc.SubmitBatch(ctx, "acc-a", 1, holder(1), items)
	if err != nil || len(res) != 3 {
		t.Fatalf("batch at the probe: %+v, %v", res, err)
	}
	if res[0].Err != nil || res[0].Record.Outcome != proxyclient.OutcomeTimeout {
		t.Fatalf("probe item: %+v, want forwarded (TIMEOUT)", res[0])
	}
	for _, r := range res[1:] {
		if !proxyclient.PausedUnforwarded(r.Err) {
			t.Fatalf("item %s after the probe: %v, want paused (forwarded=false)", r.PayoutID, r.Err)
		}
	}
	if !strings.Contains(b.logs.String(), "the probe submission got no usable answer") {
		t.Error("no WARN line for the failed probe")
	}
	clock.Advance(railgate.PauseMin) // half of the doubled pause
	if _, err := b.pc.Submit(ctx, sub("pz-held", "acc-a"), 1, holder(1)); !proxyclient.PausedUnforwarded(err) {
		t.Fatalf("before the doubled pause ran out: %v, want paused", err)
	}

	// The rail answers again: the next probe is paid and ends the pause.
	b.setFaults(t, railclient.Faults{})
	clock.Advance(railgate.PauseMin)
	if rec, err := b.pc.Submit(ctx, sub("pz-held", "acc-a"), 1, holder(1)); err != nil || rec.Outcome != proxyclient.OutcomeAcked {
		t.Fatalf("probe with the rail answering: %+v, %v; want ACKED", rec, err)
	}
	if testutil.ToFloat64(b.proxy.m.railPaused) != 0 || !strings.Contains(b.logs.String(), "the rail answered again") {
		t.Fatal("the pause did not end with the rail's answer")
	}
	if rec, err := b.pc.Submit(ctx, sub("pz-c1", "acc-a"), 1, holder(1)); err != nil || rec.Outcome != proxyclient.OutcomeAcked {
		t.Fatalf("after the pause: %+v, %v; want forwarded at once", rec, err)
	}
	for _, ref := range []string{"po-pz-held", "po-pz-c1"} {
		if n := len(b.atRail(t, ref)); n != 1 {
			t.Fatalf("%s is at the rail %d times, want once", ref, n)
		}
	}
}

func batchItem(id string) proxyclient.BatchItem {
	s := sub(id, "")
	return proxyclient.BatchItem{PayoutID: s.PayoutID, ClientRef: s.ClientRef, Amount: s.Amount, Currency: s.Currency, BeneficiaryRef: s.BeneficiaryRef}
}

// TestPausedWithProxydbDownIsNotForwarded: while the rail is paused and
// proxydb cannot be reached, a submission's fence cannot be checked; it is
// answered 503 unavailable, and still forwarded=false: nothing was written
// or sent, so the executor may submit the payout again later.
func TestPausedWithProxydbDownIsNotForwarded(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for range railgate.TripAfter {
		b.proxy.railAnswer(b.proxy.log, false)
	}
	b.proxy.pool.Close()
	_, err := b.pc.Submit(ctxFor(t), sub("pz-down", "acc-a"), 1, holder(1))
	if !proxyclient.PausedUnforwarded(err) {
		t.Fatalf("paused, proxydb down: %v; want 503 unavailable with forwarded=false", err)
	}
}
