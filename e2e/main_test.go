// Package e2e holds whole-system tests: the real binary as child processes,
// real PostgreSQL, embedded etcd.
package e2e

import (
	"os"
	"testing"

	"github.com/payouts/payouts/dev/proctest"
)

func TestMain(m *testing.M) {
	// Whole-system tests abandon ambiguous payouts without waiting a day.
	os.Setenv("PAYOUTS_RESOLUTION_SLA", "1ms")
	// The stacks run in child processes; this process keeps only clients,
	// whose goroutines must all be gone by the end.
	proctest.Main(m, nil)
}
