package executor

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// keptTestGrant is a grant whose validity the test controls; it counts its
// releases.
type keptTestGrant struct {
	key      string
	invalid  atomic.Bool
	releases atomic.Int32
}

func (g *keptTestGrant) Key() string            { return g.key }
func (g *keptTestGrant) Token() fencing.Token   { return 9 }
func (g *keptTestGrant) Holder() fencing.Holder { return "s-1" }
func (g *keptTestGrant) Valid() bool            { return !g.invalid.Load() }
func (g *keptTestGrant) Done() <-chan struct{}  { return nil }
func (g *keptTestGrant) Release(context.Context) error {
	g.releases.Add(1)
	return nil
}

func lingerExecutor(linger time.Duration, concurrency int) *Executor {
	e := newBareExecutor()
	e.cfg.GrantLinger, e.cfg.Concurrency = linger, concurrency
	return e
}

// endRound is what a worker does at the end of a round that moved payouts
// and left the account with nothing to do: keep the grant while the account
// is still reserved, then leave it.
func endRound(t *testing.T, e *Executor, account string, g grant, at time.Time) {
	t.Helper()
	if !e.reserve(account, at) {
		t.Fatalf("account %s could not be reserved", account)
	}
	if !e.keep(account, keptGrant{g: g, since: at, acquired: at}) {
		t.Fatalf("the grant of %s was not kept", account)
	}
	e.unreserve(account)
}

// TestKeptGrantIsReusedThenReleasedAfterItsLinger: a kept grant is handed
// to the account's next worker as it is; once idle for the linger it is
// queued and released by the poll's release pass, exactly once.
func TestKeptGrantIsReusedThenReleasedAfterItsLinger(t *testing.T) {
	e := lingerExecutor(time.Second, 1)
	log := slog.New(slog.DiscardHandler)
	g := &keptTestGrant{key: "payout:a"}
	t0 := time.Now()
	endRound(t, e, "a", g, t0)
	if v := gaugeValue(t, e.m.keptGrants); v != 1 {
		t.Fatalf("kept_grants = %v, want 1", v)
	}
	if next := e.expireKept(t0.Add(999*time.Millisecond), false); !next.Equal(t0.Add(time.Second)) {
		t.Fatalf("before its linger ends: next wake %v, want %v", next, t0.Add(time.Second))
	}
	e.retryReleases(log)
	if g.releases.Load() != 0 {
		t.Fatal("a kept grant was released before its linger ended")
	}
	// The next round takes it.
	e.reserve("a", t0)
	if k, _ := e.takeKept("a", t0); k.g != g || !k.since.Equal(t0) {
		t.Fatalf("the next round got %v kept at %v, want the kept grant, kept at %v", k.g, k.since, t0)
	}
	if k, _ := e.takeKept("a", t0); k.g != nil {
		t.Fatal("a kept grant was handed out twice")
	}
	e.unreserve("a")
	// Kept again; its linger counts from then.
	t1 := t0.Add(5 * time.Second)
	endRound(t, e, "a", g, t1)
	if next := e.expireKept(t1.Add(time.Second), false); !next.IsZero() {
		t.Fatalf("next wake %v with nothing left kept", next)
	}
	e.retryReleases(log)
	e.retryReleases(log)
	if n := g.releases.Load(); n != 1 || len(e.kept) != 0 || len(e.unreleased) != 0 {
		t.Fatalf("after the linger: %d release(s), %d kept, %d queued; want 1, 0, 0", n, len(e.kept), len(e.unreleased))
	}
	if v := gaugeValue(t, e.m.keptGrants); v != 0 {
		t.Fatalf("kept_grants = %v, want 0", v)
	}
}

// TestKeptGrantRetiresTwoLingersAfterItsAcquire: however busy its account,
// a grant is kept across rounds only until twice the linger after its
// acquire, so that whatever waits for the account gets it: a round ending
// after that releases it, and a kept grant is released then even within
// its linger. A worker that finds it past that (no poll has released it
// yet) gets it to release itself, and goes on with the account: it is not
// left for a later pass.
func TestKeptGrantRetiresTwoLingersAfterItsAcquire(t *testing.T) {
	e := lingerExecutor(time.Second, 1)
	log := slog.New(slog.DiscardHandler)
	g := &keptTestGrant{key: "payout:a"}
	t0 := time.Now() // acquired
	// Rounds every 0.9 s, each within the linger of the one before.
	at := t0
	for i := range 2 {
		e.reserve("a", at)
		if !e.keep("a", keptGrant{g: g, since: at, acquired: t0}) {
			t.Fatalf("round %d: not kept %v after the acquire", i, at.Sub(t0))
		}
		e.unreserve("a")
		at = at.Add(900 * time.Millisecond)
		e.reserve("a", at)
		if k, ended := e.takeKept("a", at); k.g != g || ended != nil || !k.acquired.Equal(t0) {
			t.Fatalf("round %d at %v: got %v (ended %v, acquired %v)", i, at.Sub(t0), k.g, ended, k.acquired)
		}
		e.unreserve("a")
	}
	// Kept at 1.8 s: released at 2 s, not at its linger's end (2.8 s).
	e.keep("a", keptGrant{g: g, since: at, acquired: t0})
	if next := e.expireKept(at.Add(100*time.Millisecond), false); !next.Equal(t0.Add(2 * time.Second)) {
		t.Fatalf("next wake %v after the acquire, want 2s", next.Sub(t0))
	}
	e.expireKept(t0.Add(2*time.Second), false)
	e.retryReleases(log)
	if n := g.releases.Load(); n != 1 || len(e.kept) != 0 {
		t.Fatalf("two lingers after the acquire: %d release(s), %d kept; want 1, 0", n, len(e.kept))
	}
	// A round ending past that does not keep its grant.
	e.reserve("a", t0.Add(2*time.Second))
	if e.keep("a", keptGrant{g: g, since: t0.Add(2 * time.Second), acquired: t0}) {
		t.Fatal("a grant was kept two lingers after its acquire")
	}
	e.unreserve("a")
	// A worker that takes a kept grant past that (no poll released it
	// yet) gets it to release itself; nothing is queued or left kept.
	e.reserve("a", t0)
	e.keep("a", keptGrant{g: g, since: t0.Add(1500 * time.Millisecond), acquired: t0})
	e.unreserve("a")
	e.reserve("a", t0)
	if k, ended := e.takeKept("a", t0.Add(2100*time.Millisecond)); k.g != nil || ended != g {
		t.Fatalf("past its end: got %v, ended %v; want nothing to use and the grant to release", k.g, ended)
	}
	e.unreserve("a")
	if len(e.kept) != 0 || len(e.unreleased) != 0 {
		t.Fatalf("after the worker took the ended grant: %d kept, %d queued; want none", len(e.kept), len(e.unreleased))
	}
}

