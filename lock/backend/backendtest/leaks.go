package backendtest

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// leakIgnores are the etcd client's gRPC goroutines that finish
// asynchronously after clientv3.Client.Close returns (the resolver's
// callback serializer and a transport mid-reconnect). Anything else still
// running after the tests, pgx pools and the embedded etcd server included,
// is a leak.
var leakIgnores = []goleak.Option{
	goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	goleak.IgnoreAnyFunction("google.golang.org/grpc.(*addrConn).resetTransportAndUnlock"),
}

// Main runs the tests with run (which also stops what the binary started)
// and then fails the binary if goroutines other than the known background
// loops above are still running: a test that leaves its session loop,
// watch or server running is a leak.
func Main(m *testing.M, run func(*testing.M) int) {
	code := run(m)
	if code == 0 {
		if err := goleak.Find(leakIgnores...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: goroutines outlived the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}
