//go:build negativecontrol

package negativecontrol

import "os"

// primariesRemoved: this build (and the servers it starts) carries the
// negative-control switches — guard 1 and guard 2 without their fence
// condition, the proxy's intent insert without its arbiter index, the
// payment resource without the transition table's refusal — and the
// scenarios remove the database-level primaries from the test's own
// databases.
const primariesRemoved = true

func init() {
	// The child processes are built with the same switches.
	tags := "negativecontrol"
	if t := os.Getenv("PAYOUTS_TEST_BUILD_TAGS"); t != "" {
		tags = t + ",negativecontrol"
	}
	os.Setenv("PAYOUTS_TEST_BUILD_TAGS", tags)
}
