package etcdbackend_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/etcdbackend"
	"github.com/payouts/payouts/lock/fencing"
)

// warnings is a log handler that keeps the warnings a backend logs.
type warnings struct {
	mu    sync.Mutex
	lines []warning
}

// warning is one logged warning: when, its message, its attributes.
type warning struct {
	at    time.Time
	msg   string
	attrs map[string]string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler           { return w }
func (w *warnings) WithGroup(string) slog.Handler                { return w }

func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	line := warning{at: time.Now(), msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		line.attrs[a.Key] = a.Value.String()
		return true
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lines = append(w.lines, line)
	return nil
}

// waitFor waits, a minute at most, for a warning logged at or after since
// that match accepts, and returns it.
func (w *warnings) waitFor(t *testing.T, what string, since time.Time, match func(warning) bool) warning {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		w.mu.Lock()
		for _, l := range w.lines {
			if !l.at.Before(since) && match(l) {
				w.mu.Unlock()
				return l
			}
		}
		w.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s; warnings logged since: %v", what, w.since(since))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (w *warnings) since(since time.Time) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, l := range w.lines {
		if !l.at.Before(since) {
			out = append(out, fmt.Sprintf("%s %v", l.msg, l.attrs))
		}
	}
	return out
}

// gatedClient is a client whose only endpoint is g, with no gRPC
// keepalive: a call the gate holds ends only when its context does.
func gatedClient(t *testing.T, g *gate, opts ...grpc.DialOption) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + g.ln.Addr().String()}, DialTimeout: 5 * time.Second,
		Logger: zap.NewNop(), DialOptions: opts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// waitHeld waits, a minute at most, until the gate holds back something
// sent at or after since.
func (g *gate) waitHeld(t *testing.T, what string, since time.Time) {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		_, ok, next := g.heldSince(since)
		if ok {
			return
		}
		select {
		case <-next:
		case <-timeout:
			t.Fatalf("waited a minute for %s to reach the gate", what)
		}
	}
}