// noAcquireSession fails the test if a round acquires a key through it.
type noAcquireSession struct {
	session
	t *testing.T
}

func (s noAcquireSession) TryAcquire(context.Context, string) (grant, error) {
	s.t.Error("the round acquired the key")
	return nil, fmt.Errorf("no acquire in this test")
}

// TestEndedKeptGrantWhoseReleaseGetsNoAnswerIsNotReacquired: a worker that
// finds its account's kept grant past its end releases it before it
// acquires; when that release gets no verdict, an acquire would hand the
// session the same token and the release, landing late, would free it
// under the round. So the round takes nothing and leaves the account, as
// when another session holds it, and the next release pass settles it.
func TestEndedKeptGrantWhoseReleaseGetsNoAnswerIsNotReacquired(t *testing.T) {
	e := lingerExecutor(time.Second, 1)
	log := slog.New(slog.DiscardHandler)
	calls := 0
	noAnswer := fmt.Errorf("POST /v1/locks/payout:a/release: %w: connection refused", httpx.ErrTransport)
	g := &flakyGrant{key: "payout:a", errs: []error{noAnswer}, calls: &calls}
	t0 := time.Now().Add(-time.Minute)
	e.reserve("a", t0)
	if !e.keep("a", keptGrant{g: g, since: t0, acquired: t0}) {
		t.Fatal("the grant was not kept")
	}
	e.unreserve("a")
	if !e.reserve("a", time.Now()) {
		t.Fatal("the account could not be reserved")
	}
	res := e.workAccount(noAcquireSession{t: t}, log, "a", workSeen{})
	e.finishRound(log, "a", res, time.Now())
	if !res.held || res.acquired || calls != 1 {
		t.Fatalf("round: %+v after %d release call(s); want the account left (held), one release tried", res, calls)
	}
	if p, ok := e.unreleased["a"]; !ok || p.g != g || !p.failed {
		t.Fatalf("queued release: %+v (%v); want the grant, failed once", p, ok)
	}
	e.retryReleases(log)
	if calls != 2 || len(e.unreleased) != 0 {
		t.Fatalf("after the next pass: %d release call(s), %d queued; want 2, 0", calls, len(e.unreleased))
	}
}

// TestGrantWhoseReleaseGetsNoAnswerIsNotReacquired: a grant whose release
// got no verdict is queued for the release pass; a worker that comes to the
// account meanwhile does not acquire it (the same token would come back,
// and the release, landing late, would free it under the round): it leaves
// the account, as when another session holds it, and the release pass
// settles the queued release once the worker has gone.
func TestGrantWhoseReleaseGetsNoAnswerIsNotReacquired(t *testing.T) {
	e := lingerExecutor(time.Second, 1)
	log := slog.New(slog.DiscardHandler)
	calls := 0
	g := &flakyGrant{key: "payout:a", calls: &calls}
	e.releaseLater("a", g)
	if !e.reserve("a", time.Now()) {
		t.Fatal("the account could not be reserved")
	}
	res := e.workAccount(noAcquireSession{t: t}, log, "a", workSeen{})
	e.finishRound(log, "a", res, time.Now())
	if !res.held || res.acquired {
		t.Fatalf("round: %+v; want the account left (held), nothing acquired", res)
	}
	if p, ok := e.unreleased["a"]; !ok || p.g != g {
		t.Fatalf("queued release: %+v (%v); want the grant still queued", p, ok)
	}
	e.retryReleases(log)
	if calls != 1 || len(e.unreleased) != 0 {
		t.Fatalf("after the release pass: %d release call(s), %d queued; want 1, 0", calls, len(e.unreleased))
	}
}

// TestGrantNotKept: lingering off, a stop requested, or a grant no longer
// valid: the round releases as before.
func TestGrantNotKept(t *testing.T) {
	for _, tc := range []struct {
		name   string
		linger time.Duration
		stop   bool
		lost   bool
	}{
		{"linger 0", 0, false, false},
		{"stopping", time.Second, true, false},
		{"grant no longer valid", time.Second, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := lingerExecutor(tc.linger, 1)
			if tc.stop {
				e.stop()
			}
			g := &keptTestGrant{key: "payout:a"}
			g.invalid.Store(tc.lost)
			if e.keep("a", keptGrant{g: g, since: time.Now(), acquired: time.Now()}) || len(e.kept) != 0 {
				t.Fatal("the grant was kept")
			}
		})
	}
}

