package cmd

import (
	"testing"

	"github.com/payouts/payouts/dev/proctest"
)

// TestMain removes the binary a test built (proctest.Binary) and fails the
// run when a test leaves goroutines behind.
func TestMain(m *testing.M) { proctest.Main(m, nil) }
