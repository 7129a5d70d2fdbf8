package railproxy

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// A proxydb restored from a backup taken before two payouts were submitted
// has lost their records, so the executor, finding them RAIL_SUBMITTED and
// the proxy holding no forwarded submission, resubmits them (D-4). The
// proxy asks the rail first: what the rail holds is recorded from its
// record and nothing is sent again (one payment each at the rail), with a
// duplicate_attempt event as the evidence. A payout the rail has no
// payment of is sent once the rail's answer is final, and not before.
func TestAResubmissionIsSentOnlyIfTheRailHoldsNoPaymentOfIt(t *testing.T) {
	t.Parallel()
	const window = time.Hour // on the rail's fake clock
	b := setup(t, options{window: window})
	ctx := ctxFor(t)

	paid, declined := sub("p-paid", "acc-rs1"), sub("p-declined", "acc-rs2")
	declined.BeneficiaryRef = railclient.DefaultDeclinePrefix + "-1"
	first, err := b.pc.Submit(ctx, paid, 1, holder(1))
	if err != nil || first.Outcome != proxyclient.OutcomeAcked {
		t.Fatalf("first submission: %+v %v", first, err)
	}
	firstDeclined, err := b.pc.Submit(ctx, declined, 1, holder(1))
	if err != nil || firstDeclined.Outcome != proxyclient.OutcomeRejected {
		t.Fatalf("first submission of the declined payout: %+v %v", firstDeclined, err)
	}

	// The restored proxydb: empty, over the same rail.
	restored := setup(t, options{railURL: b.railURL})
	unseen := sub("p-unseen", "acc-rs3")
	for _, s := range []*proxyclient.Submission{&paid, &declined, &unseen} {
		s.Resubmission = true
	}

	rec, err := restored.pc.Submit(ctx, paid, 2, holder(2))
	if err != nil || rec.Outcome != proxyclient.OutcomeAcked || rec.RailRef != first.RailRef {
		t.Fatalf("resubmission of a payout the rail paid: %+v %v; want ACKED with the rail's ref %s", rec, err, first.RailRef)
	}
	rec, err = restored.pc.Submit(ctx, declined, 2, holder(2))
	if err != nil || rec.Outcome != proxyclient.OutcomeRejected || rec.ErrorCode != firstDeclined.ErrorCode {
		t.Fatalf("resubmission of a payout the rail declined: %+v %v; want REJECTED %s", rec, err, firstDeclined.ErrorCode)
	}
	for _, s := range []proxyclient.Submission{paid, declined} {
		if got := b.atRail(t, s.ClientRef); len(got) != 1 {
			t.Errorf("%s: %d payments at the rail, want 1: %+v", s.PayoutID, len(got), got)
		}
	}
	var evidence []string
	for _, e := range restored.safetyEvents(t) {
		if e.Kind == proxyclient.KindDuplicateAttempt {
			evidence = append(evidence, e.PayoutID)
		}
	}
	slices.Sort(evidence)
	if want := []string{declined.PayoutID, paid.PayoutID}; !slices.Equal(evidence, want) {
		t.Errorf("duplicate_attempt events for %v, want %v", evidence, want)
	}

	// No payment of it, but the rail cannot say so finally yet: nothing
	// recorded, nothing sent, submit again later.
	rec, err = restored.pc.Submit(ctx, unseen, 2, holder(2))
	if !proxyclient.PausedUnforwarded(err) {
		t.Fatalf("resubmission the rail cannot answer finally: %+v %v; want 503 with forwarded false", rec, err)
	}
	if got := b.atRail(t, unseen.ClientRef); len(got) != 0 {
		t.Fatalf("%d payments at the rail for a resubmission not confirmed absent, want 0", len(got))
	}
	if _, err := restored.pc.Get(ctx, unseen.PayoutID); !problem.Has(err, problem.NotFound) {
		t.Fatalf("the proxy's record of a resubmission it answered 503: %v, want none", err)
	}

	// Final and absent: sent, once.
	b.clock.Advance(window + time.Minute)
	rec, err = restored.pc.Submit(ctx, unseen, 2, holder(2))
	if err != nil || rec.Outcome != proxyclient.OutcomeAcked {
		t.Fatalf("resubmission the rail holds nothing of: %+v %v; want ACKED", rec, err)
	}
	if got := b.atRail(t, unseen.ClientRef); len(got) != 1 {
		t.Fatalf("%d payments at the rail, want 1", len(got))
	}
	if got := counterValue(t, restored.proxy.m.resubmissionChecks.WithLabelValues("held")); got != 2 {
		t.Errorf("resubmission checks that found a payment at the rail: %v, want 2", got)
	}
}

