// Package e2e holds whole-system tests: the real binary as child processes,
// real PostgreSQL, embedded etcd.
package e2e

import (
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/payouts/payouts/dev/proctest"
)

func TestMain(m *testing.M) {
	// Whole-system tests abandon ambiguous payouts without waiting a day.
	os.Setenv("PAYOUTS_RESOLUTION_SLA", "1ms")
	code := m.Run()
	proctest.Cleanup()
	os.Exit(code)
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func listenTCP(port int) (net.Listener, error) {
	return net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
}
