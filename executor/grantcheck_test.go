package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/railgate"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// advance takes the PENDING payout id of account, under a grant of the
// account's key that it then releases, to RAIL_SUBMITTED (nothing sent to
// the proxy: an executor that stopped between its two steps) or on to
// RAIL_ACKED (sent and paid, the outcome recorded, nothing posted).
func (s *testBundle) advance(t *testing.T, id, account string, to pc.State) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := s.st.Ready
	pay, err := pc.New(r.PaymentURL, r.Tokens.Executor)
	if err != nil {
		t.Fatal(err)
	}
	prx, err := proxyclient.New(r.ProxyURL, r.Tokens.Executor)
	if err != nil {
		t.Fatal(err)
	}
	lc, err := lockclient.New(r.LockURL, lockclient.WithToken(r.Tokens.Executor))
	if err != nil {
		t.Fatal(err)
	}
	sess, err := lc.Open(ctx, "writer:test")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sess.Close(context.WithoutCancel(ctx)) }()
	g, err := sess.Acquire(ctx, fencing.Key(account), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := sess.Release(context.WithoutCancel(ctx), g); err != nil {
			t.Fatal(err)
		}
	}()
	if _, err := pay.Claim(ctx, id, g.Token, g.Holder()); err != nil {
		t.Fatal(err)
	}
	p, err := pay.Submitting(ctx, id, g.Token, g.Holder())
	if err != nil {
		t.Fatal(err)
	}
	if to == pc.RailSubmitted {
		return
	}
	rec, err := prx.Submit(ctx, submission(p), g.Token, g.Holder())
	if err != nil || rec.Outcome != proxyclient.OutcomeAcked {
		t.Fatalf("submission of %s: %+v, %v; want ACKED", id, rec, err)
	}
	if p, err = pay.ReportOutcome(ctx, id, g.Token, g.Holder(), pc.OutcomeAcked, rec.RailRef, ""); err != nil || p.State != to {
		t.Fatalf("outcome of %s: %s, %v; want %s", id, p.State, err, to)
	}
}

// A payout found RAIL_SUBMITTED is looked up at the proxy before it is
// submitted (D-4), and that call can outlive the grant or put its session
// in jeopardy: the grant is checked again right before the submission
// (D-11). A grant that turned invalid while the lookup ran sends nothing;
// the next round asks again and submits under its own grant.
func TestAResubmissionChecksTheGrantAfterItsLookup(t *testing.T) {
	t.Parallel() // owns its stack and databases
	s := setup(t)
	ids := s.fundedPage(t, "relook", 1)
	s.advance(t, ids[0], "relook", pc.RailSubmitted)
	var p poison
	var lookups, atFirstSubmit atomic.Int32
	cfg := s.config(t, "relook-exec", io.Discard)
	cfg.ProxyURL = frontOf(t, s.st.Ready.ProxyURL, func(r *http.Request) {
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/v1/submissions/"+ids[0]:
			if lookups.Add(1) == 1 {
				p.arm() // the grant is lost while the proxy answers
			}
		case r.Method == http.MethodPost && r.URL.Path == "/v1/submissions":
			atFirstSubmit.CompareAndSwap(0, lookups.Load())
		}
	})
	cfg.locker = poisoned(t, cfg, &p)
	runUntil(t, cfg, "the payout to be posted", s.allIn(t, ids, pc.Posted))
	if lookups.Load() == 0 {
		t.Fatal("the payout was never looked up: the test exercised nothing")
	}
	if got := atFirstSubmit.Load(); got < 2 {
		t.Errorf("the payout was submitted after %d lookup(s), want at least 2: it went to the proxy under the grant that was lost during the first", got)
	}
	s.paidOnceEach(t, ids)
}

// A batch the proxy refuses for its input is sent again one payout at a
// time, after a call that can outlive the grant: a grant lost meanwhile
// sends none of them. The payouts stay RAIL_SUBMITTED and the next round
// settles them as D-4 says: each asked about, then resubmitted marked so.
func TestARefusedBatchIsResentOnlyUnderAValidGrant(t *testing.T) {
	t.Parallel() // owns its stack and databases
	s := setup(t)
	const n = 4
	ids := s.fundedPage(t, "rebatch", n)
	var p poison
	var refused, unmarked, marked atomic.Int32
	cfg := s.config(t, "rebatch-exec", io.Discard)
	u, err := url.Parse(s.st.Ready.ProxyURL)
	if err != nil {
		t.Fatal(err)
	}
	real := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case isBatchSubmission(r) && refused.Add(1) == 1:
			p.arm() // the grant is lost while the proxy answers
			problem.Write(w, problem.New(problem.InvalidRequest, "items: refused for the test").
				With(proxyclient.ForwardedExtension, false))
			return
		}
		countSingleSubmission(t, r, &marked, &unmarked)
		real.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	cfg.ProxyURL = srv.URL
	cfg.locker = poisoned(t, cfg, &p)
	runUntil(t, cfg, "every payout to be posted", s.allIn(t, ids, pc.Posted))
	if refused.Load() == 0 || p.refused.Load() == 0 {
		t.Fatalf("batches refused %d, checks the poisoned grant failed %d: the test exercised nothing", refused.Load(), p.refused.Load())
	}
	if got := unmarked.Load(); got != 0 {
		t.Errorf("%d payouts of the refused batch were sent one at a time under the grant lost while the batch was answered, want 0", got)
	}
	if got := marked.Load(); got < n {
		t.Errorf("%d resubmissions, want at least %d: each payout left RAIL_SUBMITTED is asked about, then resubmitted", got, n)
	}
	s.paidOnceEach(t, ids)
}

