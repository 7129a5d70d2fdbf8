package cmd

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/payouts/payouts/dev/proctest"
)

// TestMain removes the binary a test built (proctest.Binary) and fails the
// run when a test leaves goroutines behind.
func TestMain(m *testing.M) {
	code := m.Run()
	proctest.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines left behind by the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
