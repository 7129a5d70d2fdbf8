//go:build !negativecontrol

package railproxy

import (
	"strings"
	"testing"
)

// TestReleaseBuildPrimariesOn: a build without the negativecontrol tag
// carries guard 2's fence condition and the unique-intent arbiter (INV-02,
// INV-05).
func TestReleaseBuildPrimariesOn(t *testing.T) {
	if !guardEnabled || !uniqueIntentEnabled {
		t.Fatalf("release build: guardEnabled=%v uniqueIntentEnabled=%v, want both true", guardEnabled, uniqueIntentEnabled)
	}
	if !strings.Contains(highWaterSQL, "(hw.token = $2 AND hw.holder = $3)") {
		t.Fatal("release build: guard 2 lost its fence condition")
	}
	if !strings.Contains(intentSQL, "ON CONFLICT (payout_id) WHERE outcome IS DISTINCT FROM 'FENCED' DO NOTHING") {
		t.Fatal("release build: the intent insert lost its arbiter index")
	}
}
