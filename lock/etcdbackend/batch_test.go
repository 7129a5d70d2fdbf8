package etcdbackend_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/etcdbackend"
)

// TestConcurrentReleasesShareATransaction: releases that arrive while
// others are in flight go to etcd together, in one transaction of one
// conditional transaction per key. Each caller gets its own record; a
// grant that ended meanwhile (revoked by another lock service process) is
// not_held for its caller alone, and the others of its transaction are
// ended; each transaction's size reaches the observer
// (payouts_lock_store_batch_calls).
func TestConcurrentReleasesShareATransaction(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("/test/%d", seq.Add(1))

	// Every transaction of b's client is held, once etcd has answered it,
	// while hold is set: its batch stays in flight.
	var (
		hold, held atomic.Int32
		txns       atomic.Int32
		gate       = make(chan struct{})
	)
	intercept := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if method == "/etcdserverpb.KV/Txn" {
			txns.Add(1)
		}
		if hold.Load() == 1 {
			held.Add(1)
			<-gate
		}
		return err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(intercept)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	b, err := etcdbackend.Open(ctx, etcdbackend.Config{Client: cli, Prefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	sizes := &batchSizes{}
	b.SetObserver(sizes)
	other, err := etcdbackend.Open(ctx, etcdbackend.Config{Client: newClient(t), Prefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })

	s, err := b.CreateSession(ctx, "owner", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	const n = 6
	grants := make([]backend.Grant, n)
	for i := range grants {
		if grants[i], err = b.Acquire(ctx, fmt.Sprintf("share:%d", i), s.ID); err != nil {
			t.Fatal(err)
		}
	}

	hold.Store(1)
	before := txns.Load()
	recs := make([]backend.GrantRecord, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	release := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			recs[i], errs[i] = b.Release(ctx, grants[i].Key, grants[i].SessionID, grants[i].Token)
		}()
	}
	release(0)
	waitFor(t, "a release transaction in flight", func() bool { return held.Load() == 1 })
	release(1)
	waitFor(t, "two release transactions in flight", func() bool { return held.Load() == 2 })
	for i := 2; i < n; i++ {
		release(i)
	}
	waitFor(t, "four releases waiting", func() bool { return b.EndsWaiting() == n-2 })
	if _, err := other.Revoke(ctx, grants[n-1].Key, "operator", "test"); err != nil {
		t.Fatal(err)
	}
	hold.Store(0)
	close(gate)
	wg.Wait()

	for i := range n - 1 {
		if errs[i] != nil || recs[i].Token != grants[i].Token || recs[i].EndReason != backend.EndReleased {
			t.Errorf("release %d: %+v, %v; want the record of token %d, released", i, recs[i], errs[i], grants[i].Token)
		}
	}
	if !problem.Has(errs[n-1], problem.NotHeld) {
		t.Errorf("release of the revoked grant: %v, want not_held", errs[n-1])
	}
	if got := txns.Load() - before; got != 3 {
		t.Errorf("%d transactions for %d releases, want 3 (1, 1, and the %d that waited)", got, n, n-2)
	}
	if got, want := sizes.sorted(), "release:1 release:1 release:4"; got != want {
		t.Errorf("transaction sizes observed: %s, want %s", got, want)
	}
	log, err := b.Grants(ctx, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	ended := map[string]string{}
	for _, r := range log {
		ended[r.Key] = r.EndReason
	}
	for i, g := range grants {
		want := backend.EndReleased
		if i == n-1 {
			want = backend.EndRevoked
		}
		if ended[g.Key] != want {
			t.Errorf("%s ended as %q in the grant log, want %q", g.Key, ended[g.Key], want)
		}
	}
	for _, g := range grants {
		if l, err := b.Lock(ctx, g.Key); err != nil || l.Held {
			t.Errorf("%s after the releases: %+v, %v; want free", g.Key, l, err)
		}
	}
}

// batchSizes records the transaction sizes a backend reports.
type batchSizes struct {
	backend.NopObserver
	mu   sync.Mutex
	seen []string
}

func (r *batchSizes) StoreBatch(op string, calls int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, fmt.Sprintf("%s:%d", op, calls))
}

func (r *batchSizes) sorted() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(slices.Sorted(slices.Values(r.seen)), " ")
}

// waitFor waits until cond holds, for a minute at most.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
