//go:build !negativecontrol

package payment

import (
	"strings"
	"testing"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

// TestReleaseBuildPrimariesOn: a build without the negativecontrol tag
// carries guard 1's fence condition and enforces the transition table
// (INV-01, INV-05, INV-08): decide refuses every pair the table does not
// list.
func TestReleaseBuildPrimariesOn(t *testing.T) {
	if !guardEnabled || !transitionTableEnabled {
		t.Fatalf("release build: guardEnabled=%v transitionTableEnabled=%v, want both true", guardEnabled, transitionTableEnabled)
	}
	states := []pc.State{pc.Pending, pc.Claimed, pc.RailSubmitted, pc.RailAcked, pc.RailAmbiguous, pc.Posted, pc.Failed, pc.Abandoned}
	for _, s := range states {
		for _, ev := range Events {
			want, listed := Next(s, ev)
			got, ok := decide(s, ev)
			if ok != listed || got != want {
				t.Errorf("decide(%s, %s) = %s, %v; the table says %s, %v", s, ev, got, ok, want, listed)
			}
		}
	}
}

// TestReleaseBuildGuardCondition: guard 1's statement judges acceptance
// (the negative-control build answers true instead).
func TestReleaseBuildGuardCondition(t *testing.T) {
	if !strings.Contains(guardSQL, "(fence_token = $2 AND fence_holder = $3)") {
		t.Fatal("release build: guard 1 lost its fence condition")
	}
}

// TestReleaseBuildGuardDisabledIsZero: a release build exports
// payouts_payment_guard_disabled 0 (the PayoutsGuardDisabled alert pages on 1).
func TestReleaseBuildGuardDisabledIsZero(t *testing.T) {
	if v := guardDisabledGauge(t); v != 0 {
		t.Fatalf("release build: payouts_payment_guard_disabled = %v, want 0", v)
	}
}
