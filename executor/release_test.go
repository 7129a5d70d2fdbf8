package executor

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
)

// flakyGrant's release fails with the queued errors, then succeeds.
type flakyGrant struct {
	key   string
	errs  []error
	calls *int
}

func (g *flakyGrant) Key() string            { return g.key }
func (g *flakyGrant) Token() fencing.Token   { return 7 }
func (g *flakyGrant) Holder() fencing.Holder { return "s-1" }
func (g *flakyGrant) Valid() bool            { return true }
func (g *flakyGrant) Done() <-chan struct{}  { return nil }
func (g *flakyGrant) Release(context.Context) error {
	*g.calls++
	if len(g.errs) == 0 {
		return nil
	}
	err := g.errs[0]
	g.errs = g.errs[1:]
	return err
}

func TestReleaseRetryable(t *testing.T) {
	noAnswer := fmt.Errorf("POST /v1/locks/payout:a/release: %w: connection refused", httpx.ErrTransport)
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{noAnswer, true},
		{problem.New(problem.Unavailable, "etcd has no leader"), true},
		{problem.New(problem.NotHeld, "not held"), false},
		{problem.New(problem.SessionExpired, "gone"), false},
		{fmt.Errorf("release: %w", lockclient.ErrSessionLost), false},
	} {
		if got := releaseRetryable(tc.err); got != tc.want {
			t.Errorf("releaseRetryable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestFailedReleaseIsRetriedUntilItLands: a release the lock service never
// answered is retried on later polls, so a live session does not keep the
// key (and block every other holder) for the rest of the process's life.
func TestFailedReleaseIsRetriedUntilItLands(t *testing.T) {
	e := newBareExecutor()
	log := slog.New(slog.DiscardHandler)
	calls := 0
	noAnswer := fmt.Errorf("%w: connection refused", httpx.ErrTransport)
	g := &flakyGrant{key: "payout:a", errs: []error{noAnswer, problem.New(problem.Unavailable, "restarting")}, calls: &calls}
	e.releaseLater("a", g)
	e.retryReleases(log) // fails again: kept
	if _, ok := e.unreleased["a"]; !ok || calls != 1 {
		t.Fatalf("after a second failure: kept=%v calls=%d; want kept, 1 call", ok, calls)
	}
	e.retryReleases(log) // fails again: kept
	e.retryReleases(log) // lands
	if _, ok := e.unreleased["a"]; ok || calls != 3 {
		t.Fatalf("after the release landed: kept=%v calls=%d; want dropped after 3 calls", ok, calls)
	}
	// A verdict (the key moved on) also ends the retries.
	g2 := &flakyGrant{key: "payout:b", errs: []error{problem.New(problem.NotHeld, "not held")}, calls: &calls}
	e.releaseLater("b", g2)
	e.retryReleases(log)
	if _, ok := e.unreleased["b"]; ok {
		t.Fatal("a release refused as not_held is retried forever")
	}
}

// newBareExecutor is an Executor with no services, for the bookkeeping
// tests below.
func newBareExecutor() *Executor {
	e := &Executor{base: context.Background(), log: slog.New(slog.DiscardHandler), cfg: Config{CallTimeout: DefaultCallTimeout, ProxyTimeout: DefaultProxyTimeout, ShutdownGrace: DefaultShutdownGrace}, m: newMetrics(prometheus.NewRegistry()),
		active: map[string]bool{}, cooling: map[string]*cooldown{}, unreleased: map[string]toRelease{}, inRelease: map[string]bool{},
		kept: map[string]keptGrant{}, keptCap: maxKeptGrants}
	e.initStop()
	return e
}

// TestReleaseRetrySkipsAnAccountWithAWorker: a worker on the account may
// have re-acquired the key — the same token comes back to the same
// session — so retrying the old release would free the worker's live
// grant on the server. The retry leaves such an account alone.
func TestReleaseRetrySkipsAnAccountWithAWorker(t *testing.T) {
	e := newBareExecutor()
	calls := 0
	e.releaseLater("a", &flakyGrant{key: "payout:a", calls: &calls})
	if !e.reserve("a", time.Now()) {
		t.Fatal("a worker could not start on the account")
	}
	e.retryReleases(slog.New(slog.DiscardHandler))
	if calls != 0 {
		t.Fatalf("the release was retried %d time(s) while a worker held the account", calls)
	}
	e.unreserve("a")
	e.retryReleases(slog.New(slog.DiscardHandler))
	if calls != 1 {
		t.Fatalf("after the worker left: %d release call(s), want 1", calls)
	}
}

// blockingGrant's release waits until it is let go.
type blockingGrant struct {
	flakyGrant
	entered, proceed chan struct{}
}

func (g *blockingGrant) Release(ctx context.Context) error {
	close(g.entered)
	<-g.proceed
	return g.flakyGrant.Release(ctx)
}

// TestNoWorkerStartsWhileAReleaseIsRetried: the other interleaving, made
// deterministic: the retry's release is in flight when the dispatcher
// looks at the account. No worker may start (and re-acquire the key the
// retry is about to free) until the retry is over.
func TestNoWorkerStartsWhileAReleaseIsRetried(t *testing.T) {
	e := newBareExecutor()
	calls := 0
	g := &blockingGrant{flakyGrant: flakyGrant{key: "payout:a", calls: &calls}, entered: make(chan struct{}), proceed: make(chan struct{})}
	e.releaseLater("a", g)
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.retryReleases(slog.New(slog.DiscardHandler))
	}()
	<-g.entered
	if e.reserve("a", time.Now()) {
		t.Fatal("a worker was allowed onto the account while its old release was in flight")
	}
	close(g.proceed)
	<-done
	if !e.reserve("a", time.Now()) {
		t.Fatal("the account stayed reserved after the retry ended")
	}
	if _, kept := e.unreleased["a"]; kept || calls != 1 {
		t.Fatalf("after the retry: kept=%v calls=%d; want released once", kept, calls)
	}
}

// TestRoundWithoutProgressCoolsTheAccount: any round that held the lock and
// moved nothing — not only a fenced-out one — keeps the account from being
// dispatched again at once; a round that moves a payout clears it.
func TestRoundWithoutProgressCoolsTheAccount(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	now := time.Now()
	for _, tc := range []struct {
		name     string
		res      roundResult
		cools    bool
		progress bool
	}{
		{"lock service failing", roundResult{}, false, false},
		{"lock held elsewhere", roundResult{held: true}, true, false},
		{"nothing moved", roundResult{acquired: true}, true, false},
		{"fenced out", roundResult{acquired: true, fenced: true}, true, false},
		// GET /v1/work listed the account as its last payout settled.
		{"nothing to do", roundResult{acquired: true, empty: true}, false, false},
		{"moved", roundResult{acquired: true, moved: true}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newBareExecutor()
			if !e.reserve("a", now) {
				t.Fatal("reserve")
			}
			if got := e.finishRound(log, "a", tc.res, now); got != tc.progress {
				t.Fatalf("finishRound reports progress %v, want %v", got, tc.progress)
			}
			if cooled := !e.reserve("a", now.Add(100*time.Millisecond)); cooled != tc.cools {
				t.Fatalf("account cooling down: %v, want %v", cooled, tc.cools)
			}
		})
	}
	// The wait doubles with each fruitless round (1 s, 2 s, 4 s, with
	// jitter) and a round that moves a payout resets it.
	e := newBareExecutor()
	var waits []time.Duration
	for range 4 {
		e.reserve("a", now)
		e.finishRound(log, "a", roundResult{acquired: true}, now)
		waits = append(waits, e.cooling["a"].until.Sub(now))
		e.unreserve("a")
	}
	if waits[0] < cooldownMin/2 || waits[0] > cooldownMin || waits[3] < 4*cooldownMin {
		t.Fatalf("cooldowns %v: want the first in [0.5s, 1s] and the fourth at least 4s", waits)
	}
	e.finishRound(log, "a", roundResult{acquired: true, moved: true}, now)
	if !e.reserve("a", now) {
		t.Fatal("a round that moved a payout did not end the cooldown")
	}
}

// TestLockHeldElsewhereIsNotAskedAgainEachPoll: an account whose lock
// another session holds is left alone for a second, not asked for on every
// poll, and then dispatched again; the skip earns no backoff.
func TestLockHeldElsewhereIsNotAskedAgainEachPoll(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	now := time.Now()
	e := newBareExecutor()
	e.cfg.GrantLinger, e.cfg.PollInterval = 3*time.Second, 100*time.Millisecond
	for i := range 3 {
		at := now.Add(time.Duration(i) * 2 * time.Second)
		if !e.reserve("a", at) {
			t.Fatalf("pass %d: the account was not dispatched once the skip had passed", i)
		}
		e.finishRound(log, "a", roundResult{held: true}, at)
		for _, later := range []time.Duration{e.cfg.PollInterval, 900 * time.Millisecond} {
			if e.reserve("a", at.Add(later)) {
				t.Fatalf("pass %d: dispatched again %s after the lock service said another session holds it", i, later)
			}
		}
	}
	// A round that then takes the lock and moves nothing starts the
	// backoff at its first step.
	at := now.Add(6 * time.Second)
	e.reserve("a", at)
	e.finishRound(log, "a", roundResult{acquired: true}, at)
	if w := e.cooling["a"].until.Sub(at); w > cooldownMin {
		t.Fatalf("first cooldown after skips for a held lock: %s, want at most %s", w, cooldownMin)
	}
}

// TestQueuedReleaseLeavesItsAccountOpenUntilItsTurn: while one release is
// in flight, an account whose release still waits for a slot can be taken
// by a worker (a payout arrived for it); the worker's acquire supersedes
// the queued release, which is then not sent.
func TestQueuedReleaseLeavesItsAccountOpenUntilItsTurn(t *testing.T) {
	e := newBareExecutor()
	e.cfg.Concurrency = 1
	calls := map[string]*int{"a": new(int), "b": new(int)}
	gs := map[string]*blockingGrant{}
	for _, a := range []string{"a", "b"} {
		gs[a] = &blockingGrant{flakyGrant: flakyGrant{key: "payout:" + a, calls: calls[a]}, entered: make(chan struct{}), proceed: make(chan struct{})}
		e.unreleased[a] = toRelease{g: gs[a]}
	}
	done := make(chan struct{})
	go func() {
		e.retryReleases(slog.New(slog.DiscardHandler))
		close(done)
	}()
	first, other := "a", "b"
	select {
	case <-gs["a"].entered:
	case <-gs["b"].entered:
		first, other = "b", "a"
	case <-time.After(time.Minute):
		t.Fatal("no release was sent")
	}
	if !e.reserve(other, time.Now()) {
		t.Fatalf("account %s, whose release waits behind %s's, could not be taken by a worker", other, first)
	}
	// The worker's acquire returns the same grant, which supersedes the
	// queued release.
	if g, held := e.acquire(sameGrantSession{g: gs[other]}, slog.New(slog.DiscardHandler), other, "payout:"+other); g == nil || held {
		t.Fatalf("the worker's acquire of %s: grant %v, held %v", other, g, held)
	}
	e.mu.Lock()
	_, queued := e.unreleased[other]
	e.mu.Unlock()
	if queued {
		t.Fatalf("account %s's queued release is still queued after the worker's acquire: it would be sent under the worker's round", other)
	}
	close(gs[first].proceed)
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the release pass did not finish")
	}
	if *calls[other] != 0 || *calls[first] != 1 {
		t.Fatalf("releases sent: %s %d, %s %d; want the first once and none for the account a worker took over", first, *calls[first], other, *calls[other])
	}
	if !e.active[other] || e.active[first] {
		t.Fatalf("reservations after the pass: %v; want only the worker's on %s", e.active, other)
	}
}

