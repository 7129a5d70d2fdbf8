package deploy_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run when a test leaves goroutines behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