// A proxy that refuses the executor's token refuses it on every call: the
// lookup a RAIL_SUBMITTED payout starts with stops the executor (exit 2,
// naming the proxy and the role), as a refused submission does, instead
// of being retried as a transient failure for minutes per payout.
func TestAProxyThatRefusesTheTokenOnALookupStopsTheExecutor(t *testing.T) {
	t.Parallel() // owns its stack and databases
	s := setup(t)
	ids := s.fundedPage(t, "refusedlook", 1)
	s.advance(t, ids[0], "refusedlook", pc.RailSubmitted)
	refuser := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		problem.Write(w, problem.New(problem.Unauthorized, "unknown token"))
	}))
	defer refuser.Close()
	cfg := s.config(t, "refusedlook-exec", io.Discard)
	cfg.ProxyURL = refuser.URL
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- Run(ctx, cfg) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), refuser.URL) || !strings.Contains(err.Error(), `role "executor"`) {
			t.Errorf("Run returned %v; want an error naming %s and the executor role", err, refuser.URL)
		}
	case <-time.After(2 * time.Minute):
		cancel()
		<-done
		t.Error("the executor kept retrying a lookup the proxy refused for the token for two minutes")
	}
	if got := s.state(t, ids[0]); got != pc.RailSubmitted {
		t.Errorf("the payout is %s, want RAIL_SUBMITTED (nothing done)", got)
	}
}