// TestKeptGrantUnderAWorkerIsLeftToIt: once a worker has reserved the
// account, the grant is that worker's to take: it is not released under
// it (the worker would carry on under a grant freed on the server). A
// grant that is no longer valid is never used: the worker gets none and
// the grant is released once the worker has left.
func TestKeptGrantUnderAWorkerIsLeftToIt(t *testing.T) {
	e := lingerExecutor(time.Second, 1)
	log := slog.New(slog.DiscardHandler)
	g := &keptTestGrant{key: "payout:a"}
	t0 := time.Now()
	endRound(t, e, "a", g, t0)
	e.reserve("a", t0)
	e.expireKept(t0.Add(time.Hour), true)
	e.retryReleases(log)
	if g.releases.Load() != 0 {
		t.Fatal("a kept grant was released while a worker was about to use it")
	}
	g.invalid.Store(true)
	if k, ended := e.takeKept("a", t0); k.g != nil || ended != nil {
		t.Fatal("a kept grant that is no longer valid was handed to a worker (or to release: it is queued)")
	}
	e.retryReleases(log)
	if g.releases.Load() != 0 {
		t.Fatal("released while the worker was on the account")
	}
	e.unreserve("a")
	e.retryReleases(log)
	if n := g.releases.Load(); n != 1 || len(e.unreleased) != 0 {
		t.Fatalf("after the worker left: %d release(s), %d queued; want 1, 0", n, len(e.unreleased))
	}
}

// TestJeopardyQueuesEveryKeptGrant: in jeopardy no kept grant may be used
// again, whatever its age; each is released once the session is healthy.
func TestJeopardyQueuesEveryKeptGrant(t *testing.T) {
	e := lingerExecutor(30*time.Second, 1)
	t0 := time.Now()
	ga, gb := &keptTestGrant{key: "payout:a"}, &keptTestGrant{key: "payout:b"}
	endRound(t, e, "a", ga, t0)
	endRound(t, e, "b", gb, t0)
	if next := e.expireKept(t0, true); !next.IsZero() || len(e.kept) != 0 || len(e.unreleased) != 2 {
		t.Fatalf("in jeopardy: next %v, %d kept, %d queued; want zero, 0, 2", next, len(e.kept), len(e.unreleased))
	}
	e.retryReleases(slog.New(slog.DiscardHandler))
	if ga.releases.Load() != 1 || gb.releases.Load() != 1 {
		t.Fatalf("releases a=%d b=%d, want 1 each", ga.releases.Load(), gb.releases.Load())
	}
}

// TestSpreadWorkKeepsItsGrants: work spread over many accounts — each
// account's next payout arriving seconds after its last — keeps a grant for
// every account a poll of GET /v1/work can list, whatever the worker count.
// A cap tied to the workers (4 × concurrency) released nearly all of them
// before their accounts' next payouts, so that each payout paid an acquire
// and a release at the lock service.
func TestSpreadWorkKeepsItsGrants(t *testing.T) {
	e := lingerExecutor(30*time.Second, 8)
	t0 := time.Now()
	for i := range maxWorkLimit {
		a := fmt.Sprintf("acc-%04d", i)
		endRound(t, e, a, &keptTestGrant{key: "payout:" + a}, t0.Add(time.Duration(i)*time.Microsecond))
	}
	if len(e.kept) != maxWorkLimit || len(e.unreleased) != 0 {
		t.Fatalf("after rounds on %d accounts with 8 workers: %d grants kept, %d queued for release; want every one kept", maxWorkLimit, len(e.kept), len(e.unreleased))
	}
	if k, _ := e.takeKept("acc-0000", t0); k.g == nil {
		t.Fatal("the first account's grant was not kept for its next round")
	}
}

// TestKeptGrantsAreCapped: past the cap the oldest kept grant no worker is
// about to take is queued for release.
func TestKeptGrantsAreCapped(t *testing.T) {
	e := lingerExecutor(30*time.Second, 1)
	e.keptCap = 4
	t0 := time.Now()
	gs := map[string]*keptTestGrant{}
	for i, a := range []string{"a", "b", "c", "d", "e"} {
		gs[a] = &keptTestGrant{key: "payout:" + a}
		endRound(t, e, a, gs[a], t0.Add(time.Duration(i)*time.Millisecond))
	}
	if _, queued := e.unreleased["a"]; !queued || len(e.kept) != 4 {
		t.Fatalf("after 5 kept with a cap of 4: queued %v, %d kept; want the oldest (a) queued, 4 kept", e.unreleased, len(e.kept))
	}
	// b is the oldest now, but a worker has reserved it: c goes instead.
	e.reserve("b", t0)
	gs["f"] = &keptTestGrant{key: "payout:f"}
	endRound(t, e, "f", gs["f"], t0.Add(time.Second))
	if _, queued := e.unreleased["c"]; !queued {
		t.Fatalf("queued %v, want c (b is reserved by a worker)", e.unreleased)
	}
	if _, kept := e.kept["b"]; !kept {
		t.Fatal("a grant a worker was about to take was queued for release")
	}
	if v := gaugeValue(t, e.m.keptGrants); v != 4 {
		t.Fatalf("kept_grants = %v, want 4", v)
	}
}

