package etcdbackend_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/backend/backendtest"
	"github.com/payouts/payouts/lock/etcdbackend"
)

var (
	cluster *infra.EtcdCluster
	seq     atomic.Int64
)

func TestMain(m *testing.M) { backendtest.Main(m, runWithEtcd) }

func runWithEtcd(m *testing.M) int {
	dir, err := os.MkdirTemp("", "etcdbackend-test-")
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	cluster, err = infra.StartEtcd(ctx, dir, 1)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	cluster.Close()
	os.RemoveAll(dir)
	return code
}

type store struct{ prefix string }

func (s store) Open(t *testing.T) backend.Backend {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b, err := etcdbackend.Open(ctx, etcdbackend.Config{Client: cli, Prefix: s.prefix, Logger: slog.New(slog.DiscardHandler), SweepInterval: time.Second})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = b.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; b.Close(); cli.Close() })
	return b
}

// newClient is a client of the shared etcd node, closed when the test ends.
func newClient(t *testing.T) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// setup is a test's system: a fresh prefix on the shared etcd node.
func setup(t *testing.T) backendtest.Store { return store{prefix: fmt.Sprintf("/test/%d", seq.Add(1))} }

func TestBehaviour(t *testing.T) {
	t.Parallel()
	backendtest.Run(t, setup)
}

// TestSessionIDsAreCanonical: a session id is a lease id in its one decimal
// spelling. "0N" or "+N" names no session: it must not reach session N's
// lease, which would let any principal release another's lock (the owner
// check finds no session "0N" and lets the request through).
func TestSessionIDsAreCanonical(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := uncountedBackend(t, ctx, fmt.Sprintf("/test/%d", seq.Add(1)))
	s, grants := heldGrants(t, ctx, b, "canonical", 1)
	g := grants[0]
	for _, alias := range []string{"0" + s.ID, "+" + s.ID, "00" + s.ID} {
		if _, err := b.Release(ctx, g.Key, alias, g.Token); err == nil {
			t.Fatalf("release of %s under session id %q (session %s) succeeded", g.Key, alias, s.ID)
		}
		if _, err := b.Acquire(ctx, "canonical:other", alias); err == nil {
			t.Fatalf("acquire under session id %q (session %s) succeeded", alias, s.ID)
		}
	}
	l, err := b.Lock(ctx, g.Key)
	if err != nil {
		t.Fatal(err)
	}
	if !l.Held || l.Token != g.Token || l.SessionID != s.ID {
		t.Fatalf("%s after releases under other spellings of its session: %+v, want still held by %s at token %d", g.Key, l, s.ID, g.Token)
	}
}