// While claims are paused because the rail gives no usable answer, the
// payouts already in flight are finished as always: a RAIL_ACKED payout
// (paid at the rail, not yet in the ledger) is posted at once, not when
// the pause ends, while the PENDING ones of other accounts stay unclaimed
// — even with more of those accounts waiting longer than a page of
// GET /work holds (an executor of two workers asks for four accounts).
func TestPayoutsInFlightAreFinishedWhileClaimsArePaused(t *testing.T) {
	t.Parallel() // owns its stack and databases
	s := setup(t)
	var waiting []string
	for i := range 6 {
		waiting = append(waiting, s.fundedPage(t, fmt.Sprintf("waiting%d", i), 1)...)
	}
	acked := s.fundedPage(t, "inflight", 1)
	s.advance(t, acked[0], "inflight", pc.RailAcked)
	e, err := New(s.config(t, "paused-exec", io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	// The longest pause: tripped, then every probe failing.
	log := slog.New(slog.DiscardHandler)
	for range railgate.TripAfter {
		e.railAnswer(log, false)
	}
	for time.Until(e.rail.PausedUntil()) < railgate.PauseMax*3/4 {
		e.rail.Admit(e.rail.PausedUntil(), 1)
		e.railAnswer(log, false)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitFor(t, railgate.PauseMax*3/4, "the RAIL_ACKED payout to be posted while claims are paused", s.allIn(t, acked, pc.Posted))
	if e.rail.PausedUntil().IsZero() {
		t.Fatal("the pause ended during the test: it shows nothing")
	}
	for _, id := range waiting {
		if got := s.state(t, id); got != pc.Pending {
			t.Errorf("PENDING payout %s is %s while claims are paused, want PENDING", id, got)
		}
	}
}

// payouts_executor_lock_unavailable is 1 as soon as the lock session is in
// jeopardy (a keepalive failed: nothing new starts), not only once the
// session is lost a whole TTL later.
func TestLockUnavailableWhileTheSessionIsInJeopardy(t *testing.T) {
	t.Parallel()
	const ttl = 15 * time.Second
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/v1/sessions":
			now := time.Now()
			exp := now.Add(ttl)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(lockclient.SessionInfo{SessionID: "s-jeopardy", Owner: "jeopardy", TTLMS: ttl.Milliseconds(), State: "ACTIVE",
				CreatedAt: &now, LastHeartbeatAt: &now, ExpiresAt: &exp})
		case r.URL.Path == "/v1/work": // the payment resource is up; it has no work
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"items":[],"next":""}`))
		default: // every keepalive fails at once
			problem.Write(w, problem.New(problem.Unavailable, "down for the test"))
		}
	}))
	defer srv.Close()
	reg := obs.NewRegistry()
	cfg := Config{Owner: "jeopardy", SessionTTL: ttl, PollInterval: 100 * time.Millisecond, CallTimeout: 5 * time.Second,
		LockURL: srv.URL, PaymentURL: srv.URL, ProxyURL: srv.URL, Token: "t",
		Logger: slog.New(slog.DiscardHandler), Registry: reg}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	defer func() { cancel(); <-done }()
	unavailable := func() float64 { return gathered(t, reg, "payouts_executor_lock_unavailable") }
	waitFor(t, 2*time.Minute, "the session to open", func() bool {
		return counter(t, reg, "payouts_executor_sessions_total", "event", "opened") == 1 && unavailable() == 0
	})
	waitFor(t, 2*time.Minute, "payouts_executor_lock_unavailable to be 1", func() bool { return unavailable() == 1 })
	if lost := counter(t, reg, "payouts_executor_sessions_total", "event", "lost"); lost != 0 {
		t.Errorf("payouts_executor_lock_unavailable became 1 only with the session lost (%v lost), not while it was in jeopardy", lost)
	}
}

// TestALostAnswerThatLandedIsCounted: the payment resource posts a
// RAIL_ACKED payout, and the answer is lost on the way back (the
// connection closes). The executor re-reads the payout and finds it
// POSTED: that is this grant's doing, counted as any final state
// (payouts_executor_payouts_total{outcome="POSTED"}), and the round moved a
// payout, so the account gets no cooldown. Before, the change went
// uncounted and the round was taken for one that moved nothing.
func TestALostAnswerThatLandedIsCounted(t *testing.T) {
	t.Parallel() // owns its stack and databases
	s := setup(t)
	ids := s.fundedPage(t, "lostpost", 1)
	s.advance(t, ids[0], "lostpost", pc.RailAcked)
	target, err := url.Parse(s.st.Ready.PaymentURL)
	if err != nil {
		t.Fatal(err)
	}
	real := httputil.NewSingleHostReverseProxy(target)
	var cut atomic.Int32
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/post") && cut.Add(1) == 1 {
			rec := httptest.NewRecorder()
			real.ServeHTTP(rec, r) // the post lands...
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close() // ...and its answer is lost
			}
			return
		}
		real.ServeHTTP(w, r)
	}))
	defer front.Close()
	logs := newSyncBuf()
	cfg := s.config(t, "lostpost-exec", logs)
	defer func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	}()
	cfg.PaymentURL = front.URL
	reg := cfg.Registry
	// The round ends as one that moved a payout: its grant is kept for
	// the next (a round that moved nothing releases it and cools down).
	runUntil(t, cfg, "the posting to be counted and the round's grant kept", func() bool {
		return counter(t, reg, "payouts_executor_payouts_total", "outcome", "POSTED") == 1 &&
			gathered(t, reg, "payouts_executor_kept_grants") == 1
	})
	if cut.Load() == 0 {
		t.Fatal("no post went through the front: the test exercised nothing")
	}
	if got := gathered(t, reg, "payouts_executor_account_cooldowns_total"); got > 0 {
		t.Errorf("payouts_executor_account_cooldowns_total = %v: the round that posted the payout was taken for one that moved nothing", got)
	}
	if s.state(t, ids[0]) != pc.Posted {
		t.Fatalf("payout %s is %s, want POSTED", ids[0], s.state(t, ids[0]))
	}
	s.paidOnceEach(t, ids)
}

// TestAPayoutThatCannotMoveDoesNotHoldUpItsAccount: one payout of the
// account is RAIL_SUBMITTED and never forwarded, and the proxy cannot
// confirm its resubmission yet (503, "forwarded": false: the rail's answer
// is not final), round after round. The account's PENDING payouts are
// paid meanwhile, under the same grants; the stuck one stays
// RAIL_SUBMITTED, never sent. (Every round used to stop at it, in-flight
// payouts coming first, and the others waited for as long as it did.)
func TestAPayoutThatCannotMoveDoesNotHoldUpItsAccount(t *testing.T) {
	t.Parallel() // owns its stack and databases
	s := setup(t)
	ids := s.fundedPage(t, "stuck", 4)
	stuck, others := ids[0], ids[1:]
	s.advance(t, stuck, "stuck", pc.RailSubmitted)
	var refused atomic.Int32
	runWithProxyFrontUntil(t, s, "stuck-exec", func(real http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && r.URL.Path == "/v1/submissions" {
				body, err := io.ReadAll(r.Body)
				if err != nil {
					t.Errorf("read a submission: %v", err)
				}
				r.Body = io.NopCloser(bytes.NewReader(body))
				if bytes.Contains(body, []byte(`"payout_id":"`+stuck+`"`)) {
					refused.Add(1)
					problem.Write(w, problem.New(problem.Unavailable, "the rail's answer is not final yet").With(proxyclient.ForwardedExtension, false))
					return
				}
			}
			real.ServeHTTP(w, r)
		})
	}, "the account's other payouts to be posted", s.allIn(t, others, pc.Posted))
	if refused.Load() == 0 {
		t.Fatal("the stuck payout was never resubmitted: exercised nothing")
	}
	if st := s.state(t, stuck); st != pc.RailSubmitted {
		t.Fatalf("the stuck payout is %s, want RAIL_SUBMITTED", st)
	}
	s.paidOnceEach(t, others)
}