// TestSessionEndDropsKeptGrants: when the session ends (closed: it
// releases every lock; or lost) nothing of it is left to use or release.
func TestSessionEndDropsKeptGrants(t *testing.T) {
	e := lingerExecutor(time.Second, 1)
	endRound(t, e, "a", &keptTestGrant{key: "payout:a"}, time.Now())
	e.releaseLater("b", &keptTestGrant{key: "payout:b"})
	buf := newSyncBuf()
	e.dropKept(slog.New(slog.NewJSONHandler(buf, nil)), true)
	if len(e.kept) != 0 || len(e.unreleased) != 0 || gaugeValue(t, e.m.keptGrants) != 0 {
		t.Fatalf("after the session ended: %d kept, %d queued", len(e.kept), len(e.unreleased))
	}
	// The release of b failed and was to be retried on the next poll:
	// that retry is dropped, and one line says so.
	const msg = "lock session lost: dropping the queued lock releases; those locks end with the session's TTL"
	if l := logLines(t, buf, "INFO", msg); len(l) != 1 || l[0]["keys"] != float64(1) {
		t.Fatalf("logged %v; want one INFO line %q with keys 1:\n%s", l, msg, buf)
	}
}

// gaugeValue reads a gauge.
func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// counter reads a counter of the executor's registry (0 when absent).
func counter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// grantsOfKey is the grant log of account's key.
func (s *testBundle) grantsOfKey(t *testing.T, account string) []lockclient.GrantRecord {
	t.Helper()
	all, err := s.lock.AllGrants(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []lockclient.GrantRecord
	for _, g := range all {
		if g.Key == fencing.Key(account) {
			out = append(out, g)
		}
	}
	return out
}

// startExecutor runs an executor in this process until the returned stop
// is called; stop waits for Run to return and fails the test on an error.
func startExecutor(t *testing.T, cfg Config) (*Executor, func()) {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	return e, func() {
		t.Helper()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("Run did not return after the stop request")
		}
	}
}

