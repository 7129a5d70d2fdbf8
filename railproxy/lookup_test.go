package railproxy

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

func TestLookupResolvesAmbiguityOnceAfterTheSettlementWindow(t *testing.T) {
	t.Parallel()
	const window = time.Hour // on the rail's fake clock
	b := setup(t, options{window: window})
	ctx := ctxFor(t)

	b.setFaults(t, railclient.Faults{ErrorAfterAccept: 1})
	paid := sub("p-paid", "acc-l1")
	if rec, err := b.pc.Submit(ctx, paid, 1, holder(1)); err != nil || rec.Outcome != proxyclient.OutcomeTimeout {
		t.Fatalf("submit: %+v %v", rec, err)
	}
	b.setFaults(t, railclient.Faults{ErrorBeforeAccept: 1})
	unpaid := sub("p-unpaid", "acc-l2")
	if rec, err := b.pc.Submit(ctx, unpaid, 1, holder(1)); err != nil || rec.Outcome != proxyclient.OutcomeTimeout {
		t.Fatalf("submit: %+v %v", rec, err)
	}
	b.setFaults(t, railclient.Faults{})
	acked := sub("p-acked", "acc-l3")
	if rec, err := b.pc.Submit(ctx, acked, 1, holder(1)); err != nil || rec.Outcome != proxyclient.OutcomeAcked {
		t.Fatalf("submit: %+v %v", rec, err)
	}

	// Before the window: not final, nothing recorded — even though the rail
	// already shows the payment.
	for _, s := range []proxyclient.Submission{paid, unpaid} {
		l, err := b.recon.Lookup(ctx, s.PayoutID)
		if err != nil {
			t.Fatal(err)
		}
		if l.Final || l.Recorded || l.Resolution != proxyclient.ResolutionNone || l.Submission.Resolution != proxyclient.ResolutionNone {
			t.Fatalf("%s before the window: %+v", s.PayoutID, l)
		}
	}
	if l, _ := b.recon.Lookup(ctx, paid.PayoutID); len(l.RailItems) != 1 {
		t.Fatalf("rail items before the window: %+v", l.RailItems)
	}

	b.clock.Advance(window + time.Minute)
	for _, tc := range []struct {
		s    proxyclient.Submission
		want proxyclient.Resolution
	}{{paid, proxyclient.ResolutionSettled}, {unpaid, proxyclient.ResolutionAbsent}} {
		l, err := b.recon.Lookup(ctx, tc.s.PayoutID)
		if err != nil {
			t.Fatal(err)
		}
		if !l.Final || !l.Recorded || l.Resolution != tc.want || l.Submission.Resolution != tc.want || l.Submission.ResolutionAt == nil {
			t.Fatalf("%s after the window: %+v", tc.s.PayoutID, l)
		}
		var ev evidence
		if err := json.Unmarshal(l.Submission.ResolutionEvidence, &ev); err != nil || !ev.Final || ev.ClientRef != tc.s.ClientRef {
			t.Fatalf("evidence %s: %v", l.Submission.ResolutionEvidence, err)
		}
		// Once: a second lookup returns the recorded resolution and writes nothing.
		again, err := b.recon.Lookup(ctx, tc.s.PayoutID)
		if err != nil || again.Recorded || again.Resolution != tc.want || !again.Submission.ResolutionAt.Equal(*l.Submission.ResolutionAt) {
			t.Fatalf("second lookup: %+v %v", again, err)
		}
		// The outcome itself is never edited (D-6).
		rec, err := b.pc.Get(ctx, tc.s.PayoutID)
		if err != nil || rec.Outcome != proxyclient.OutcomeTimeout || rec.Resolution != tc.want {
			t.Fatalf("record after resolution: %+v %v", rec, err)
		}
	}

	// A definitive outcome is reported on, not resolved.
	l, err := b.recon.Lookup(ctx, acked.PayoutID)
	if err != nil || !l.Final || l.Recorded || l.Resolution != proxyclient.ResolutionSettled || l.Submission.Resolution != proxyclient.ResolutionNone {
		t.Fatalf("lookup of an ACKED submission: %+v %v", l, err)
	}

	// Nothing forwarded: nothing to look up.
	if _, err := b.recon.Lookup(ctx, "never"); !problem.Has(err, problem.NotFound) {
		t.Fatalf("lookup of an unknown payout: %v", err)
	}
	if guardEnabled {
		if _, err := b.pc.Submit(ctx, sub("p-fenced", "acc-l1"), 1, "someone-else"); !problem.Has(err, problem.FencedOut) {
			t.Fatalf("want a FENCED attempt: %v", err)
		}
		if _, err := b.recon.Lookup(ctx, "p-fenced"); !problem.Has(err, problem.NotFound) {
			t.Fatalf("lookup of a payout with only a FENCED attempt: %v", err)
		}
	}
}

