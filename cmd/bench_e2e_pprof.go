//go:build pprof

package cmd

import (
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"strconv"

	"github.com/payouts/payouts/dev/bench"
)

// A binary built with -tags pprof serves net/http/pprof on a loopback port
// of its own when PAYOUTS_PPROF_ADDR_DIR is set, and writes the address to
// DIR/PID.addr, so `payouts bench e2e --profile` can profile every role it
// starts. Release builds carry none of this.
func init() {
	dir := os.Getenv(bench.E2EProfileEnv)
	if dir == "" {
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	go func() { _ = http.Serve(ln, mux) }()
	_ = os.WriteFile(filepath.Join(dir, strconv.Itoa(os.Getpid())+".addr"), []byte(ln.Addr().String()), 0o644)
}