// TestGrantLingerInProcess runs executors with --grant-linger against real
// services.
func TestGrantLingerInProcess(t *testing.T) {
	t.Parallel() // owns its stack and databases
	s := setup(t)
	ctx := context.Background()
	account := func(id string) {
		t.Helper()
		if _, err := s.pay.CreateAccount(ctx, pc.CreateAccountRequest{ID: id, Currency: "EUR", OpeningBalance: 100_000}); err != nil {
			t.Fatal(err)
		}
	}
	payout := func(id, acc string) {
		t.Helper()
		if _, err := s.pay.CreatePayout(ctx, pc.CreatePayoutRequest{ID: id, AccountID: acc, Amount: 100, Currency: "EUR", BeneficiaryRef: "BEN-" + id}); err != nil {
			t.Fatal(err)
		}
	}
	posted := func(id string) {
		t.Helper()
		waitFor(t, time.Minute, id+" to be posted", func() bool { return s.state(t, id) == pc.Posted })
	}
	// oneAfterAnother makes n payouts of acc (acc-0 ... acc-n-1), each
	// once the one before is posted.
	oneAfterAnother := func(acc string, n int) {
		t.Helper()
		for i := range n {
			id := fmt.Sprintf("%s-%d", acc, i)
			payout(id, acc)
			posted(id)
		}
	}
	// The session TTL leaves keepalives room on a loaded machine: a
	// failed one (jeopardy) drops every kept grant.
	lingering := func(owner string, linger time.Duration) Config {
		cfg := s.config(t, owner, io.Discard)
		cfg.SessionTTL, cfg.GrantLinger = 10*time.Second, linger
		return cfg
	}
	// byHand is an executor that is not running, with a session of its
	// own holding account's key, for a test to drive rounds itself.
	byHand := func(t *testing.T, acc, owner string) (*Executor, session, grant) {
		t.Helper()
		account(acc)
		e, err := New(lingering(owner, 30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		e.base = ctx
		sess, err := e.lock.Open(ctx, owner)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sess.Close(ctx) })
		g, err := sess.TryAcquire(ctx, fencing.Key(acc))
		if err != nil {
			t.Fatal(err)
		}
		return e, sess, g
	}

	// Payouts arriving one after another on an account: the first round's
	// grant, kept, drives the later ones; the lock service grants the key
	// once. With --grant-linger 0 it would grant it once per payout.
	t.Run("one grant drives payouts that arrive one after another", func(t *testing.T) {
		account("lg-seq")
		cfg := lingering("lg-exec-seq", 30*time.Second)
		_, stop := startExecutor(t, cfg)
		const n = 4
		oneAfterAnother("lg-seq", n)
		stop()
		if grants := s.grantsOfKey(t, "lg-seq"); len(grants) != 1 {
			t.Errorf("the lock service granted payout:lg-seq %d times for %d payouts made one after another, want once", len(grants), n)
		}
		acquired := counter(t, cfg.Registry, "payouts_executor_lock_acquires_total", "result", "acquired")
		kept := counter(t, cfg.Registry, "payouts_executor_lock_acquires_total", "result", "kept")
		// Every later payout ran under the kept grant; a wake-up may also
		// start a round under it with nothing new to do (seen once on a
		// loaded machine), so kept is at least, not exactly, one per
		// later payout. The grant count above is what proves one grant.
		if acquired != 1 || kept < n-1 {
			t.Errorf("lock acquires: acquired %v, kept %v; want 1 and at least %d", acquired, kept, n-1)
		}
	})

	// A round under the kept grant starts from the payouts GET /work
	// carried (workSeen): the account's payouts are listed once, by the
	// round that acquired the grant. The poll interval is long, so the
	// poll loop asks for work only when a round has ended, as it does
	// under load, and not while one runs unless a round takes longer
	// than the 5 s poll interval.
	t.Run("rounds under a kept grant start from what GET /work carried", func(t *testing.T) {
		account("lg-carried")
		cfg := lingering("lg-exec-carried", 30*time.Second)
		cfg.PollInterval = 5 * time.Second
		before := s.payCalls(t)
		_, stop := startExecutor(t, cfg)
		const n = 4
		oneAfterAnother("lg-carried", n)
		stop()
		after := s.payCalls(t)
		if lists := after["GET /v1/payouts"] - before["GET /v1/payouts"]; lists != 1 {
			t.Errorf("%d lists of the account's payouts for %d payouts made one after another under one grant, want 1 (the first round's)", lists, n)
		}
		if kept := counter(t, cfg.Registry, "payouts_executor_lock_acquires_total", "result", "kept"); kept != n-1 {
			t.Errorf("rounds under the kept grant: %v, want %d", kept, n-1)
		}
		// Nothing was stale: no step was refused.
		events, err := s.pay.SafetyEvents(ctx, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range events.Items {
			if ev.Key == fencing.Key("lg-carried") {
				t.Errorf("safety event on the account: %+v", ev)
			}
		}
	})

	// A payment resource older than GET /work's payouts refuses it as an
	// unknown parameter: the executor asks once, then without it, and
	// pays as before, every round listing its account's payouts.
	t.Run("a payment resource that does not carry payouts in GET /work", func(t *testing.T) {
		account("lg-older")
		target, err := url.Parse(s.st.Ready.PaymentURL)
		if err != nil {
			t.Fatal(err)
		}
		var refused, asked, lists atomic.Int32
		fwd := httputil.NewSingleHostReverseProxy(target)
		older := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/v1/work":
				asked.Add(1)
				if r.URL.Query().Has("payouts") {
					refused.Add(1)
					problem.Write(w, wire.BadField("payouts", "unknown query parameter (limit, wait_ms, skip)"))
					return
				}
			case "/v1/payouts":
				lists.Add(1)
			}
			fwd.ServeHTTP(w, r)
		}))
		defer older.Close()
		log := newSyncBuf()
		cfg := s.config(t, "lg-exec-older", log)
		cfg.SessionTTL, cfg.GrantLinger, cfg.PaymentURL = 10*time.Second, 30*time.Second, older.URL
		_, stop := startExecutor(t, cfg)
		oneAfterAnother("lg-older", 2)
		stop()
		if n, all := refused.Load(), asked.Load(); n != 1 || all < 2 {
			t.Errorf("GET /work: %d asked with payouts and refused, %d in all; want 1 refused, then asked without", n, all)
		}
		// Each round lists the account's payouts, the kept grant's too.
		if n := lists.Load(); n < 2 {
			t.Errorf("%d lists of the account's payouts for 2 rounds, want one a round", n)
		}
		if c := strings.Count(log.String(), "does not take GET /v1/work's payouts parameter"); c != 1 {
			t.Errorf("%d warnings about the older payment resource, want 1", c)
		}
	})

	// The kept grant is given back once idle for the linger, while the
	// executor runs on: another session can then take the key.
	t.Run("a kept grant is released after the linger", func(t *testing.T) {
		account("lg-rel")
		const linger = 2 * time.Second
		cfg := lingering("lg-exec-rel", linger)
		e, stop := startExecutor(t, cfg)
		defer stop()
		payout("lg-rel-1", "lg-rel")
		posted("lg-rel-1")
		other, err := s.lock.Open(ctx, "lg-other")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = other.Close(ctx) }()
		var g *lockclient.Grant
		waitFor(t, time.Minute, "another session to take payout:lg-rel", func() bool {
			g, err = other.TryAcquire(ctx, fencing.Key("lg-rel"))
			if err != nil && !problem.Has(err, problem.LockHeld) {
				t.Fatal(err)
			}
			return err == nil
		})
		if err := other.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		p, err := s.pay.Payout(ctx, "lg-rel-1")
		if err != nil {
			t.Fatal(err)
		}
		var ours *lockclient.GrantRecord
		for _, gr := range s.grantsOfKey(t, "lg-rel") {
			if gr.Holder() == p.ClaimedBy {
				ours = &gr
			}
		}
		// Released by the executor (its session lives on), no sooner than
		// the linger after the payout was posted under it.
		switch {
		case ours == nil || ours.EndedAt == nil || ours.EndReason == nil:
			t.Fatalf("the executor's grant %+v has not ended", ours)
		case *ours.EndReason != "released":
			t.Fatalf("the executor's grant ended %q, want released", *ours.EndReason)
		case ours.EndedAt.Sub(*p.SettledAt) < linger-10*time.Millisecond:
			t.Fatalf("the executor's grant ended %s after the payout was posted, want at least the linger %s",
				ours.EndedAt.Sub(*p.SettledAt), linger)
		}
		if v := gaugeValue(t, e.m.keptGrants); v != 0 {
			t.Fatalf("kept_grants = %v after the release, want 0", v)
		}
	})

	// A grant that drove the per-grant budget is given back even with
	// work left, so other executors get a turn; the next round takes a new
	// grant, and that one, ending with nothing left, is kept.
	t.Run("a grant that reached the per-grant budget is given back", func(t *testing.T) {
		account("lg-budget")
		const n = maxPayoutsPerGrant + 10
		for i := range n {
			payout(fmt.Sprintf("lg-budget-%02d", i), "lg-budget")
		}
		cfg := lingering("lg-exec-budget", 30*time.Second)
		_, stop := startExecutor(t, cfg)
		defer stop()
		for i := range n {
			posted(fmt.Sprintf("lg-budget-%02d", i))
		}
		grants := s.grantsOfKey(t, "lg-budget")
		if len(grants) != 2 {
			t.Fatalf("%d grants of payout:lg-budget for %d payouts, want 2 (the budget, then the rest): %+v", len(grants), n, grants)
		}
		first, second := grants[0], grants[1]
		if first.Token > second.Token {
			first, second = second, first
		}
		if first.EndReason == nil || *first.EndReason != "released" {
			t.Errorf("the grant that drove the budget ended %v, want released while the executor runs", first.EndReason)
		}
		if second.EndedAt != nil {
			t.Errorf("the grant that drove the rest ended (%v); want it kept", *second.EndReason)
		}
	})

	// GET /v1/work can list an account as its last payout settles. The
	// round that finds nothing to do is no fault of the account: it does
	// not cool it down; a kept grant stays kept (its linger running on),
	// a freshly acquired one is released.
	t.Run("a round that finds nothing to do", func(t *testing.T) {
		e, sess, g := byHand(t, "lg-empty", "lg-exec-empty")
		key := fencing.Key("lg-empty")
		log := slog.New(slog.DiscardHandler)
		since := time.Now().Add(-time.Second)
		endRound(t, e, "lg-empty", g, since)
		round := func() roundResult {
			t.Helper()
			now := time.Now()
			if !e.reserve("lg-empty", now) {
				t.Fatal("the account could not be reserved: cooling down?")
			}
			res := e.workAccount(sess, log, "lg-empty", workSeen{})
			if e.finishRound(log, "lg-empty", res, now) {
				t.Fatal("a round with nothing to do reported progress")
			}
			return res
		}
		if res := round(); !res.acquired || !res.empty {
			t.Fatalf("round under the kept grant: %+v, want acquired and empty", res)
		}
		if k, ok := e.kept["lg-empty"]; !ok || !k.since.Equal(since) {
			t.Fatalf("kept after the empty round: %+v (%v); want the grant, kept since %v", k, ok, since)
		}
		if l, err := s.lock.Lock(ctx, key); err != nil || !l.Held || l.SessionID != sess.ID() {
			t.Fatalf("%s after the empty round: %+v, %v; want held by %s", key, l, err, sess.ID())
		}
		e.expireKept(since.Add(time.Hour), false)
		e.retryReleases(log)
		if res := round(); !res.acquired || !res.empty {
			t.Fatalf("round under a new grant: %+v, want acquired and empty", res)
		}
		if l, err := s.lock.Lock(ctx, key); err != nil || l.Held || len(e.kept) != 0 {
			t.Fatalf("%s after an empty round under a new grant: %+v, %v, kept %v; want free, nothing kept", key, l, err, e.kept)
		}
		if c := e.cooling["lg-empty"]; c != nil {
			t.Fatalf("the account cools down until %v after rounds with nothing to do", c.until)
		}
		acquired := counter(t, e.cfg.Registry, "payouts_executor_lock_acquires_total", "result", "acquired")
		kept := counter(t, e.cfg.Registry, "payouts_executor_lock_acquires_total", "result", "kept")
		if acquired != 1 || kept != 1 {
			t.Fatalf("lock acquires: acquired %v, kept %v; want 1 and 1", acquired, kept)
		}
	})

	// A payout that comes as its account's kept grant has ended (here:
	// twice the linger after its acquire), before a poll released it, is
	// paid in that round under a new grant: the worker gives the old one
	// back itself and acquires. The account is not left for a second as
	// if another session held it (which left more than a payout in a
	// hundred waiting that long at 100 payouts/s).
	t.Run("a payout on an account whose kept grant has ended", func(t *testing.T) {
		e, sess, old := byHand(t, "lg-ended", "lg-exec-ended")
		log := slog.New(slog.DiscardHandler)
		// Acquired 65 s ago, kept since 10 s ago: within its 30 s linger
		// but past twice the linger after its acquire (5 s ago), and no
		// poll ran.
		e.reserve("lg-ended", time.Now())
		if !e.keep("lg-ended", keptGrant{g: old, since: time.Now().Add(-10 * time.Second), acquired: time.Now().Add(-65 * time.Second)}) {
			t.Fatal("the grant was not kept")
		}
		e.unreserve("lg-ended")
		payout("lg-ended-1", "lg-ended")
		now := time.Now()
		if !e.reserve("lg-ended", now) {
			t.Fatal("the account could not be reserved")
		}
		res := e.workAccount(sess, log, "lg-ended", workSeen{})
		e.finishRound(log, "lg-ended", res, now)
		if res.held || !res.acquired || !res.moved {
			t.Fatalf("round: %+v; want the key acquired and the payout moved", res)
		}
		if c := e.cooling["lg-ended"]; c != nil {
			t.Fatalf("the account cools down until %v", c.until)
		}
		posted("lg-ended-1")
		p, err := s.pay.Payout(ctx, "lg-ended-1")
		if err != nil {
			t.Fatal(err)
		}
		if p.Token <= old.Token() {
			t.Fatalf("the payout moved under token %d; want a new grant's, above the ended one's %d", p.Token, old.Token())
		}
		found := false
		for _, gr := range s.grantsOfKey(t, "lg-ended") {
			if gr.Token == old.Token() {
				found = true
				if gr.EndReason == nil || *gr.EndReason != "released" {
					t.Fatalf("the ended kept grant: %+v; want released", gr)
				}
			}
		}
		if !found {
			t.Fatalf("the ended kept grant (token %d) is not in the grant log", old.Token())
		}
		if len(e.unreleased) != 0 {
			t.Fatalf("%d release(s) queued; want none (the worker released it itself)", len(e.unreleased))
		}
	})

	// A stop releases what is kept: the session's close gives back every
	// lock, and nothing of it is left in the executor.
	t.Run("kept grants are released on stop", func(t *testing.T) {
		account("lg-stop-a")
		account("lg-stop-b")
		cfg := lingering("lg-exec-stop", 30*time.Second)
		e, stop := startExecutor(t, cfg)
		payout("lg-stop-a1", "lg-stop-a")
		payout("lg-stop-b1", "lg-stop-b")
		posted("lg-stop-a1")
		posted("lg-stop-b1")
		waitFor(t, time.Minute, "both grants to be kept", func() bool {
			return gaugeValue(t, e.m.keptGrants) == 2
		})
		stop()
		e.mu.Lock()
		kept, queued := len(e.kept), len(e.unreleased)
		e.mu.Unlock()
		if kept != 0 || queued != 0 || gaugeValue(t, e.m.keptGrants) != 0 {
			t.Fatalf("after the stop: %d kept, %d queued for release; want none", kept, queued)
		}
		for _, acc := range []string{"lg-stop-a", "lg-stop-b"} {
			l, err := s.lock.Lock(ctx, fencing.Key(acc))
			if err != nil || l.Held {
				t.Fatalf("payout:%s after a graceful stop: %+v, %v; want free", acc, l, err)
			}
		}
	})
}

