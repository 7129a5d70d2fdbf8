package backendtest

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// leakIgnores are goroutines of etcd that outlive its Close by design:
//   - the etcd client's gRPC goroutines that finish asynchronously after
//     clientv3.Client.Close returns (the resolver's callback serializer and
//     a transport mid-reconnect);
//   - after a member of an embedded cluster is stopped while its peers
//     stream to it (the leader-loss test), the peer HTTP connection that
//     neither side closes: the member's cmux-wrapped server read and the
//     request it never finishes, and the peer transport's read and write
//     loops. Our own servers close every connection at shutdown, so a
//     leaked server of ours still shows by its other goroutines.
//
// Anything else still running after the tests, pgx pools included, is a
// leak.
var leakIgnores = []goleak.Option{
	goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	goleak.IgnoreAnyFunction("google.golang.org/grpc.(*addrConn).resetTransportAndUnlock"),
	goleak.IgnoreAnyFunction("github.com/soheilhy/cmux.(*MuxConn).Read"),
	goleak.IgnoreAnyFunction("net/http.(*connReader).abortPendingRead"),
	goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
	goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
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
