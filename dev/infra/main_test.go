package infra_test

import (
	"testing"

	"github.com/payouts/payouts/lock/backend/backendtest"
)

// TestMain fails the binary on goroutines that outlive the tests, with the
// same allowances as the lock backends' tests: the three-node leader-loss
// test stops a member while its peers stream to it, and etcd leaves that
// peer connection's server read running (see backendtest.Main).
func TestMain(m *testing.M) {
	backendtest.Main(m, func(m *testing.M) int { return m.Run() })
}