// TestReleasePassesRunInTheBackground: the dispatch loop does not wait on
// the lock service for releases. A grant queued while a pass runs is
// released by that pass; a release with no verdict waits for the next
// poll instead of being retried at once.
func TestReleasePassesRunInTheBackground(t *testing.T) {
	e := lingerExecutor(time.Second, 2)
	log := slog.New(slog.DiscardHandler)
	calls := 0
	ga := &blockingGrant{flakyGrant: flakyGrant{key: "payout:a", calls: &calls}, entered: make(chan struct{}), proceed: make(chan struct{})}
	e.mu.Lock()
	e.unreleased["a"] = toRelease{g: ga}
	e.mu.Unlock()
	var wg sync.WaitGroup
	e.startReleases(log, &wg) // returns while a's release hangs
	<-ga.entered
	gb := &keptTestGrant{key: "payout:b"}
	noAnswer := fmt.Errorf("%w: connection refused", httpx.ErrTransport)
	gc := &flakyGrant{key: "payout:c", errs: []error{noAnswer}, calls: new(int)}
	e.mu.Lock()
	e.unreleased["b"] = toRelease{g: gb}
	e.unreleased["c"] = toRelease{g: gc}
	e.mu.Unlock()
	e.startReleases(log, &wg) // a pass is running: it takes b and c too
	close(ga.proceed)
	wg.Wait()
	e.mu.Lock()
	defer e.mu.Unlock()
	if calls != 1 || gb.releases.Load() != 1 || *gc.calls != 1 {
		t.Fatalf("releases a=%d b=%d c=%d, want one each", calls, gb.releases.Load(), *gc.calls)
	}
	if p, queued := e.unreleased["c"]; len(e.unreleased) != 1 || !queued || !p.failed {
		t.Fatalf("queued after the pass: %v; want only c, marked failed", e.unreleased)
	}
	if e.releasing || len(e.active) != 0 {
		t.Fatalf("after the pass: releasing %v, reserved %v", e.releasing, e.active)
	}
}

