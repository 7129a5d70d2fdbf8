package etcdbackend_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/etcdbackend"
	"github.com/payouts/payouts/lock/fencing"
)

// rpcCounter records the unary etcd calls a client makes.
type rpcCounter struct {
	mu    sync.Mutex
	calls []rpcCall
	// After the first call thenIf accepts has returned, and before its
	// caller goes on, thenDo runs once: a test's way to put a write between
	// two calls of one operation.
	thenIf func(method string, req any) bool
	thenDo func()
	// The first call failIf accepts is not sent: it fails with
	// errInjected.
	failIf func(method string, req any) bool
}

// errInjected is the failure of a call failIf accepted: a code the etcd
// client does not retry.
var errInjected = status.Error(codes.Internal, "injected failure")

// rpcCall is one unary call: its method, request and reply (filled in
// once the call has returned).
type rpcCall struct {
	method string
	req    any
	reply  any
}

// intercept records a call as it starts: a test that has seen a call's
// effect (a record it wrote) then finds the call among those recorded.
func (c *rpcCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.mu.Lock()
	c.calls = append(c.calls, rpcCall{method: method, req: req, reply: reply})
	fail := c.failIf != nil && c.failIf(method, req)
	if fail {
		c.failIf = nil
	}
	c.mu.Unlock()
	if fail {
		return errInjected
	}
	err := invoker(ctx, method, req, reply, cc, opts...)
	c.mu.Lock()
	var do func()
	if c.thenIf != nil && c.thenIf(method, req) {
		do, c.thenIf, c.thenDo = c.thenDo, nil, nil
	}
	c.mu.Unlock()
	if do != nil {
		do()
	}
	return err
}

// between arms thenIf and thenDo.
func (c *rpcCounter) between(after func(method string, req any) bool, do func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.thenIf, c.thenDo = after, do
}

// failFirst arms failIf; it reports whether the last one armed is still
// waiting for its call.
func (c *rpcCounter) failFirst(accept func(method string, req any) bool) (stillArmed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	stillArmed = c.failIf != nil
	c.failIf = accept
	return stillArmed
}

// duringCalls returns the calls made while fn ran (by any goroutine).
func (c *rpcCounter) duringCalls(fn func()) []rpcCall {
	c.mu.Lock()
	start := len(c.calls)
	c.mu.Unlock()
	fn()
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]rpcCall(nil), c.calls[start:]...)
}

// during returns the methods of the calls made while fn ran.
func (c *rpcCounter) during(fn func()) []string {
	var methods []string
	for _, call := range c.duringCalls(fn) {
		methods = append(methods, call.method)
	}
	return methods
}

// countedBackend is a backend on the test cluster, under a prefix of its
// own, whose etcd client records every unary call in rc.
func countedBackend(t *testing.T, ctx context.Context, opts ...func(*etcdbackend.Config)) (rc *rpcCounter, cli *clientv3.Client, b *etcdbackend.Backend) {
	t.Helper()
	rc = &rpcCounter{}
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(rc.intercept)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	cfg := etcdbackend.Config{Client: cli, Prefix: fmt.Sprintf("/test/%d", seq.Add(1)), Logger: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(&cfg)
	}
	b, err = etcdbackend.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return rc, cli, b
}

// running runs b's background work (the watch and the sweeps) until the
// test ends.
func running(t *testing.T, ctx context.Context, b *etcdbackend.Backend) {
	t.Helper()
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = b.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })
}