// A resubmission whose rail cannot be asked is neither recorded nor sent,
// and a stale holder's is fenced out before the rail is asked.
func TestAResubmissionIsNotSentWhenTheRailCannotBeAsked(t *testing.T) {
	t.Parallel()
	b := setup(t, options{railURL: "http://127.0.0.1:1", railTimeout: 5 * time.Second})
	ctx := ctxFor(t)
	s := sub("p-norail", "acc-rs5")
	s.Resubmission = true
	if rec, err := b.pc.Submit(ctx, s, 3, holder(3)); !proxyclient.PausedUnforwarded(err) {
		t.Fatalf("resubmission with the rail unreachable: %+v %v; want 503 with forwarded false", rec, err)
	}
	if _, err := b.pc.Get(ctx, s.PayoutID); !problem.Has(err, problem.NotFound) {
		t.Fatalf("the proxy's record of a resubmission it answered 503: %v, want none", err)
	}
	// A later holder's submission of another payout of the account raises
	// the high-water; the earlier holder's resubmission is then fenced out.
	other := sub("p-other", "acc-rs5")
	if rec, err := b.pc.Submit(ctx, other, 4, holder(4)); err != nil || rec.Outcome != proxyclient.OutcomeTimeout {
		t.Fatalf("a submission to a rail that does not exist: %+v %v, want TIMEOUT", rec, err)
	}
	if _, err := b.pc.Submit(ctx, s, 3, holder(3)); !problem.Has(err, problem.FencedOut) {
		t.Fatalf("a stale holder's resubmission: %v, want fenced_out", err)
	}
}

// TestAResubmissionWaitsForThisProxysOwnSend: proxydb failed over to a
// replica that lost a submission's row while this proxy was still sending
// it (its rail call on its way, or an item waiting for a slot). The rail
// has not seen it yet and answers, finally, that it holds no payment; sent
// now, the resubmission would be paid and then the earlier send too. The
// proxy answers 503, nothing recorded or sent, until its own send is done.
func TestAResubmissionWaitsForThisProxysOwnSend(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Now()}
	railURL, entered, free := heldRail(t, clock, http.MethodPost) // the first send
	b := setup(t, options{railURL: railURL})
	ctx := ctxFor(t)

	s := sub("p-own", "acc-own")
	first := make(chan error, 1)
	go func() {
		_, err := b.pc.Submit(ctx, s, 1, holder(1))
		first <- err
	}()
	select {
	case <-entered:
	case <-time.After(time.Minute):
		t.Fatal("the first submission never reached the rail")
	}
	// The failover loses its row; the rail's answer about it is final.
	tx, err := b.proxy.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM rail_submission WHERE payout_id = $1`, s.PayoutID); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Minute)

	again := s
	again.Resubmission = true
	rec, err := b.pc.Submit(ctx, again, 2, holder(2))
	if !proxyclient.PausedUnforwarded(err) {
		t.Fatalf("resubmission while this proxy still sends the payout: %+v %v; want 503 with forwarded false", rec, err)
	}
	free()
	<-first // its row is gone: its outcome cannot be recorded, and the payout is then ambiguous
	if got := b.atRail(t, s.ClientRef); len(got) != 1 {
		t.Fatalf("%d payments at the rail, want 1: %+v", len(got), got)
	}
}
