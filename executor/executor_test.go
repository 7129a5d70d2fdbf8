package executor

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/payouts/payouts/dev/proctest"
	"github.com/payouts/payouts/dev/stack"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

func TestMain(m *testing.M) { proctest.Main(m, nil, leakOptions...) }

// leakOptions name the background goroutines that outlive a test by
// design: idle keep-alive connections of the HTTP clients' shared
// transport, closed by the runtime when the process exits.
var leakOptions = []goleak.Option{
	goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
	goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
}

func TestConfigDefaultsAndLimits(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		want string // substring of the error; "" = valid
	}{
		{"defaults", Config{Owner: "x"}, ""},
		{"no owner", Config{}, "owner is required"},
		{"concurrency too high", Config{Owner: "x", Concurrency: 1000}, "concurrency"},
		{"negative concurrency", Config{Owner: "x", Concurrency: -1}, "concurrency"},
		{"ttl too short", Config{Owner: "x", SessionTTL: 500 * time.Millisecond}, "session TTL"},
		{"ttl too long", Config{Owner: "x", SessionTTL: time.Hour}, "session TTL"},
		{"poll too fast", Config{Owner: "x", PollInterval: time.Millisecond}, "poll interval"},
		{"unknown hook point", Config{Owner: "x", Hooks: Hooks{CrashAfter: "lunch"}}, CrashAfterEnv},
		{"known hook point", Config{Owner: "x", Hooks: Hooks{HoldAfter: AfterSubmitting}}, ""},
		{"no linger", Config{Owner: "x", GrantLinger: 0}, ""},
		{"longest linger", Config{Owner: "x", GrantLinger: 30 * time.Second}, ""},
		{"linger too long", Config{Owner: "x", GrantLinger: 31 * time.Second}, "--grant-linger"},
		{"negative linger", Config{Owner: "x", GrantLinger: -time.Second}, "--grant-linger"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.defaults()
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("error %v, want one mentioning %q", err, c.want)
			}
			if c.want == "" && (c.cfg.Concurrency < 1 || c.cfg.SessionTTL == 0 || c.cfg.PollInterval == 0 || c.cfg.CallTimeout == 0) {
				t.Fatalf("defaults not applied: %+v", c.cfg)
			}
		})
	}
}

func TestBackoffIsCappedAndResets(t *testing.T) {
	b := backoff{min: 100 * time.Millisecond, max: time.Second}
	for i := 0; i < 20; i++ {
		if d := b.next(); d < 50*time.Millisecond || d > time.Second {
			t.Fatalf("step %d: backoff %s outside [50ms, 1s]", i, d)
		}
	}
	b.reset()
	if d := b.next(); d > 100*time.Millisecond {
		t.Fatalf("after reset: %s, want at most the minimum", d)
	}
}

