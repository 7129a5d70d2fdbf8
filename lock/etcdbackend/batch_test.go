package etcdbackend_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/backend/backendtest"
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
	ctx, prefix, b, c := gatedBackend(t)
	sizes := &backendtest.BatchRecorder{}
	b.SetObserver(sizes)
	other := uncountedBackend(t, ctx, prefix)
	const n = 6
	_, grants := heldGrants(t, ctx, b, "share", n)

	before := c.txns.Load()
	recs := make([]backend.GrantRecord, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	release := func(i int) {
		recs[i], errs[i] = b.Release(ctx, grants[i].Key, grants[i].SessionID, grants[i].Token)
	}
	twoInFlight(t, c, &wg, release)
	for i := 2; i < n; i++ {
		wg.Go(func() { release(i) })
	}
	waitFor(t, "four releases waiting", func() bool { return b.EndsWaiting() == n-2 })
	if _, err := other.Revoke(ctx, grants[n-1].Key, "operator", "test"); err != nil {
		t.Fatal(err)
	}
	c.open()
	wg.Wait()

	for i := range n - 1 {
		if errs[i] != nil || recs[i].Token != grants[i].Token || recs[i].EndReason != backend.EndReleased {
			t.Errorf("release %d: %+v, %v; want the record of token %d, released", i, recs[i], errs[i], grants[i].Token)
		}
	}
	if !problem.Has(errs[n-1], problem.NotHeld) {
		t.Errorf("release of the revoked grant: %v, want not_held", errs[n-1])
	}
	if got := c.txns.Load() - before; got != 3 {
		t.Errorf("%d transactions for %d releases, want 3 (1, 1, and the %d that waited)", got, n, n-2)
	}
	if got, want := sizes.Sorted(), "release:1 release:1 release:4"; got != want {
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

// TestEndsOfOneKeyInABatchAreSettledInTurn: a release, a revoke and a
// second release of one key waiting together go in transactions one after
// another (a key once per transaction), each finding the one before it
// done; a revoke from a stale view of its key (the grant it knew ended
// elsewhere and the key taken again) reads the key again and revokes the
// current grant.
func TestEndsOfOneKeyInABatchAreSettledInTurn(t *testing.T) {
	t.Parallel()
	ctx, prefix, b, c := gatedBackend(t)
	other := uncountedBackend(t, ctx, prefix)
	s, g := heldGrants(t, ctx, b, "turn", 4)
	s2, err := other.CreateSession(ctx, "owner2", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Revoke(ctx, "turn:2", "operator", "test"); err != nil {
		t.Fatal(err)
	}
	retaken, err := other.Acquire(ctx, "turn:2", s2.ID)
	if err != nil {
		t.Fatal(err)
	}

	type answer struct {
		rec backend.GrantRecord
		err error
	}
	answers := map[string]*answer{"release 0": {}, "release 3": {}}
	var wg sync.WaitGroup
	call := func(name string, f func() (backend.GrantRecord, error)) {
		a := &answer{}
		answers[name] = a
		wg.Go(func() { a.rec, a.err = f() })
	}
	release := func(i int) func() (backend.GrantRecord, error) {
		return func() (backend.GrantRecord, error) { return b.Release(ctx, g[i].Key, s.ID, g[i].Token) }
	}
	revoke := func(key string) func() (backend.GrantRecord, error) {
		return func() (backend.GrantRecord, error) { return b.Revoke(ctx, key, "operator", "test") }
	}
	first := []*answer{answers["release 0"], answers["release 3"]}
	twoInFlight(t, c, &wg, func(i int) { first[i].rec, first[i].err = release(3 * i)() })
	for i, x := range []struct {
		name string
		f    func() (backend.GrantRecord, error)
	}{{"release 1", release(1)}, {"revoke 1", revoke("turn:1")}, {"revoke 2", revoke("turn:2")}, {"release 1 again", release(1)}} {
		call(x.name, x.f)
		waitFor(t, x.name+" waiting", func() bool { return b.EndsWaiting() == i+1 })
	}
	c.open()
	wg.Wait()

	for _, i := range []int{0, 3, 1} {
		a := answers[fmt.Sprintf("release %d", i)]
		if a.err != nil || a.rec.Token != g[i].Token || a.rec.EndReason != backend.EndReleased {
			t.Errorf("release %d: %+v, %v; want token %d released", i, a.rec, a.err, g[i].Token)
		}
	}
	if a := answers["revoke 1"]; !problem.Has(a.err, problem.NotHeld) {
		t.Errorf("revoke of turn:1 after its release: %+v, %v; want not_held (free)", a.rec, a.err)
	}
	if a := answers["revoke 2"]; a.err != nil || a.rec.Token != retaken.Token || a.rec.EndReason != backend.EndRevoked {
		t.Errorf("revoke of turn:2 from a stale view: %+v, %v; want the current grant (token %d) revoked", a.rec, a.err, retaken.Token)
	}
	if a := answers["release 1 again"]; !problem.Has(a.err, problem.NotHeld) {
		t.Errorf("second release of turn:1: %+v, %v; want not_held", a.rec, a.err)
	}
}

// TestAFailedEndTransactionEndsNothingOfIt: a transaction of ends that
// etcd does not answer gives its error to each of its callers, ends none
// of their grants, and a release tried again ends it.
func TestAFailedEndTransactionEndsNothingOfIt(t *testing.T) {
	t.Parallel()
	ctx, _, b, c := gatedBackend(t)
	s, g := heldGrants(t, ctx, b, "fail", 4)
	errs := make([]error, len(g))
	release := func(i int) { _, errs[i] = b.Release(ctx, g[i].Key, s.ID, g[i].Token) }
	var wg sync.WaitGroup
	twoInFlight(t, c, &wg, release)
	for i := 2; i < len(g); i++ {
		wg.Go(func() { release(i) })
		waitFor(t, "releases waiting", func() bool { return b.EndsWaiting() == i-1 })
	}
	injected := errors.New("injected: no answer from etcd")
	c.fail.Store(&injected)
	c.open()
	wg.Wait()
	for i, err := range errs {
		if i < 2 && err != nil {
			t.Errorf("release %d, before the failure: %v", i, err)
		}
		if i >= 2 && !problem.Has(err, problem.Unavailable) {
			t.Errorf("release %d, in the failed transaction: %v; want unavailable", i, err)
		}
	}
	for i := 2; i < len(g); i++ {
		if l, err := b.Lock(ctx, g[i].Key); err != nil || !l.Held || l.Token != g[i].Token {
			t.Errorf("%s after the failed transaction: %+v, %v; want still held with token %d", g[i].Key, l, err, g[i].Token)
		}
		if rec, err := b.Release(ctx, g[i].Key, s.ID, g[i].Token); err != nil || rec.EndReason != backend.EndReleased {
			t.Errorf("release %d tried again: %+v, %v", i, rec, err)
		}
	}
}

// TestAReleaseItsCallerGaveUpOnIsNotMade: a release whose caller's
// context ends while it waits for a transaction gets its context's error
// and is not made: the grant stays held, as its caller was told, and a
// release tried again ends it.
func TestAReleaseItsCallerGaveUpOnIsNotMade(t *testing.T) {
	t.Parallel()
	ctx, _, b, c := gatedBackend(t)
	s, g := heldGrants(t, ctx, b, "gone", 3)
	var wg sync.WaitGroup
	twoInFlight(t, c, &wg, func(i int) {
		if _, err := b.Release(ctx, g[i].Key, s.ID, g[i].Token); err != nil {
			t.Errorf("release %d: %v", i, err)
		}
	})
	gctx, giveUp := context.WithCancel(ctx)
	gone := make(chan error, 1)
	go func() {
		_, err := b.Release(gctx, g[2].Key, s.ID, g[2].Token)
		gone <- err
	}()
	waitFor(t, "the release waiting", func() bool { return b.EndsWaiting() == 1 })
	giveUp()
	if err := <-gone; err == nil {
		t.Fatal("the release whose caller gave up answered success")
	}
	c.open()
	wg.Wait()
	if l, err := b.Lock(ctx, g[2].Key); err != nil || !l.Held || l.Token != g[2].Token {
		t.Fatalf("%s after its caller gave up on the release: %+v, %v; want still held", g[2].Key, l, err)
	}
	if _, err := b.Release(ctx, g[2].Key, s.ID, g[2].Token); err != nil {
		t.Fatalf("the release tried again: %v", err)
	}
}

// heldGrants opens a session on b and acquires n keys <name>:<i> for it.
func heldGrants(t *testing.T, ctx context.Context, b *etcdbackend.Backend, name string, n int) (backend.Session, []backend.Grant) {
	t.Helper()
	s, err := b.CreateSession(ctx, "owner", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	g := make([]backend.Grant, n)
	for i := range g {
		if g[i], err = b.Acquire(ctx, fmt.Sprintf("%s:%d", name, i), s.ID); err != nil {
			t.Fatal(err)
		}
	}
	return s, g
}

// twoInFlight holds b's calls (c) and starts call(0) and call(1) on
// goroutines of wg, each once the one before is in flight, so that both of
// the backend's end transactions are held when it returns.
func twoInFlight(t *testing.T, c *heldCalls, wg *sync.WaitGroup, call func(i int)) {
	t.Helper()
	c.hold.Store(1)
	for i := range 2 {
		wg.Go(func() { call(i) })
		waitFor(t, "end transactions in flight", func() bool { return c.held.Load() == int32(i+1) })
	}
}

// heldCalls controls a backend's etcd client (gatedBackend).
type heldCalls struct {
	hold, held, txns atomic.Int32
	gate             chan struct{}
	opened           sync.Once
	fail             atomic.Pointer[error] // the next Txn's answer, instead of etcd's
}

// open lets every held call go on, and holds no more.
func (c *heldCalls) open() {
	c.opened.Do(func() {
		c.hold.Store(0)
		close(c.gate)
	})
}

// gatedBackend is a backend on the test cluster under a prefix of its own
// whose etcd client counts its transactions, answers the next one with an
// error when fail is set, and holds every call, once answered, while hold
// is set (a release's batch then stays in flight). Its watch does not run,
// so every call is the test's. ctx ends with the test, within 2 minutes.
func gatedBackend(t *testing.T) (ctx context.Context, prefix string, b *etcdbackend.Backend, c *heldCalls) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	prefix = fmt.Sprintf("/test/%d", seq.Add(1))
	c = &heldCalls{gate: make(chan struct{})}
	intercept := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		var err error
		if method != "/etcdserverpb.KV/Txn" {
			err = invoker(ctx, method, req, reply, cc, opts...)
		} else {
			c.txns.Add(1)
			if e := c.fail.Swap(nil); e != nil {
				err = *e
			} else {
				err = invoker(ctx, method, req, reply, cc, opts...)
			}
		}
		if c.hold.Load() == 1 {
			c.held.Add(1)
			<-c.gate
		}
		return err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(intercept)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	b, err = etcdbackend.Open(ctx, etcdbackend.Config{Client: cli, Prefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	t.Cleanup(c.open) // first: a test that failed holding calls lets them go
	return ctx, prefix, b, c
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
