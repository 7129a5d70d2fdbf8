// Package e2e holds whole-system tests: the real binary as child processes,
// real PostgreSQL, embedded etcd.
package e2e

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/payouts/payouts/dev/proctest"
)

func TestMain(m *testing.M) {
	// Whole-system tests abandon ambiguous payouts without waiting a day.
	os.Setenv("PAYOUTS_RESOLUTION_SLA", "1ms")
	code := m.Run()
	proctest.Cleanup()
	if code == 0 {
		// The stacks run in child processes; this process keeps only
		// clients, whose goroutines must all be gone by now.
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}
