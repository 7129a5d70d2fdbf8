package httpx_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/httpx"
)

// TestClientClosesAnUnusedConnectionBeforeTheServerDoes: a connection the
// client dialled for a request that went elsewhere (here: gave up while it
// was dialled) waits in the client's pool unused, and a server with the
// services' header timeout closes a connection that sends no request that
// long after accepting it. A request that takes it from the pool just as
// the server closes it is answered with a reset and not retried (a POST on
// a connection never used): lock sessions' keepalives, sent every 10 s,
// took such connections exactly 10 s after dialling them and failed, and
// the sessions went into jeopardy. The client must close it well before.
func TestClientClosesAnUnusedConnectionBeforeTheServerDoes(t *testing.T) {
	t.Parallel()
	accepted, closed := make(chan time.Time, 8), make(chan time.Time, 8)
	srv := &http.Server{ReadHeaderTimeout: httpx.ReadHeaderTimeout, Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}),
		ConnState: func(_ net.Conn, st http.ConnState) {
			switch st {
			case http.StateNew:
				accepted <- time.Now()
			case http.StateClosed:
				closed <- time.Now()
			}
		}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ln) }()
	defer func() { srv.Close(); <-served }()

	tr := httpx.NewTransport(nil)
	defer tr.CloseIdleConnections()
	dial, dialling, release := tr.DialContext, make(chan struct{}, 1), make(chan struct{})
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dialling <- struct{}{}
		<-release
		return dial(context.WithoutCancel(ctx), network, addr)
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+ln.Addr().String()+"/", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	gaveUp := make(chan error, 1)
	go func() {
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		gaveUp <- err
	}()
	<-dialling
	cancel() // the request gives up while its connection is dialled ...
	if err := <-gaveUp; err == nil {
		t.Fatal("the request was answered; want it cancelled while its connection was dialled")
	}
	close(release) // ... which the transport keeps, unused, for a later request

	var at time.Time
	select {
	case at = <-accepted:
	case <-time.After(time.Minute):
		t.Fatal("the dialled connection never reached the server")
	}
	select {
	case c := <-closed:
		if d := c.Sub(at); d >= httpx.ReadHeaderTimeout*3/4 {
			t.Fatalf("the unused connection was closed %v after the server accepted it; want the client to close it well before the server's header timeout (%v)", d, httpx.ReadHeaderTimeout)
		}
	case <-time.After(2 * httpx.ReadHeaderTimeout):
		t.Fatal("the unused connection was never closed")
	}
}