// waitExpired waits until the grant with token is recorded as expired.
func waitExpired(t *testing.T, ctx context.Context, b *etcdbackend.Backend, token fencing.Token) {
	t.Helper()
	for {
		recs, err := b.Grants(ctx, token-1, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 1 && recs[0].Token == token && recs[0].EndReason == backend.EndExpired {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("grant %d was never recorded as expired", token)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// acquireMany acquires n keys prefix:000... for session sid and returns
// their tokens and the first one.
func acquireMany(t *testing.T, ctx context.Context, b *etcdbackend.Backend, sid, prefix string, n int) (map[fencing.Token]bool, fencing.Token) {
	t.Helper()
	tokens := map[fencing.Token]bool{}
	var first fencing.Token
	for i := range n {
		g, err := b.Acquire(ctx, fmt.Sprintf("%s:%03d", prefix, i), sid)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = g.Token
		}
		tokens[g.Token] = true
	}
	return tokens, first
}

// TestOneTransactionPerStep: with the session opened through this service,
// an acquire is one Txn (no session Get, no TimeToLive), and a release and
// a revoke of a grant it made are one Txn each.
func TestOneTransactionPerStep(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rc, _, b := countedBackend(t, ctx)
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

// markerReads counts the calls that read open markers' counts (the
// watch's check after lock keys' deletions), and the markers they read.
func markerReads(calls []rpcCall) (txns, markers int) {
	for _, c := range calls {
		n := 0
		for _, op := range txnOps(c.req) {
			if r := op.GetRequestRange(); r != nil && r.CountOnly && strings.Contains(string(r.Key), "/open/") {
				n++
			}
		}
		if n > 0 {
			txns, markers = txns+1, markers+n
		}
	}
	return txns, markers
}

// txnOps is a call's operations: a transaction's, nested ones' included, or
// the call itself as one.
func txnOps(req any) []*etcdserverpb.RequestOp {
	switch r := req.(type) {
	case *etcdserverpb.RangeRequest:
		return []*etcdserverpb.RequestOp{{Request: &etcdserverpb.RequestOp_RequestRange{RequestRange: r}}}
	case *etcdserverpb.TxnRequest:
		var ops []*etcdserverpb.RequestOp
		for _, op := range append(append([]*etcdserverpb.RequestOp{}, r.Success...), r.Failure...) {
			ops = append(ops, op)
			if t := op.GetRequestTxn(); t != nil {
				ops = append(ops, txnOps(t)...)
			}
		}
		return ops
	}
	return nil
}

// txnCompares is a transaction's compares, nested transactions' included.
func txnCompares(t *etcdserverpb.TxnRequest) []*etcdserverpb.Compare {
	cmps := append([]*etcdserverpb.Compare{}, t.Compare...)
	for _, op := range append(append([]*etcdserverpb.RequestOp{}, t.Success...), t.Failure...) {
		if n := op.GetRequestTxn(); n != nil {
			cmps = append(cmps, txnCompares(n)...)
		}
	}
	return cmps
}

// expiryWrites counts, by token, the conditional writes that record a grant
// as expired (a compare on an open marker's CreateRevision, which is the
// grant's token), and how many transactions carried them.
func expiryWrites(calls []rpcCall) (byToken map[int64]int, txns int) {
	byToken = map[int64]int{}
	for _, c := range calls {
		txn, ok := c.req.(*etcdserverpb.TxnRequest)
		if !ok {
			continue
		}
		found := false
		for _, cmp := range txnCompares(txn) {
			if cmp.Target == etcdserverpb.Compare_CREATE && strings.Contains(string(cmp.Key), "/open/") {
				byToken[cmp.GetCreateRevision()]++
				found = true
			}
		}
		if found {
			txns++
		}
	}
	return byToken, txns
}

// TestReleaseIsNotFollowedByAnExpiryWrite: the watch sees every deletion of
// a lock key, and a grant this process released is already ended, so its
// deletion must cost neither a read nor a second write transaction; a
// lease's expiry still gets its record. Ten releases, then a session's
// lease revoked under a held lock: once that grant shows as expired (the
// watch has passed every release), the open-marker reads are the expired
// grant's and at most two more (a release whose answer reached its caller
// more than a second after the watch saw its deletion, on a loaded machine,
// is read as any other deletion), not one per release; no expiry write
// names a released grant, and at least one names the expired one. How many
// name the expired one is not fixed: the sweeps Run makes around creating
// its watch may race the watch's own attempt.
func TestReleaseIsNotFollowedByAnExpiryWrite(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rc, cli, b := countedBackend(t, ctx)
	running(t, ctx, b)

	s, err := b.CreateSession(ctx, "w", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lapsing, err := b.CreateSession(ctx, "lapsing", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := strconv.ParseInt(lapsing.ID, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	var released []fencing.Token
	var expired fencing.Token
	calls := rc.duringCalls(func() {
		for i := range 10 {
			g, err := b.Acquire(ctx, "payout:quiet", s.ID)
			if err != nil {
				t.Fatalf("acquire %d: %v", i, err)
			}
			released = append(released, g.Token)
			if _, err := b.Release(ctx, "payout:quiet", s.ID, g.Token); err != nil {
				t.Fatalf("release %d: %v", i, err)
			}
		}
		g, err := b.Acquire(ctx, "payout:lapse", lapsing.ID)
		if err != nil {
			t.Fatal(err)
		}
		expired = g.Token
		if _, err := cli.Revoke(ctx, clientv3.LeaseID(lease)); err != nil {
			t.Fatal(err)
		}
		waitExpired(t, ctx, b, g.Token)
	})
	writes, _ := expiryWrites(calls)
	forReleased := 0
	for _, tok := range released {
		forReleased += writes[int64(tok)]
	}
	if forReleased > 0 {
		t.Errorf("%d expiry-record transaction(s) for the 10 released grants; want none (all: %v)", forReleased, writes)
	}
	if _, n := markerReads(calls); n > 3 {
		t.Errorf("%d open-marker read(s) by the watch; want the expired grant's and at most 2 more, not one per release this process made", n)
	}
	if writes[int64(expired)] < 1 {
		t.Errorf("no expiry-record transaction for the expired grant %d (all: %v)", expired, writes)
	}
}

// TestExpiryOfManyKeysIsRecordedInBatches: when a lease holding many lock
// keys expires, etcd deletes them all in one revision. Every grant is
// recorded as expired, and the watch reads their open markers and writes
// their records a batch at a time (64 grants per transaction), not one
// read and one write transaction per grant. 200 keys: more than etcd's
// default limit of 128 operations would allow in one transaction.
func TestExpiryOfManyKeysIsRecordedInBatches(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rc, cli, b := countedBackend(t, ctx)
	running(t, ctx, b)

	s, err := b.CreateSession(ctx, "many", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	tokens, first := acquireMany(t, ctx, b, s.ID, "many", n)
	lease, err := strconv.ParseInt(s.ID, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	calls := rc.duringCalls(func() {
		if _, err := cli.Revoke(ctx, clientv3.LeaseID(lease)); err != nil {
			t.Fatal(err)
		}
		for {
			recs, err := b.Grants(ctx, first-1, 2*n)
			if err != nil {
				t.Fatal(err)
			}
			expired := 0
			for _, r := range recs {
				if tokens[r.Token] && r.EndReason == backend.EndExpired {
					expired++
				}
			}
			if expired == n {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%d of the %d grants recorded as expired", expired, n)
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	// Four batches for the watch; a sweep may race it with as many again.
	readTxns, markers := markerReads(calls)
	if readTxns > 8 {
		t.Errorf("%d transactions read %d open markers; want the %d grants' read in batches (at most 8 transactions)", readTxns, markers, n)
	}
	byToken, writeTxns := expiryWrites(calls)
	if writeTxns > 12 {
		t.Errorf("%d transactions wrote expiry records; want the %d grants' written in batches (at most 12 transactions)", writeTxns, n)
	}
	for tok := range tokens {
		if byToken[int64(tok)] == 0 {
			t.Errorf("no expiry write named grant %d", tok)
		}
	}
}

// TestCloseEndsManyKeysInBatches: closing a session that holds 200 keys
// ends every grant as released, a batch of keys per transaction (not one
// transaction per key), and the watch, seeing the deletions this process
// made, reads no open marker and writes no expiry record for them.
func TestCloseEndsManyKeysInBatches(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rc, cli, b := countedBackend(t, ctx)
	running(t, ctx, b)

	s, err := b.CreateSession(ctx, "closing", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	other, err := b.CreateSession(ctx, "other", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := b.Acquire(ctx, "close:other", other.ID)
	if err != nil {
		t.Fatal(err)
	}
	lapsing, err := b.CreateSession(ctx, "lapsing", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	barrier, err := b.Acquire(ctx, "close:barrier", lapsing.ID)
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	tokens, first := acquireMany(t, ctx, b, s.ID, "close", n)
	var closeTxns int
	calls := rc.duringCalls(func() {
		closeCalls := rc.duringCalls(func() {
			if _, err := b.CloseSession(ctx, s.ID); err != nil {
				t.Fatal(err)
			}
		})
		for _, c := range closeCalls {
			if c.method == "/etcdserverpb.KV/Txn" {
				closeTxns++
			}
		}
		recs, err := b.Grants(ctx, first-1, 2*n)
		if err != nil {
			t.Fatal(err)
		}
		released := 0
		for _, r := range recs {
			if tokens[r.Token] && r.EndReason == backend.EndReleased {
				released++
			}
		}
		if released != n {
			t.Fatalf("%d of %d grants recorded as released when the close returned", released, n)
		}
		// Wait for the watch to pass the close's deletions: a lease
		// revoked after them is recorded as expired by the same watch.
		lease, err := strconv.ParseInt(lapsing.ID, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Revoke(ctx, clientv3.LeaseID(lease)); err != nil {
			t.Fatal(err)
		}
		waitExpired(t, ctx, b, barrier.Token)
	})
	if closeTxns > 8 {
		t.Errorf("the close made %d transactions for %d keys; want them ended in batches (at most 8)", closeTxns, n)
	}
	if _, markers := markerReads(calls); markers > 3 {
		t.Errorf("the watch read %d open markers; want the revoked lease's grant's and at most 2 more (answers late on a loaded machine), none for the deletions the close made", markers)
	}
	writes, _ := expiryWrites(calls)
	for tok := range tokens {
		if writes[int64(tok)] > 0 {
			t.Errorf("an expiry write for grant %d, which the close released", tok)
		}
	}
	l, err := b.Lock(ctx, "close:other")
	if err != nil {
		t.Fatal(err)
	}
	if !l.Held || l.Token != kept.Token {
		t.Errorf("another session's lock after the close: %+v; want still held with token %d", l, kept.Token)
	}
}

// TestCloseEndsTheOtherKeysPastACorruptOne: a lock key of the session whose
// record cannot be read is reported, but does not keep the session's other
// keys from being released.
func TestCloseEndsTheOtherKeysPastACorruptOne(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, cli, b := countedBackend(t, ctx)
	s, err := b.CreateSession(ctx, "closing", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var good []fencing.Token
	for i := range 5 {
		g, err := b.Acquire(ctx, fmt.Sprintf("corrupt:%d", i), s.ID)
		if err != nil {
			t.Fatal(err)
		}
		good = append(good, g.Token)
	}
	// The lock key's path, found by its suffix; a sibling with a value no
	// lock record has, on the session's lease.
	resp, err := cli.Get(ctx, "/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var lockPath string
	for _, kv := range resp.Kvs {
		if strings.HasSuffix(string(kv.Key), "/locks/corrupt:0") && kv.CreateRevision == int64(good[0]) {
			lockPath = string(kv.Key)
		}
	}
	if lockPath == "" {
		t.Fatal("lock key not found")
	}
	lease, err := strconv.ParseInt(s.ID, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, strings.TrimSuffix(lockPath, "corrupt:0")+"corrupt:bad", "not a lock record", clientv3.WithLease(clientv3.LeaseID(lease))); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CloseSession(ctx, s.ID); err == nil {
		t.Error("close with a corrupt lock record of the session: no error")
	}
	recs, err := b.Grants(ctx, good[0]-1, 10)
	if err != nil {
		t.Fatal(err)
	}
	released := 0
	for _, r := range recs {
		if slices.Contains(good, r.Token) && r.EndReason == backend.EndReleased {
			released++
		}
	}
	if released != len(good) {
		t.Errorf("%d of the session's %d readable keys released; want all", released, len(good))
	}
}

// sizeObserver records what the backend reports of its store's size.
type sizeObserver struct {
	backend.NopObserver
	got chan [2]int64
}

func (o sizeObserver) StoreSize(bytes, quota int64) {
	select {
	case o.got <- [2]int64{bytes, quota}:
	default:
	}
}

// TestStoreSizeIsReported: the backend reports etcd's database size and its
// quota when Run starts (and after each compaction), so that an operator is
// told before etcd refuses every write: the metric behind
// PayoutsLockStoreNearQuota.
func TestStoreSizeIsReported(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, cli, b := countedBackend(t, ctx)
	o := sizeObserver{got: make(chan [2]int64, 1)}
	b.SetObserver(o)
	running(t, ctx, b)
	var got [2]int64
	select {
	case got = <-o.got:
	case <-ctx.Done():
		t.Fatal("no store size reported")
	}
	st, err := cli.Status(ctx, cli.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	if got[1] != st.DbSizeQuota || got[1] <= 0 {
		t.Errorf("quota reported %d; etcd says %d", got[1], st.DbSizeQuota)
	}
	if got[0] <= 0 || got[0] > st.DbSize*2 || got[0] > got[1] {
		t.Errorf("size reported %d; etcd says %d now, quota %d", got[0], st.DbSize, got[1])
	}
}

// TestTooLargeATransactionIsRecognised: the error etcd gives a transaction
// over its operation limit is the one inBatches splits batches on.
func TestTooLargeATransactionIsRecognised(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, cli, _ := countedBackend(t, ctx)
	ops := make([]clientv3.Op, 200)
	for i := range ops {
		ops[i] = clientv3.OpGet(fmt.Sprintf("/too-large/%d", i))
	}
	_, err := cli.Txn(ctx).Then(ops...).Commit()
	if !errors.Is(err, rpctypes.ErrTooManyOps) {
		t.Fatalf("a transaction of 200 reads: %v; want rpctypes.ErrTooManyOps", err)
	}
}

// TestSweepRecordsWhatTheWatchMissed: a lease that expired while no lock
// service watched is recorded by the sweep Run starts with, and that sweep
// reads the open grants and the lock keys in one transaction, keys only,
// not one read per open grant: with 20 grants held it makes one read-only
// transaction, then a read and a write transaction for the grants to
// record (here one), and reads no held grant's record.
func TestSweepRecordsWhatTheWatchMissed(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("/test/%d", seq.Add(1))
	rc, cli, b := countedBackend(t, ctx, func(c *etcdbackend.Config) { c.Prefix = prefix })
	reader := uncountedBackend(t, ctx, prefix) // the test's reads of the log are not the sweep's calls
	s, err := b.CreateSession(ctx, "w", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	held := map[fencing.Token]bool{}
	for i := range 20 {
		g, err := b.Acquire(ctx, fmt.Sprintf("sweep:held:%02d", i), s.ID)
		if err != nil {
			t.Fatal(err)
		}
		held[g.Token] = true
	}
	released, err := b.Acquire(ctx, "sweep:released", s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Release(ctx, "sweep:released", s.ID, released.Token); err != nil {
		t.Fatal(err)
	}
	lapsing, err := b.CreateSession(ctx, "lapsing", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lapsed, err := b.Acquire(ctx, "sweep:lapsed", lapsing.ID)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := strconv.ParseInt(lapsing.ID, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(lease)); err != nil {
		t.Fatal(err)
	}

	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	calls := rc.duringCalls(func() {
		go func() { defer close(done); _ = b.Run(rctx) }()
		// The calls are taken once Run has returned: the test can see the
		// expiry record before the call that wrote it has been recorded.
		defer func() { stop(); <-done }()
		for {
			recs, err := reader.Grants(ctx, 0, 100)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				switch {
				case r.Token == lapsed.Token && r.EndReason == backend.EndExpired:
					return
				case held[r.Token] && r.EndedAt != nil:
					t.Fatalf("held grant %d recorded as ended: %+v", r.Token, r)
				}
			}
			select {
			case <-ctx.Done():
				t.Fatal("the lease that expired unwatched was never recorded")
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	var sweep []string
	var sweepCalls []rpcCall
	for _, c := range calls {
		if c.method == "/etcdserverpb.Lease/LeaseLeases" {
			break // the sweep's last call
		}
		if strings.HasPrefix(c.method, "/etcdserverpb.KV/") {
			sweep, sweepCalls = append(sweep, c.method), append(sweepCalls, c)
		}
	}
	if want := "[/etcdserverpb.KV/Txn /etcdserverpb.KV/Txn /etcdserverpb.KV/Txn]"; fmt.Sprint(sweep) != want {
		t.Errorf("the first sweep made %v; want one read transaction of keys, one read of the lapsed grant's marker and its expiry write: %s", sweep, want)
	}
	if n := openRecordsRead(sweepCalls); n != 1 {
		t.Errorf("the first sweep read %d open grants' records; want 1, the lapsed grant's (20 are held)", n)
	}
}

// isGrantsRead is a read of the grant log (Grants): a read-only
// transaction that reads ended grant records, or a further window of them.
func isGrantsRead(req any) bool {
	if r, ok := req.(*etcdserverpb.RangeRequest); ok {
		return strings.Contains(string(r.Key), "/grants/")
	}
	t, ok := req.(*etcdserverpb.TxnRequest)
	if !ok || len(t.Compare) > 0 {
		return false
	}
	for _, op := range t.Success {
		if r := op.GetRequestRange(); r != nil && strings.Contains(string(r.Key), "/grants/") {
			return true
		}
	}
	return false
}

// uncountedBackend is a backend on prefix through a client of its own,
// not Run: a test's reads through it are not among the counted calls.
func uncountedBackend(t *testing.T, ctx context.Context, prefix string) *etcdbackend.Backend {
	t.Helper()
	b, err := etcdbackend.Open(ctx, etcdbackend.Config{Client: newClient(t), Prefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestSweepRecordsAGrantWhoseKeyANewerGrantHolds: a lease expired while no
// lock service watched, and its key was acquired again by another session
// before any service swept: the sweep (of a service started after both)
// records the old grant as expired and leaves the newer one open.
func TestSweepRecordsAGrantWhoseKeyANewerGrantHolds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("/test/%d", seq.Add(1))
	_, cli, b := countedBackend(t, ctx, func(c *etcdbackend.Config) { c.Prefix = prefix })
	lapsing, err := b.CreateSession(ctx, "lapsing", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	newer, err := b.CreateSession(ctx, "newer", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	old, err := b.Acquire(ctx, "sweep:again", lapsing.ID)
	if err != nil {
		t.Fatal(err)
	}
	lease, _ := strconv.ParseInt(lapsing.ID, 10, 64)
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(lease)); err != nil {
		t.Fatal(err)
	}
	again, err := b.Acquire(ctx, "sweep:again", newer.ID)
	if err != nil {
		t.Fatal(err)
	}
	sweeper := uncountedBackend(t, ctx, prefix) // its watch starts after the expiry: only its sweep can record it
	running(t, ctx, sweeper)
	waitExpired(t, ctx, sweeper, old.Token)
	recs, err := sweeper.Grants(ctx, again.Token-1, 1)
	if err != nil || len(recs) != 1 || recs[0].Token != again.Token || recs[0].EndedAt != nil {
		t.Fatalf("the newer grant of the key after the sweep: %+v %v; want %d open", recs, err, again.Token)
	}
}

// TestACloseThatFailsHalfWayEndsTheSession: a close that fails after the
// session's alive key is deleted (here: reading its lock keys) answers the
// failure, and the session is ended, not left renewable while unable to
// acquire, holding its keys.
func TestACloseThatFailsHalfWayEndsTheSession(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rc, _, b := countedBackend(t, ctx)
	running(t, ctx, b)
	s, err := b.CreateSession(ctx, "closing", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	g, err := b.Acquire(ctx, "half-closed", s.ID)
	if err != nil {
		t.Fatal(err)
	}
	rc.failFirst(func(method string, req any) bool {
		r, ok := req.(*etcdserverpb.RangeRequest)
		return ok && method == "/etcdserverpb.KV/Range" && strings.HasSuffix(string(r.Key), "/locks/") && len(r.RangeEnd) > 0
	})
	if _, err := b.CloseSession(ctx, s.ID); err == nil {
		t.Fatal("the close answered success past a failed read of its keys")
	}
	if rc.failFirst(nil) {
		t.Fatal("the close never read its lock keys: the test no longer fails it half way")
	}
	if _, err := b.KeepAlive(ctx, s.ID); !problem.Has(err, problem.SessionExpired) {
		t.Errorf("keepalive of the half-closed session: %v; want session_expired", err)
	}
	if l, err := b.Lock(ctx, "half-closed"); err != nil || l.Held {
		t.Errorf("the half-closed session's key: %+v %v; want free", l, err)
	}
	waitExpired(t, ctx, b, g.Token)
	if _, err := b.CloseSession(ctx, s.ID); !problem.Has(err, problem.SessionExpired) {
		t.Errorf("the close again: %v; want session_expired", err)
	}
}