// TestExpireKeptReleasesEachGrantAtItsEnd: expireKept does not walk the
// kept grants before the earliest end it knows of, and that earliest end
// follows every grant kept since, whatever the order of their ends: a
// grant kept later with an earlier end (a shorter time left of its two
// lingers) is released at its end, and one taken by its worker no longer
// counts once a walk has passed.
func TestExpireKeptReleasesEachGrantAtItsEnd(t *testing.T) {
	e := lingerExecutor(time.Second, 2)
	t0 := time.Now()
	ga, gb, gc := &keptTestGrant{key: "payout:a"}, &keptTestGrant{key: "payout:b"}, &keptTestGrant{key: "payout:c"}
	endRound(t, e, "a", ga, t0) // ends t0+1s
	if next := e.expireKept(t0.Add(100*time.Millisecond), false); !next.Equal(t0.Add(time.Second)) {
		t.Fatalf("next wake %v, want a's end at 1s", next.Sub(t0))
	}
	// b, acquired 1.7 s before, is kept now: it ends at t0+300ms, before a.
	e.reserve("b", t0)
	if !e.keep("b", keptGrant{g: gb, since: t0.Add(200 * time.Millisecond), acquired: t0.Add(-1700 * time.Millisecond)}) {
		t.Fatal("b was not kept")
	}
	e.unreserve("b")
	if next := e.expireKept(t0.Add(200*time.Millisecond), false); !next.Equal(t0.Add(300 * time.Millisecond)) {
		t.Fatalf("next wake %v, want b's end at 300ms", next.Sub(t0))
	}
	e.expireKept(t0.Add(300*time.Millisecond), false)
	if _, ok := e.unreleased["b"]; !ok || len(e.kept) != 1 {
		t.Fatalf("at b's end: b queued %v, %d kept; want b queued and a kept", ok, len(e.kept))
	}
	// c ends at t0+1.5s; a is taken by its worker: the next walk finds c.
	endRound(t, e, "c", gc, t0.Add(500*time.Millisecond))
	e.reserve("a", t0.Add(600*time.Millisecond))
	if k, _ := e.takeKept("a", t0.Add(600*time.Millisecond)); k.g != ga {
		t.Fatal("a's worker did not get its kept grant")
	}
	if next := e.expireKept(t0.Add(700*time.Millisecond), false); !next.Equal(t0.Add(time.Second)) {
		t.Fatalf("next wake %v, want a's old end at 1s: nothing is walked before it", next.Sub(t0))
	}
	if next := e.expireKept(t0.Add(time.Second), false); !next.Equal(t0.Add(1500*time.Millisecond)) || len(e.kept) != 1 {
		t.Fatalf("after a walk: next wake %v with %d kept, want c's end at 1.5s with c kept", next.Sub(t0), len(e.kept))
	}
	if _, ok := e.unreleased["a"]; ok {
		t.Fatal("a, taken by its worker, was queued for release")
	}
	// all: every kept grant goes, whatever its end.
	if next := e.expireKept(t0.Add(time.Second), true); !next.IsZero() || len(e.kept) != 0 {
		t.Fatalf("all: next wake %v with %d kept, want none", next, len(e.kept))
	}
}

