// Package loopback picks TCP ports on 127.0.0.1 for processes this
// machine runs for itself (an embedded etcd, a local stack).
package loopback

import (
	"net"
	"strconv"
)

// FreePort returns a TCP port on 127.0.0.1 that is unused now. Someone
// else may bind it before the caller does: prefer binding port 0 yourself
// where the program allows it.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// PortFree reports whether 127.0.0.1:port can be bound now.
func PortFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}
