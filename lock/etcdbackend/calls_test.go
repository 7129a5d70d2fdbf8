package etcdbackend_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/etcdbackend"
)

// rpcCounter counts the unary etcd calls a client makes, by method.
type rpcCounter struct {
	mu    sync.Mutex
	calls []string
}

func (c *rpcCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.mu.Lock()
	c.calls = append(c.calls, method)
	c.mu.Unlock()
	return invoker(ctx, method, req, reply, cc, opts...)
}

// during returns the calls fn made.
func (c *rpcCounter) during(fn func()) []string {
	c.mu.Lock()
	start := len(c.calls)
	c.mu.Unlock()
	fn()
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.calls[start:]...)
}

// TestOneTransactionPerStep: with the session opened through this service,
// an acquire is one Txn (no session Get, no TimeToLive), and a release and
// a revoke of a grant it made are one Txn each.
func TestOneTransactionPerStep(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var rc rpcCounter
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(rc.intercept)}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	b, err := etcdbackend.Open(ctx, etcdbackend.Config{Client: cli, Prefix: fmt.Sprintf("/test/%d", seq.Add(1)), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	s, err := b.CreateSession(ctx, "w", "p", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/etcdserverpb.KV/Txn"}
	check := func(what string, calls []string) {
		t.Helper()
		if fmt.Sprint(calls) != fmt.Sprint(want) {
			t.Errorf("%s made %v; want %v", what, calls, want)
		}
	}
	var g backend.Grant
	check("acquire", rc.during(func() {
		if g, err = b.Acquire(ctx, "payout:calls", s.ID); err != nil {
			t.Fatal(err)
		}
	}))
	if g.ServerExpiry.IsZero() {
		t.Error("acquire answered without a server expiry")
	}
	check("release", rc.during(func() {
		if _, err := b.Release(ctx, "payout:calls", s.ID, g.Token); err != nil {
			t.Fatal(err)
		}
	}))
	if g, err = b.Acquire(ctx, "payout:calls", s.ID); err != nil {
		t.Fatal(err)
	}
	check("revoke", rc.during(func() {
		if _, err := b.Revoke(ctx, "payout:calls", "op", "test"); err != nil {
			t.Fatal(err)
		}
	}))
}
