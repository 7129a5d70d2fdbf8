//go:build !negativecontrol

package pgbackend

import (
	"strings"
	"testing"
)

// TestReleaseBuildExclusionOn: a build without the negativecontrol tag
// takes over a key only from a session that is no longer live (INV-06).
func TestReleaseBuildExclusionOn(t *testing.T) {
	if !exclusionEnabled || !strings.HasPrefix(takeoverSQL, "NOT cur.live AND ") || !strings.Contains(acquireSQL, "AND "+takeoverSQL+"\n") {
		t.Fatalf("release build: exclusionEnabled=%v takeoverSQL=%q", exclusionEnabled, takeoverSQL)
	}
}