// TestARoundStartsFromWorkOnlyWhatItsKeptGrantLastSaw: a round takes the
// payouts GET /work carried instead of listing them only under a kept
// grant whose token was the account's fence in that answer (no other
// holder wrote since), only when the answer was asked after the grant's
// last round ended (it saw every write of that round), and only when it
// carried them all.
func TestARoundStartsFromWorkOnlyWhatItsKeptGrantLastSaw(t *testing.T) {
	g := &keptTestGrant{key: "payout:a"} // token 9
	t0 := time.Now()
	kept := keptGrant{g: g, since: t0, acquired: t0}
	ps := []pc.Payout{{ID: "p-1", AccountID: "a", State: pc.Pending}}
	item := pc.WorkItem{AccountID: "a", Payouts: 1, FenceToken: 9, Actionable: ps}
	for _, c := range []struct {
		name string
		w    workSeen
		k    keptGrant
		ok   bool
	}{
		{"kept grant, its fence, asked after its round", workSeen{item, t0.Add(time.Millisecond)}, kept, true},
		{"a grant just acquired", workSeen{item, t0.Add(time.Millisecond)}, keptGrant{}, false},
		{"asked while its last round ran", workSeen{item, t0.Add(-time.Millisecond)}, kept, false},
		{"asked as its last round ended", workSeen{item, t0}, kept, false},
		{"another holder's fence", workSeen{func() pc.WorkItem { i := item; i.FenceToken = 10; return i }(), t0.Add(time.Millisecond)}, kept, false},
		{"an earlier holder's fence", workSeen{func() pc.WorkItem { i := item; i.FenceToken = 8; return i }(), t0.Add(time.Millisecond)}, kept, false},
		{"not carried (more than asked for)", workSeen{func() pc.WorkItem { i := item; i.Actionable = nil; return i }(), t0.Add(time.Millisecond)}, kept, false},
	} {
		got, ok := startingPayouts(c.w, c.k)
		if ok != c.ok || (ok && (len(got) != 1 || got[0].ID != "p-1")) {
			t.Errorf("%s: %v %v, want ok %v", c.name, got, ok, c.ok)
		}
	}
}

// TestExpireKeptCountsAGrantKeptWhileItsWorkerLeaves: a walk that finds an
// account still reserved by the worker that has just kept its grant leaves
// the grant to it, and still counts its end: the grant is released then,
// not at a later grant's end.
func TestExpireKeptCountsAGrantKeptWhileItsWorkerLeaves(t *testing.T) {
	e := lingerExecutor(time.Second, 3)
	t0 := time.Now()
	ga, gb, gc := &keptTestGrant{key: "payout:a"}, &keptTestGrant{key: "payout:b"}, &keptTestGrant{key: "payout:c"}
	endRound(t, e, "a", ga, t0)                           // ends at 1s
	endRound(t, e, "b", gb, t0.Add(800*time.Millisecond)) // ends at 1.8s
	// c's worker keeps its grant (ends at 1.2s) and has not left the
	// account yet when a's end comes.
	e.reserve("c", t0.Add(200*time.Millisecond))
	if !e.keep("c", keptGrant{g: gc, since: t0.Add(200 * time.Millisecond), acquired: t0.Add(200 * time.Millisecond)}) {
		t.Fatal("c was not kept")
	}
	if next := e.expireKept(t0.Add(time.Second), false); !next.Equal(t0.Add(1200 * time.Millisecond)) {
		t.Fatalf("next wake %v, want c's end at 1.2s", next.Sub(t0))
	}
	if _, ok := e.unreleased["c"]; ok {
		t.Fatal("c was queued for release while its worker was on the account")
	}
	e.unreserve("c")
	e.expireKept(t0.Add(1200*time.Millisecond), false)
	if _, ok := e.unreleased["c"]; !ok {
		t.Fatalf("c not queued for release at its end; %d kept", len(e.kept))
	}
}

// TestExpireKeptLooksAgainSoonAtAGrantItsWorkerHolds: a kept grant past its
// end whose account a worker has just reserved is that worker's to release
// (takeKept); the walk leaves it and looks again keptRecheck later, not at
// once, so the poll loop does not spin while the worker gets to it.
func TestExpireKeptLooksAgainSoonAtAGrantItsWorkerHolds(t *testing.T) {
	e := lingerExecutor(time.Second, 1)
	t0 := time.Now()
	endRound(t, e, "a", &keptTestGrant{key: "payout:a"}, t0) // ends at 1s
	at := t0.Add(1500 * time.Millisecond)
	e.reserve("a", at)
	if next := e.expireKept(at, false); !next.Equal(at.Add(keptRecheck)) {
		t.Fatalf("next wake %v after the walk, want keptRecheck (%v) later", next.Sub(at), keptRecheck)
	}
	if _, ok := e.unreleased["a"]; ok || len(e.kept) != 1 {
		t.Fatal("the walk took a grant whose account a worker holds")
	}
	if k, ended := e.takeKept("a", at); k.g != nil || ended == nil {
		t.Fatal("the worker did not get the grant past its end to release")
	}
}