// The process dies between committing the intent and calling the rail:
// after restart the row has no outcome, nothing is at the rail and nothing
// is retried; a lookup after the window records ABSENT.
func TestCrashAfterIntent(t *testing.T) {
	t.Parallel()
	testCrash(t, CrashAfterIntent, 0, proxyclient.ResolutionAbsent)
}

// The process dies after the rail answered and before recording it: the row
// has no outcome, one payment is at the rail; a lookup records SETTLED.
func TestCrashAfterRailAnswer(t *testing.T) {
	t.Parallel()
	testCrash(t, CrashAfterRailAnswer, 1, proxyclient.ResolutionSettled)
}

func testCrash(t *testing.T, point string, wantAtRail int, wantResolution proxyclient.Resolution) {
	const window = time.Hour
	b := setup(t, options{window: window, railTimeout: time.Second})
	ctx := ctxFor(t)
	s := sub("p-crash", "acc-crash")

	crashing, wait := startCrashingProxy(t, b, point)
	_, err := crashing.Submit(ctx, s, 4, holder(4))
	if !errors.Is(err, httpx.ErrTransport) {
		t.Fatalf("submit to a crashing proxy: %v, want no answer", err)
	}
	if code := wait(); code != 3 {
		t.Fatalf("crash helper exit code %d, want 3", code)
	}

	// Restart: a new proxy process on the same database.
	b.startProxy(t, time.Second, "")
	rec, err := b.pc.Get(ctx, s.PayoutID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Outcome != proxyclient.OutcomeNone || rec.OutcomeAt != nil || rec.FenceToken != 4 {
		t.Fatalf("after the crash: %+v, want the intent with no outcome", rec)
	}
	if got := b.atRail(t, s.ClientRef); len(got) != wantAtRail {
		t.Fatalf("rail holds %d payments, want %d", len(got), wantAtRail)
	}
	// Nothing retries it: not the restarted proxy, not a new holder.
	_, err = b.pc.Submit(ctx, s, 9, holder(9))
	if existing, ok := proxyclient.ExistingRecord(err); !ok || existing.ID != rec.ID || existing.Outcome != proxyclient.OutcomeNone {
		t.Fatalf("resubmission after the crash: %v", err)
	}
	if got := b.atRail(t, s.ClientRef); len(got) != wantAtRail {
		t.Fatalf("rail holds %d payments after restart and resubmission, want %d", len(got), wantAtRail)
	}

	// Resolution: not final before the window, recorded once after it.
	if l, err := b.recon.Lookup(ctx, s.PayoutID); err != nil || l.Final || l.Recorded {
		t.Fatalf("lookup before the window: %+v %v", l, err)
	}
	b.clock.Advance(window + time.Minute)
	var l proxyclient.LookupResult
	eventually(t, "the resolution is recorded", func() (bool, error) {
		l, err = b.recon.Lookup(ctxFor(t), s.PayoutID)
		return l.Recorded || l.Submission.Resolution != proxyclient.ResolutionNone, err
	})
	if !l.Recorded || l.Resolution != wantResolution || l.Submission.Outcome != proxyclient.OutcomeNone {
		t.Fatalf("lookup after the window: %+v", l)
	}
	if got := b.atRail(t, s.ClientRef); len(got) != wantAtRail {
		t.Fatalf("rail holds %d payments at the end, want %d", len(got), wantAtRail)
	}
}