// testBundle is a running stack with the operator clients these tests
// use: what setup(t) hands a test. Each bundle owns its databases.
type testBundle struct {
	st   *stack.Stack
	pay  *pc.Client
	rail *railclient.Client
	prx  *proxyclient.Client
	lock *lockclient.Client
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	if testing.Short() {
		t.Skip("needs PostgreSQL, etcd and the payouts binary")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st, err := stack.Start(ctx, stack.Options{Dir: t.TempDir(), Binary: proctest.Binary(t),
		Logger: slog.New(slog.DiscardHandler), SettlementWindow: 2 * time.Second, RailTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("start stack: %v", err)
	}
	t.Cleanup(func() { _ = st.Stop() })
	s := &testBundle{st: st}
	op := st.Ready.Tokens.Operator
	if s.pay, err = pc.New(st.Ready.PaymentURL, op); err != nil {
		t.Fatal(err)
	}
	if s.rail, err = railclient.New(st.Ready.RailURL, op); err != nil {
		t.Fatal(err)
	}
	if s.prx, err = proxyclient.New(st.Ready.ProxyURL, op); err != nil {
		t.Fatal(err)
	}
	if s.lock, err = lockclient.New(st.Ready.LockURL, lockclient.WithToken(op)); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *testBundle) config(t *testing.T, owner string, w io.Writer) Config {
	r := s.st.Ready
	return Config{Owner: owner, Concurrency: 2, SessionTTL: 3 * time.Second, PollInterval: 100 * time.Millisecond, GrantLinger: DefaultGrantLinger,
		LockURL: r.LockURL, PaymentURL: r.PaymentURL, ProxyURL: r.ProxyURL, Token: r.Tokens.Executor,
		Logger: obs.NewLogger(w, slog.LevelDebug, Role), Registry: obs.NewRegistry()}
}

// payCalls is how many requests the payment resource has served, by
// "METHOD route", from its /metrics.
func (s *testBundle) payCalls(t *testing.T) map[string]int {
	t.Helper()
	return httpCalls(t, s.st.Ready.PaymentURL)
}

// proxyCalls is payCalls for the rail proxy.
func (s *testBundle) proxyCalls(t *testing.T) map[string]int {
	t.Helper()
	return httpCalls(t, s.st.Ready.ProxyURL)
}

// metricLines is a server's /metrics, a line each.
func metricLines(t *testing.T, baseURL string) []string {
	t.Helper()
	resp, err := http.Get(baseURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(string(b), "\n")
}

func httpCalls(t *testing.T, baseURL string) map[string]int {
	t.Helper()
	out := map[string]int{}
	label := func(line, name string) string {
		_, rest, _ := strings.Cut(line, name+`="`)
		v, _, _ := strings.Cut(rest, `"`)
		return v
	}
	for _, line := range metricLines(t, baseURL) {
		if !strings.HasPrefix(line, "payouts_http_requests_total{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		out[label(line, "method")+" "+label(line, "route")] += int(v)
	}
	return out
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runUntilSettled runs an executor (owner, logging to log) until every
// payout of want is terminal, stops it, and checks each payout ended in the
// state want gives.
func (s *testBundle) runUntilSettled(t *testing.T, owner string, log io.Writer, want map[string]pc.State) {
	t.Helper()
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(rctx, s.config(t, owner, log)) }()
	waitFor(t, time.Minute, "the payouts to settle", func() bool {
		for id := range want {
			if !s.state(t, id).Terminal() {
				return false
			}
		}
		return true
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	for id, st := range want {
		if got := s.state(t, id); got != st {
			t.Errorf("%s is %s, want %s", id, got, st)
		}
	}
}

func (s *testBundle) state(t *testing.T, id string) pc.State {
	t.Helper()
	p, err := s.pay.Payout(context.Background(), id)
	if err != nil {
		t.Fatalf("payout %s: %v", id, err)
	}
	return p.State
}

// fundedPage creates account, funded for all of them, and n PENDING
// payouts of 100 in it (ids account-0 ... account-n-1).
func (s *testBundle) fundedPage(t *testing.T, account string, n int) []string {
	t.Helper()
	ctx := context.Background()
	if _, err := s.pay.CreateAccount(ctx, pc.CreateAccountRequest{ID: account, Currency: "EUR", OpeningBalance: 10_000}); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%d", account, i)
		if _, err := s.pay.CreatePayout(ctx, pc.CreatePayoutRequest{ID: ids[i], AccountID: account, Amount: 100, Currency: "EUR", BeneficiaryRef: "BEN-" + ids[i]}); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// allIn is a waitFor condition: every payout of ids is in state st.
func (s *testBundle) allIn(t *testing.T, ids []string, st pc.State) func() bool {
	return func() bool {
		for _, id := range ids {
			if s.state(t, id) != st {
				return false
			}
		}
		return true
	}
}

// runUntil runs an executor with cfg until cond holds, then stops it.
func runUntil(t *testing.T, cfg Config, what string, cond func() bool) {
	t.Helper()
	_, stop := startExecutor(t, cfg)
	waitFor(t, 2*time.Minute, what, cond)
	stop()
}

// syncBuf is a goroutine-safe log sink.
type syncBuf struct {
	ch chan struct{}
	b  strings.Builder
}

func newSyncBuf() *syncBuf { return &syncBuf{ch: make(chan struct{}, 1)} }

func (s *syncBuf) Write(p []byte) (int, error) {
	s.ch <- struct{}{}
	defer func() { <-s.ch }()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.ch <- struct{}{}
	defer func() { <-s.ch }()
	return s.b.String()
}

// TestExecutorInProcess runs the executor in this process against real
// services: it pays, stops gracefully in the middle of a rail call
// (finishing that call, releasing its lock, closing its session), and the
// operator's cancel goes through the lock like any other writer.
func TestExecutorInProcess(t *testing.T) {
	t.Parallel() // owns its stack and databases
	s := setup(t)
	ctx := context.Background()
	for _, acc := range []string{"ip-a", "ip-b", "ip-c"} {
		if _, err := s.pay.CreateAccount(ctx, pc.CreateAccountRequest{ID: acc, Currency: "EUR", OpeningBalance: 10_000}); err != nil {
			t.Fatal(err)
		}
	}
	mk := func(id, acc string, amount int64, ben string) {
		t.Helper()
		if _, err := s.pay.CreatePayout(ctx, pc.CreatePayoutRequest{ID: id, AccountID: acc, Amount: amount, Currency: "EUR", BeneficiaryRef: ben}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("pays, declines and fails on funds", func(t *testing.T) {
		mk("ip-1", "ip-a", 4000, "BEN-1")
		mk("ip-2", "ip-a", 4000, "DECLINE-2")
		mk("ip-3", "ip-a", 7000, "BEN-3") // 10000 - 4000 posted: too little
		log := newSyncBuf()
		s.runUntilSettled(t, "ip-exec-1", log, map[string]pc.State{"ip-1": pc.Posted, "ip-2": pc.Failed, "ip-3": pc.Failed})
		p, _ := s.pay.Payout(ctx, "ip-3")
		if p.FailureReason != pc.FailureInsufficientFunds {
			t.Errorf("ip-3 failure reason %q, want %s", p.FailureReason, pc.FailureInsufficientFunds)
		}
		if _, err := s.prx.Get(ctx, "ip-3"); !problem.Has(err, problem.NotFound) {
			t.Errorf("ip-3 failed on funds but reached the proxy (%v)", err)
		}
		out := log.String()
		for _, want := range []string{`"msg":"payout transition"`, `"payout_id":"ip-1"`, `"to":"POSTED"`, `"msg":"lock session closed: every lock released"`} {
			if !strings.Contains(out, want) {
				t.Errorf("executor log lacks %s", want)
			}
		}
	})

	t.Run("a batch claims what the funds cover; the rest waits for it to settle", func(t *testing.T) {
		if _, err := s.pay.CreateAccount(ctx, pc.CreateAccountRequest{ID: "ip-d", Currency: "EUR", OpeningBalance: 10_000}); err != nil {
			t.Fatal(err)
		}
		// 10,000: ip-d1 and ip-d2 are covered, ip-d3 is not until the
		// rail declines ip-d2 and gives its 4,000 back; then it is.
		mk("ip-d1", "ip-d", 4000, "BEN-D1")
		mk("ip-d2", "ip-d", 4000, "DECLINE-D2")
		mk("ip-d3", "ip-d", 5000, "BEN-D3")
		s.runUntilSettled(t, "ip-exec-d", io.Discard, map[string]pc.State{"ip-d1": pc.Posted, "ip-d2": pc.Failed, "ip-d3": pc.Posted})
	})

	t.Run("lists an account's payouts a page at a time, not per payout", func(t *testing.T) {
		if _, err := s.pay.CreateAccount(ctx, pc.CreateAccountRequest{ID: "ip-many", Currency: "EUR", OpeningBalance: 10_000}); err != nil {
			t.Fatal(err)
		}
		const n = 10
		for i := range n {
			mk(fmt.Sprintf("ip-many-%02d", i), "ip-many", 10, "BEN-MANY")
		}
		before, proxyBefore := s.payCalls(t), s.proxyCalls(t)
		grants0 := s.grantsOf(t, "ip-many")
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- Run(rctx, s.config(t, "ip-exec-many", io.Discard)) }()
		waitFor(t, time.Minute, "every ip-many payout to be posted", func() bool {
			for i := range n {
				if s.state(t, fmt.Sprintf("ip-many-%02d", i)) != pc.Posted {
					return false
				}
			}
			return true
		})
		stop()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		after, proxyAfter := s.payCalls(t), s.proxyCalls(t)
		// One grant: its in-flight payouts, then one page of PENDING ones
		// (a short page: no more). A second grant may look once more.
		if calls := after[`GET /v1/payouts`] - before[`GET /v1/payouts`]; calls > 4 {
			t.Errorf("%d list calls for %d payouts of one account, want at most 4", calls, n)
		}
		// The claim itself takes only what the funds cover (while_covered):
		// the account is not read first.
		if calls := after[`GET /v1/accounts/{id}`] - before[`GET /v1/accounts/{id}`]; calls != 0 {
			t.Errorf("%d account reads for %d payouts of one account, want 0", calls, n)
		}
		// The payouts are driven together: one compound call per pair of
		// steps (claim then submitting, outcome then post) per grant that
		// found them PENDING, and no call per payout.
		grants := s.grantsOf(t, "ip-many") - grants0
		if steps := after[`POST /v1/accounts/{id}/steps`] - before[`POST /v1/accounts/{id}/steps`]; steps < 2 || steps > 2*grants {
			t.Errorf("%d batched step calls for %d payouts of one account in %d grants, want 2 per grant that had payouts", steps, n, grants)
		}
		// One proxy call per grant's page: the batch submission, never a
		// submission per payout.
		if c := proxyAfter[`POST /v1/accounts/{id}/submissions`] - proxyBefore[`POST /v1/accounts/{id}/submissions`]; c < 1 || c > grants {
			t.Errorf("%d batch submissions for %d payouts of one account in %d grants, want 1 per grant that had payouts", c, n, grants)
		}
		if c := proxyAfter[`POST /v1/submissions`] - proxyBefore[`POST /v1/submissions`]; c != 0 {
			t.Errorf("%d single submissions for payouts that were all PENDING, want 0", c)
		}
		for _, op := range []string{"claim", "submitting", "outcome", "post"} {
			route := `POST /v1/payouts/{id}/` + op
			if c := after[route] - before[route]; c != 0 {
				t.Errorf("%d single %s calls for payouts that were all PENDING, want 0", c, op)
			}
		}
	})

	t.Run("stop mid-step finishes the step and releases", func(t *testing.T) {
		lat := int64(3000)
		if _, err := s.rail.SetFaults(ctx, railclient.FaultsUpdate{LatencyMS: &lat}); err != nil {
			t.Fatal(err)
		}
		mk("ip-4", "ip-b", 100, "BEN-4")
		log := newSyncBuf()
		cfg := s.config(t, "ip-exec-2", log)
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- Run(rctx, cfg) }()
		// The proxy writes its intent row before it calls the rail: once the
		// row is there, the executor is inside the submission.
		waitFor(t, time.Minute, "ip-4's submission to reach the proxy", func() bool {
			_, err := s.prx.Get(ctx, "ip-4")
			return err == nil
		})
		stop() // the rail is still thinking
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("Run did not return after the stop request")
		}
		zero := int64(0)
		if _, err := s.rail.SetFaults(ctx, railclient.FaultsUpdate{LatencyMS: &zero}); err != nil {
			t.Fatal(err)
		}
		// The submission was not cut off: the executor itself read the
		// proxy's answer before it stopped (the proxy finishes a call its
		// caller left, so its record alone would not show that), and the
		// proxy recorded the rail's answer.
		answered := false
		for line := range strings.SplitSeq(log.String(), "\n") {
			if strings.Contains(line, `"msg":"the proxy answered"`) && strings.Contains(line, `"payout_id":"ip-4"`) && strings.Contains(line, `"outcome":"ACKED"`) {
				answered = true
			}
		}
		if !answered {
			t.Fatalf("the stopped executor did not read the proxy's answer for ip-4: its submission was cut off:\n%s", log.String())
		}
		rec, err := s.prx.Get(ctx, "ip-4")
		if err != nil || rec.Outcome != proxyclient.OutcomeAcked {
			t.Fatalf("proxy record after a graceful stop: %+v, %v (want ACKED: the step finished)", rec, err)
		}
		l, err := s.lock.Lock(ctx, fencing.Key("ip-b"))
		if err != nil || l.Held {
			t.Fatalf("payout:ip-b after a graceful stop: %+v, %v; want free", l, err)
		}
		if !strings.Contains(log.String(), "lock session closed") {
			t.Fatalf("no session close in the log:\n%s", log.String())
		}
		// The next executor applies the recorded outcome; nothing is resent.
		rctx, stop = context.WithCancel(ctx)
		go func() { done <- Run(rctx, s.config(t, "ip-exec-3", io.Discard)) }()
		waitFor(t, time.Minute, "ip-4 to be POSTED", func() bool { return s.state(t, "ip-4") == pc.Posted })
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		report, err := s.rail.SettlementReport(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, p := range report {
			if p.ClientRef == pc.ClientRef("ip-4") {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("the rail holds %d payments for ip-4, want 1", n)
		}
	})

	t.Run("operator cancel presents a grant", func(t *testing.T) {
		mk("ip-5", "ip-c", 100, "BEN-5")
		r := s.st.Ready
		op, err := NewOperator(OperatorConfig{Owner: "operator:test", LockURL: r.LockURL, PaymentURL: r.PaymentURL, ProxyURL: r.ProxyURL,
			Token: r.Tokens.Operator, Wait: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := op.Cancel(ctx, "ip-5", "  "); !problem.Has(err, problem.InvalidRequest) {
			t.Fatalf("cancel with a blank reason: %v, want invalid_request", err)
		}
		p, err := op.Cancel(ctx, "ip-5", "duplicate request")
		if err != nil {
			t.Fatal(err)
		}
		if p.State != pc.Abandoned || !p.Token.Valid() {
			t.Fatalf("cancelled payout %+v", p)
		}
		acc, err := s.pay.Account(ctx, "ip-c")
		if err != nil {
			t.Fatal(err)
		}
		if acc.FenceToken != p.Token || acc.FenceHolder == "" {
			t.Fatalf("account fence %d/%q, want the operator's grant %d", acc.FenceToken, acc.FenceHolder, p.Token)
		}
		// The operator's session is closed: the key is free again.
		l, err := s.lock.Lock(ctx, fencing.Key("ip-c"))
		if err != nil || l.Held {
			t.Fatalf("payout:ip-c after cancel: %+v, %v; want free", l, err)
		}
		if _, err := op.Abandon(ctx, "ip-5", "not ambiguous"); !problem.Has(err, problem.InvalidTransition) {
			t.Fatalf("abandon of an ABANDONED payout: %v, want invalid_transition", err)
		}
		if _, err := op.Cancel(ctx, "no-such", "x"); !problem.Has(err, problem.NotFound) {
			t.Fatalf("cancel of a missing payout: %v, want not_found", err)
		}
	})

	// A guard holds a fence above every token the lock service issues now
	// (as after a restore without D-13): each try only mints a token and a
	// fenced_out event, so the executor backs off from the account instead
	// of retrying at its poll interval.
	t.Run("a fenced-out account is backed off", func(t *testing.T) {
		if _, err := s.pay.CreateAccount(ctx, pc.CreateAccountRequest{ID: "ip-f", Currency: "EUR", OpeningBalance: 10_000}); err != nil {
			t.Fatal(err)
		}
		mk("ip-f1", "ip-f", 100, "BEN-f")
		const high = fencing.Token(1 << 50)
		if _, err := s.pay.Claim(ctx, "ip-f1", high, "restored-elsewhere"); err != nil {
			t.Fatal(err)
		}
		log := newSyncBuf()
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- Run(rctx, s.config(t, "ip-exec-f", log)) }()
		key := fencing.Key("ip-f")
		var fenced []pc.SafetyEvent
		waitFor(t, 2*time.Minute, "two fenced-out attempts on ip-f", func() bool {
			fenced = fenced[:0]
			page, err := s.pay.SafetyEvents(ctx, 0, 1000)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range page.Items {
				if e.Key == key && e.Kind == "fenced_out" {
					fenced = append(fenced, e)
				}
			}
			return len(fenced) >= 2
		})
		stop()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		// The first cooldown is at least half a second (1 s with jitter);
		// without it the next try would follow within one poll (100 ms).
		if gap := fenced[1].At.Sub(fenced[0].At); gap < 450*time.Millisecond {
			t.Fatalf("second try %s after the first fenced-out one: no backoff", gap)
		}
		if !strings.Contains(log.String(), `"msg":"account fenced out: leaving it alone for a while"`) {
			t.Error("executor log does not say it backs off the fenced-out account")
		}
		if got := s.state(t, "ip-f1"); got != pc.Claimed {
			t.Fatalf("ip-f1 is %s, want CLAIMED (untouched by the stale executor)", got)
		}
	})

	// A payout the proxy refuses before forwarding anything (here a
	// beneficiary reference longer than the shared limit, planted behind
	// the payment resource's back, which checks the same limit at
	// creation) is ended under the grant: FAILED, rail_refused, its money
	// released. Before, it stayed RAIL_SUBMITTED for ever, holding its
	// money, and the account — re-dispatched at once every round, minting
	// a token each time — never reached its later payouts.
	t.Run("a payout the proxy refuses is ended and its account goes on", func(t *testing.T) {
		if _, err := s.pay.CreateAccount(ctx, pc.CreateAccountRequest{ID: "ip-r", Currency: "EUR", OpeningBalance: 10_000}); err != nil {
			t.Fatal(err)
		}
		mk("ip-r1", "ip-r", 6000, "BEN-r")
		s.plant(t, "UPDATE payout SET beneficiary_ref = repeat('b', 250) WHERE id = 'ip-r1'")
		mk("ip-r2", "ip-r", 6000, "BEN-r2") // fundable only once ip-r1's money is released
		log := newSyncBuf()
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- Run(rctx, s.config(t, "ip-exec-r", log)) }()
		waitFor(t, 2*time.Minute, "ip-r1 and ip-r2 to be terminal", func() bool {
			return s.state(t, "ip-r1").Terminal() && s.state(t, "ip-r2").Terminal()
		})
		stop()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		p1, err := s.pay.Payout(ctx, "ip-r1")
		if err != nil {
			t.Fatal(err)
		}
		if p1.State != pc.Failed || p1.FailureReason != pc.FailureRailRefused || p1.ErrorCode != "invalid_request:beneficiary_ref" {
			t.Fatalf("ip-r1 %s/%s/%s; want FAILED, %s, invalid_request:beneficiary_ref", p1.State, p1.FailureReason, p1.ErrorCode, pc.FailureRailRefused)
		}
		if got := s.state(t, "ip-r2"); got != pc.Posted {
			t.Fatalf("ip-r2 is %s, want POSTED (the refused payout's money released)", got)
		}
		if _, err := s.prx.Get(ctx, "ip-r1"); !problem.Has(err, problem.NotFound) {
			t.Fatalf("the refused payout has a submission at the proxy: %v", err)
		}
		if n := s.grantsOf(t, "ip-r"); n > 3 {
			t.Fatalf("%d grants of payout:ip-r for two payouts", n)
		}
	})
}

// plant runs one statement on paydb with triggers off, the way a broken
// primary or a migration gone wrong would leave a row.
func (s *testBundle) plant(t *testing.T, sql string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.st.Ready.DatabaseURLs.PayDB)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SET LOCAL session_replication_role = replica"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// grantsOf counts the grants the lock service ever made of account's key.
func (s *testBundle) grantsOf(t *testing.T, account string) int {
	t.Helper()
	all, err := s.lock.AllGrants(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range all {
		if g.Key == fencing.Key(account) {
			n++
		}
	}
	return n
}

// TestRefusedTokenIsFatal: a service that refuses the executor's token
// (401/403) will go on refusing it; the executor stops and says which
// service and which role, instead of retrying "lock service unreachable"
// forever.
func TestRefusedTokenIsFatal(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusUnauthorized, http.StatusForbidden} {
		refuser := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", problem.ContentType)
			w.WriteHeader(status)
			fmt.Fprintf(w, `{"type":"about:blank","title":"refused","status":%d,"code":"%s"}`, status,
				map[int]string{http.StatusUnauthorized: "unauthorized", http.StatusForbidden: "forbidden"}[status])
		}))
		cfg := Config{Owner: "refused", SessionTTL: 3 * time.Second, PollInterval: 100 * time.Millisecond, CallTimeout: 5 * time.Second,
			LockURL: refuser.URL, PaymentURL: refuser.URL, ProxyURL: refuser.URL, Token: "wrong",
			Logger: slog.New(slog.DiscardHandler), Registry: obs.NewRegistry()}
		done := make(chan error, 1)
		ctx, cancel := context.WithCancel(context.Background())
		go func() { done <- Run(ctx, cfg) }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), refuser.URL) || !strings.Contains(err.Error(), `role "executor"`) {
				t.Errorf("status %d: Run returned %v; want an error naming %s and the executor role", status, err, refuser.URL)
			}
		case <-time.After(time.Minute):
			cancel()
			<-done
			t.Errorf("status %d: the executor kept retrying a refused token for a minute", status)
		}
		cancel()
		refuser.Close()
	}
}
