package infra_test

import (
	"net"
	"strconv"
)

type netListener struct{}

func (netListener) listen(port int) (net.Listener, error) {
	return net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
}
