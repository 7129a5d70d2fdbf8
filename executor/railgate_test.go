package executor

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
)

// TestRailGate: railTripAfter submissions in a row without a usable answer
// stop claims; while paused none is admitted until the pause runs out,
// then one (the probe); a failure after the probe doubles the pause (up to
// railPauseMax), the answers of submissions already in flight do not; any
// answer from the rail resumes claims at once.
func TestRailGate(t *testing.T) {
	var g railGate
	t0 := time.Unix(1_000_000, 0)
	for i := 1; i < railTripAfter; i++ {
		if ev, _, _ := g.observe(t0, false); ev != gateSame {
			t.Fatalf("failure %d: event %d, want none before %d in a row", i, ev, railTripAfter)
		}
		if n := g.admit(t0, 5); n != 5 {
			t.Fatalf("after %d failures admit = %d, want 5", i, n)
		}
	}
	// An answer in between starts the count over.
	g.observe(t0, true)
	for range railTripAfter - 1 {
		g.observe(t0, false)
	}
	if !g.pausedUntil().IsZero() {
		t.Fatal("paused without railTripAfter failures in a row")
	}
	ev, pause, failures := g.observe(t0, false)
	if ev != gatePaused || pause != railPauseMin || failures != railTripAfter {
		t.Fatalf("trip: event %d pause %s failures %d", ev, pause, failures)
	}
	if got := g.pausedUntil(); !got.Equal(t0.Add(railPauseMin)) {
		t.Fatalf("pausedUntil = %s, want %s", got, t0.Add(railPauseMin))
	}
	if n := g.admit(t0.Add(railPauseMin-time.Millisecond), 5); n != 0 {
		t.Fatalf("admit during the pause = %d, want 0", n)
	}
	// Answers of submissions in flight when the pause began do not extend it.
	if ev, _, _ := g.observe(t0.Add(time.Second), false); ev != gateSame {
		t.Fatalf("an in-flight failure changed the pause: event %d", ev)
	}
	// The probe: one payout, then none until the next pause has run out.
	t1 := t0.Add(railPauseMin)
	if n := g.admit(t1, 5); n != 1 {
		t.Fatalf("admit once the pause ran out = %d, want 1 (the probe)", n)
	}
	if n := g.admit(t1, 5); n != 0 {
		t.Fatalf("a second admit after the probe = %d, want 0", n)
	}
	ev, pause, _ = g.observe(t1, false)
	if ev != gateExtended || pause != 2*railPauseMin {
		t.Fatalf("failed probe: event %d pause %s, want the pause doubled", ev, pause)
	}
	// Doubling stops at railPauseMax.
	now := t1
	for range 10 {
		now = g.pausedUntil()
		if g.admit(now, 1) != 1 {
			t.Fatal("no probe once the pause ran out")
		}
		_, pause, _ = g.observe(now, false)
	}
	if pause != railPauseMax {
		t.Fatalf("pause after many failed probes = %s, want %s", pause, railPauseMax)
	}
	// An answer from the rail resumes claims.
	if ev, _, _ := g.observe(now, true); ev != gateResumed {
		t.Fatalf("answer while paused: event %d, want resumed", ev)
	}
	if n := g.admit(now, 5); n != 5 || !g.pausedUntil().IsZero() {
		t.Fatalf("after the rail answered: admit %d, pausedUntil %s", n, g.pausedUntil())
	}
	// A zero request is never a probe.
	var h railGate
	for range railTripAfter {
		h.observe(t0, false)
	}
	if h.admit(t0.Add(time.Hour), 0) != 0 || h.admit(t0.Add(time.Hour), 3) != 1 {
		t.Fatal("a round with nothing to claim used up the probe")
	}
}

// TestRailOutagePausesClaims: while the rail drops every connection, an
// executor stops claiming new payouts after railTripAfter submissions got no
// usable answer (payouts_executor_rail_paused = 1), instead of turning every
// PENDING payout into RAIL_AMBIGUOUS; its probes get no answer either and
// the pause grows. Once the rail answers again, a probe is paid, claims
// resume and every payout left PENDING is paid.
func TestRailOutagePausesClaims(t *testing.T) {
	t.Parallel() // owns its stack and databases
	s := setup(t)
	ctx := context.Background()
	if _, err := s.rail.SetFaults(ctx, railclient.Faults{DropBeforeAccept: 1}.Full()); err != nil {
		t.Fatal(err)
	}
	const accounts = 40
	ids := make([]string, accounts)
	for i := range ids {
		acc := fmt.Sprintf("gate-%02d", i)
		if _, err := s.pay.CreateAccount(ctx, pc.CreateAccountRequest{ID: acc, Currency: "EUR", OpeningBalance: 1_000}); err != nil {
			t.Fatal(err)
		}
		ids[i] = acc + "-p"
		if _, err := s.pay.CreatePayout(ctx, pc.CreatePayoutRequest{ID: ids[i], AccountID: acc, Amount: 100, Currency: "EUR", BeneficiaryRef: "BEN-" + ids[i]}); err != nil {
			t.Fatal(err)
		}
	}
	logs := newSyncBuf()
	cfg := s.config(t, "exec-gate", logs)
	reg := cfg.Registry
	_, stop := startExecutor(t, cfg)
	defer stop()

	waitFor(t, 2*time.Minute, "claims to pause and a probe to get no answer", func() bool {
		return gathered(t, reg, "payouts_executor_rail_paused") == 1 &&
			strings.Contains(logs.String(), "the probe payout got no usable answer")
	})
	// Up to the trip, the payouts the workers had in hand when it came, and
	// the probes: the rest stays PENDING.
	claimed := 0
	for _, id := range ids {
		if s.state(t, id) != pc.Pending {
			claimed++
		}
	}
	t.Logf("%d of %d payouts claimed during the outage", claimed, accounts)
	if limit := railTripAfter + 2*cfg.Concurrency + 2; claimed > limit {
		t.Fatalf("%d of %d payouts were claimed during the outage, want at most %d", claimed, accounts, limit)
	}
	if gathered(t, reg, "payouts_executor_rail_pauses_total") != 1 {
		t.Errorf("payouts_executor_rail_pauses_total = %v, want 1", gathered(t, reg, "payouts_executor_rail_pauses_total"))
	}

	if _, err := s.rail.SetFaults(ctx, railclient.Faults{}.Full()); err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, id := range ids {
		if s.state(t, id) == pc.Pending {
			left = append(left, id)
		}
	}
	waitFor(t, 3*time.Minute, "the payouts left PENDING to be paid once the rail answers", s.allIn(t, left, pc.Posted))
	if gathered(t, reg, "payouts_executor_rail_paused") != 0 || !strings.Contains(logs.String(), "the rail answered again") {
		t.Error("claims resumed without the gauge and the log saying so")
	}
}
