package railgate

import (
	"testing"
	"time"
)

// TestGate: TripAfter payments in a row without a usable answer
// stop new payments; while paused nothing is admitted until the pause runs out,
// then one payment (the probe); a failure after the probe doubles the pause (up to
// PauseMax), the answers of payments already in flight do not; any
// answer from the rail resumes payments at once.
func TestGate(t *testing.T) {
	var g Gate
	t0 := time.Unix(1_000_000, 0)
	for i := 1; i < TripAfter; i++ {
		if ev, _, _ := g.Observe(t0, false); ev != Same {
			t.Fatalf("failure %d: event %d, want none before %d in a row", i, ev, TripAfter)
		}
		if n := g.Admit(t0, 5); n != 5 {
			t.Fatalf("after %d failures admit = %d, want 5", i, n)
		}
	}
	// An answer in between starts the count over.
	g.Observe(t0, true)
	for range TripAfter - 1 {
		g.Observe(t0, false)
	}
	if !g.PausedUntil().IsZero() {
		t.Fatal("paused without TripAfter failures in a row")
	}
	ev, pause, failures := g.Observe(t0, false)
	if ev != Paused || pause != PauseMin || failures != TripAfter {
		t.Fatalf("trip: event %d pause %s failures %d", ev, pause, failures)
	}
	if got := g.PausedUntil(); !got.Equal(t0.Add(PauseMin)) {
		t.Fatalf("pausedUntil = %s, want %s", got, t0.Add(PauseMin))
	}
	if n := g.Admit(t0.Add(PauseMin-time.Millisecond), 5); n != 0 {
		t.Fatalf("admit during the pause = %d, want 0", n)
	}
	// Answers of submissions in flight when the pause began do not extend it.
	if ev, _, _ := g.Observe(t0.Add(time.Second), false); ev != Same {
		t.Fatalf("an in-flight failure changed the pause: event %d", ev)
	}
	// The probe: one payout, then none until the next pause has run out.
	t1 := t0.Add(PauseMin)
	if n := g.Admit(t1, 5); n != 1 {
		t.Fatalf("admit once the pause ran out = %d, want 1 (the probe)", n)
	}
	if n := g.Admit(t1, 5); n != 0 {
		t.Fatalf("a second admit after the probe = %d, want 0", n)
	}
	ev, pause, _ = g.Observe(t1, false)
	if ev != Extended || pause != 2*PauseMin {
		t.Fatalf("failed probe: event %d pause %s, want the pause doubled", ev, pause)
	}
	// Doubling stops at PauseMax.
	now := t1
	for range 10 {
		now = g.PausedUntil()
		if g.Admit(now, 1) != 1 {
			t.Fatal("no probe once the pause ran out")
		}
		_, pause, _ = g.Observe(now, false)
	}
	if pause != PauseMax {
		t.Fatalf("pause after many failed probes = %s, want %s", pause, PauseMax)
	}
	// An answer from the rail resumes claims.
	if ev, _, _ := g.Observe(now, true); ev != Resumed {
		t.Fatalf("answer while paused: event %d, want resumed", ev)
	}
	if n := g.Admit(now, 5); n != 5 || !g.PausedUntil().IsZero() {
		t.Fatalf("after the rail answered: admit %d, pausedUntil %s", n, g.PausedUntil())
	}
	// A zero request is never a probe.
	var h Gate
	for range TripAfter {
		h.Observe(t0, false)
	}
	if h.Admit(t0.Add(time.Hour), 0) != 0 || h.Admit(t0.Add(time.Hour), 3) != 1 {
		t.Fatal("a round with nothing to claim used up the probe")
	}
}