// TestAReleaseADispatchWaitedForSignalsTheWake: an account that a dispatch
// could not reserve because a release pass was on it is asked for again as
// soon as that release ends, not at the next poll (a payout that came as
// its account's kept grant was released waited a whole poll interval): the
// release signals e.wake, which runSession sets to its loop's wake-up. A
// release no dispatch waited for signals nothing.
func TestAReleaseADispatchWaitedForSignalsTheWake(t *testing.T) {
	e := newBareExecutor()
	e.wake = make(chan struct{}, 1)
	log := slog.New(slog.DiscardHandler)
	for _, asked := range []bool{false, true} {
		g := &keptTestGrant{key: "payout:a"}
		e.unreleased["a"] = toRelease{g: g}
		if !e.reserveRelease("a", g) {
			t.Fatal("the release pass could not reserve the account")
		}
		if asked && e.reserve("a", time.Now()) {
			t.Fatal("a worker reserved an account a release is on")
		}
		e.releaseQueued(log, "a", toRelease{g: g})
		woken := false
		select {
		case <-e.wake:
			woken = true
		default:
		}
		if woken != asked || g.releases.Load() != 1 {
			t.Fatalf("a dispatch left the account during its release: %v; the poll loop woken: %v (%d release(s))", asked, woken, g.releases.Load())
		}
		if !e.reserve("a", time.Now()) {
			t.Fatal("the account could not be reserved after its release")
		}
		e.unreserve("a")
		if len(e.inRelease) != 0 {
			t.Fatalf("left in inRelease: %v", e.inRelease)
		}
	}
}

// sameGrantSession hands out g on every acquire, as the lock service does
// to a session that holds the key already.
type sameGrantSession struct {
	session
	g grant
}

func (s sameGrantSession) TryAcquire(context.Context, string) (grant, error) { return s.g, nil }