// etcdHost is the host:port of the test cluster's first member.
func etcdHost(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(cluster.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// TestRunGoesOnWhileEtcdDoesNotAnswer: a member that stops answering while
// its connection stays up (a frozen process, a stalled disk) fails each
// of Run's steps at the step timeout, instead of stopping all background
// work until it answers again; once it answers, the next sweep records
// the expiries that happened meanwhile.
//
// Every call of the backend goes through a gate that holds back, once
// held, everything the client sends, and its client has no keepalive: a
// held call ends only when its context does, so the warnings below can
// only come from the step timeout. Each step is seen to end: a sweep, a
// compaction pass and the recording of an expiry the watch told of
// (etcd's answers are not held, so the watch still tells), each logged
// with the timeout as its error. Before, the first held step waited for
// the gate forever and nothing was logged.
func TestRunGoesOnWhileEtcdDoesNotAnswer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("/test/%d", seq.Add(1))
	g := newGate(t, etcdHost(t))
	const step = 3 * time.Second
	warns := &warnings{}
	b, err := etcdbackend.Open(ctx, etcdbackend.Config{Client: gatedClient(t, g), Prefix: prefix, Logger: slog.New(warns),
		SweepInterval: 200 * time.Millisecond, CompactInterval: 200 * time.Millisecond, GrantRetention: time.Hour, StepTimeout: step})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	rctx, stop := context.WithCancel(ctx)
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = b.Run(rctx) }()
	defer func() { g.release(); stop(); <-runDone }()

	// The test's own calls go straight to etcd.
	direct := newClient(t)
	writer := uncountedBackend(t, ctx, prefix)
	// expireOne makes a grant and revokes its session's lease, which is
	// what an expiry looks like to the lock service.
	expireOne := func(name string) fencing.Token {
		t.Helper()
		s, err := writer.CreateSession(ctx, name, "p", backend.MaxTTL)
		if err != nil {
			t.Fatal(err)
		}
		gr, err := writer.Acquire(ctx, "stall:"+name, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		lease, _ := strconv.ParseInt(s.ID, 10, 64)
		if _, err := direct.Revoke(ctx, clientv3.LeaseID(lease)); err != nil {
			t.Fatal(err)
		}
		return gr.Token
	}
	waitExpired(t, ctx, writer, expireOne("before")) // Run works through the gate

	held := time.Now()
	g.hold()
	timedOut := func(what string) func(warning) bool {
		return func(w warning) bool {
			return w.msg == what && strings.Contains(w.attrs["error"], "no answer within "+step.String())
		}
	}
	warns.waitFor(t, "a sweep to fail at the step timeout", held, timedOut("sweep of open grants failed"))
	warns.waitFor(t, "a compaction to fail at the step timeout", held, timedOut("grant log compaction failed; will retry"))
	during := expireOne("during")
	warns.waitFor(t, fmt.Sprintf("the recording of grant %d's expiry, which the watch told of, to fail at the step timeout", during), held,
		func(w warning) bool {
			return timedOut("could not record expired grants; the sweep will retry")(w) && w.attrs["first_token"] == strconv.FormatInt(int64(during), 10)
		})
	if recs, err := writer.Grants(ctx, during-1, 1); err != nil || len(recs) != 1 || recs[0].EndedAt != nil {
		t.Fatalf("grant %d while Run's calls are held: %+v %v; want still open", during, recs, err)
	}
	g.release()
	waitExpired(t, ctx, writer, during)
}

// TestRunEndsWhenCancelledWhileEtcdDoesNotAnswer: Run returns once its
// context ends, even while etcd holds the call of a step: here the step
// timeout is far longer than the test, so only the cancellation can end
// the held step.
func TestRunEndsWhenCancelledWhileEtcdDoesNotAnswer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	g := newGate(t, etcdHost(t))
	b, err := etcdbackend.Open(ctx, etcdbackend.Config{Client: gatedClient(t, g), Prefix: fmt.Sprintf("/test/%d", seq.Add(1)),
		Logger: slog.New(slog.DiscardHandler), SweepInterval: 200 * time.Millisecond, StepTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = b.Run(rctx) }()
	defer g.release()
	held := time.Now()
	g.hold()
	g.waitHeld(t, "a sweep", held)
	stopped := time.Now()
	stop()
	select {
	case <-runDone:
		t.Logf("Run returned %s after its context ended", time.Since(stopped).Round(time.Millisecond))
	case <-time.After(time.Minute):
		t.Fatal("Run did not return within a minute of its context's end while etcd held its calls")
	}
}

// TestCreateSessionsCleanUpIsBounded: when a session's records cannot be
// written (here its caller went away while etcd held the write), the lease
// granted for it is revoked in the background of the call, and that
// revoke no longer waits for etcd forever: the call returns by the step
// timeout. Before, it waited as long as etcd held the revoke.
func TestCreateSessionsCleanUpIsBounded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	g := newGate(t, etcdHost(t))
	// The gate holds everything sent once the lease is granted: the
	// session's records, then the revoke.
	holdAfterGrant := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if method == "/etcdserverpb.Lease/LeaseGrant" {
			g.hold()
		}
		return err
	}
	b, err := etcdbackend.Open(ctx, etcdbackend.Config{Client: gatedClient(t, g, grpc.WithChainUnaryInterceptor(holdAfterGrant)),
		Prefix: fmt.Sprintf("/test/%d", seq.Add(1)), Logger: slog.New(slog.DiscardHandler), StepTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	defer g.release()
	cctx, callerGone := context.WithCancel(ctx)
	defer callerGone()
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := b.CreateSession(cctx, "w", "p", backend.MaxTTL)
		done <- err
	}()
	g.waitHeld(t, "the session's records", start)
	callerGone()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("CreateSession succeeded while etcd held its write")
		}
	case <-time.After(time.Minute):
		t.Fatal("CreateSession did not return within a minute of its caller going away: its revoke of the lease waits for etcd")
	}
}

// TestClientConfigDropsAConnectionEtcdStoppedAnswering: a client made
// with ClientConfig closes a connection on which etcd stopped answering
// (a frozen member: the connection stays up) and the call made on it goes
// to another member. The call is first sent to the gate, the only
// endpoint; the live member is added while the gate holds it. Without a
// gRPC keepalive the call waited on the dead connection until its
// deadline.
func TestClientConfigDropsAConnectionEtcdStoppedAnswering(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	g := newGate(t, etcdHost(t))
	gated := "http://" + g.ln.Addr().String()
	cli, err := clientv3.New(etcdbackend.ClientConfig([]string{gated}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	if _, err := cli.Get(ctx, "/keepalive"); err != nil { // connected through the gate
		t.Fatal(err)
	}
	held := time.Now()
	g.hold()
	defer g.release()
	done := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		_, err := cli.Get(cctx, "/keepalive")
		done <- err
	}()
	g.waitHeld(t, "the read", held)
	cli.SetEndpoints(gated, cluster.Endpoints()[0])
	if err := <-done; err != nil {
		t.Fatalf("a read sent to a member that stopped answering: %v; want it answered by the other member", err)
	}
	t.Logf("answered %s after it was sent", time.Since(held).Round(time.Millisecond))
}
