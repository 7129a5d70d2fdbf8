package reconcile_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/payouts/payouts/dev/proctest"
	"github.com/payouts/payouts/dev/stack"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
	"github.com/payouts/payouts/reconcile"
)

// Every test here runs against the real system: PostgreSQL, embedded
// etcd, and the lock, payment, proxy and rail servers as child processes
// (dev/stack). Violations are planted behind the services' backs,
// directly in their databases or at the rail, the way a broken primary
// would leave them.

var (
	stacksMu sync.Mutex
	stacks   []*testBundle
	shared   *testBundle
	seq      atomic.Int64
)

func TestMain(m *testing.M) {
	proctest.Main(m, func() {
		stacksMu.Lock()
		defer stacksMu.Unlock()
		for _, b := range stacks {
			if b.lock != nil {
				_ = b.lock.Close(context.Background())
			}
			_ = b.st.Stop()
		}
	}, leakOptions...)
}

// leakOptions name the background goroutines that outlive a test by
// design: idle keep-alive connections of the HTTP clients' shared
// transport, closed by the runtime when the process exits.
var leakOptions = []goleak.Option{
	goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
	goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
}

// testBundle is one running stack with operator clients: what setup(t)
// hands a test.
type testBundle struct {
	st    *stack.Stack
	pay   *pc.Client
	proxy *proxyclient.Client
	rail  *railclient.Client
	// railPay pays at the rail as the proxy does.
	railPay *railclient.Client
	lock    *lockclient.Session
}

// startStack brings up a fresh stack (stopped in TestMain).
func startStack(t *testing.T, settlement time.Duration) *testBundle {
	t.Helper()
	bin := proctest.Binary(t)
	dir, err := os.MkdirTemp("", "reconcile-stack-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	st, err := stack.Start(ctx, stack.Options{Dir: dir, Binary: bin, SettlementWindow: settlement, RailTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatalf("devstack: %v", err)
	}
	r := st.Ready
	e := &testBundle{st: st}
	stacksMu.Lock()
	stacks = append(stacks, e)
	stacksMu.Unlock()
	if e.pay, err = pc.New(r.PaymentURL, r.Tokens.Operator); err != nil {
		t.Fatal(err)
	}
	// Submissions are the executor role's; payments at the rail the
	// proxy's: planting them takes those roles' tokens.
	if e.proxy, err = proxyclient.New(r.ProxyURL, r.Tokens.Executor); err != nil {
		t.Fatal(err)
	}
	if e.railPay, err = railclient.New(r.RailURL, r.Tokens.Proxy); err != nil {
		t.Fatal(err)
	}
	if e.rail, err = railclient.New(r.RailURL, r.Tokens.Operator); err != nil {
		t.Fatal(err)
	}
	if e.lock, err = lockclient.Open(ctx, r.LockURL, "reconcile-test-driver", lockclient.WithToken(r.Tokens.Operator), lockclient.WithTTL(30*time.Second)); err != nil {
		t.Fatalf("lock session: %v", err)
	}
	return e
}

// setup returns the stack most tests plant into (rail settlement window
// 1s, so ambiguity can be resolved). Each test uses its own accounts and
// payouts and looks only for its own findings.
func setup(t *testing.T) *testBundle {
	t.Helper()
	stacksMu.Lock()
	e := shared
	stacksMu.Unlock()
	if e != nil {
		return e
	}
	e = startStack(t, time.Second)
	stacksMu.Lock()
	shared = e
	stacksMu.Unlock()
	return e
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func uniq(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e9, seq.Add(1))
}

// newAccount creates an account with an opening balance.
func (e *testBundle) newAccount(t *testing.T, balance int64) string {
	t.Helper()
	id := uniq("acc")
	if _, err := e.pay.CreateAccount(ctxT(t), pc.CreateAccountRequest{ID: id, Currency: "EUR", OpeningBalance: balance}); err != nil {
		t.Fatalf("create account: %v", err)
	}
	return id
}

// newPayout creates a PENDING payout.
func (e *testBundle) newPayout(t *testing.T, account string, amount int64) pc.Payout {
	t.Helper()
	p, err := e.pay.CreatePayout(ctxT(t), pc.CreatePayoutRequest{ID: uniq("po"), AccountID: account, Amount: amount, Currency: "EUR", BeneficiaryRef: "BEN-" + account})
	if err != nil {
		t.Fatalf("create payout: %v", err)
	}
	return p
}

// grant acquires the account's lock (waiting) for the test driver.
func (e *testBundle) grant(t *testing.T, account string) *lockclient.Grant {
	t.Helper()
	g, err := e.lock.Acquire(ctxT(t), fencing.Key(account), 30*time.Second)
	if err != nil {
		t.Fatalf("acquire %s: %v", fencing.Key(account), err)
	}
	return g
}

func (e *testBundle) release(t *testing.T, g *lockclient.Grant) {
	t.Helper()
	if err := e.lock.Release(ctxT(t), g); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// submit drives a payout through claim, submitting and the proxy under g,
// and reports the proxy's outcome to paydb.
func (e *testBundle) submit(t *testing.T, p pc.Payout, g *lockclient.Grant) (pc.Payout, proxyclient.Record) {
	t.Helper()
	ctx := ctxT(t)
	if _, err := e.pay.Claim(ctx, p.ID, g.Token, g.Holder()); err != nil {
		t.Fatalf("claim %s: %v", p.ID, err)
	}
	if _, err := e.pay.Submitting(ctx, p.ID, g.Token, g.Holder()); err != nil {
		t.Fatalf("submitting %s: %v", p.ID, err)
	}
	rec, err := e.proxy.Submit(ctx, proxyclient.Submission{PayoutID: p.ID, AccountID: p.AccountID, ClientRef: p.ClientRef,
		Amount: p.Amount, Currency: p.Currency, BeneficiaryRef: p.BeneficiaryRef}, g.Token, g.Holder())
	if err != nil {
		t.Fatalf("proxy submit %s: %v", p.ID, err)
	}
	var out pc.Outcome
	switch rec.Outcome {
	case proxyclient.OutcomeAcked:
		out = pc.OutcomeAcked
	case proxyclient.OutcomeRejected:
		out = pc.OutcomeRejected
	default:
		out = pc.OutcomeTimeout
	}
	got, err := e.pay.ReportOutcome(ctx, p.ID, g.Token, g.Holder(), out, rec.RailRef, rec.ErrorCode)
	if err != nil {
		t.Fatalf("outcome %s: %v", p.ID, err)
	}
	return got, rec
}

// payOut takes a payout all the way to POSTED, correctly.
func (e *testBundle) payOut(t *testing.T, p pc.Payout) pc.Payout {
	t.Helper()
	g := e.grant(t, p.AccountID)
	defer e.release(t, g)
	got, rec := e.submit(t, p, g)
	if rec.Outcome != proxyclient.OutcomeAcked {
		t.Fatalf("payout %s: proxy outcome %q, want ACKED", p.ID, rec.Outcome)
	}
	got, err := e.pay.Post(ctxT(t), p.ID, g.Token, g.Holder())
	if err != nil {
		t.Fatalf("post %s: %v", p.ID, err)
	}
	if got.State != pc.Posted {
		t.Fatalf("payout %s is %s after post", p.ID, got.State)
	}
	return got
}

// setFaults changes the rail's faults, restoring none at test end.
func (e *testBundle) setFaults(t *testing.T, f railclient.Faults) {
	t.Helper()
	if _, err := e.rail.SetFaults(ctxT(t), f.Full()); err != nil {
		t.Fatalf("set rail faults: %v", err)
	}
	t.Cleanup(func() {
		if _, err := e.rail.SetFaults(context.Background(), railclient.Faults{}.Full()); err != nil {
			t.Errorf("reset rail faults: %v", err)
		}
	})
}

// ambiguous takes a payout to RAIL_AMBIGUOUS through the real path: the
// rail takes (or drops) the payment and never answers, the proxy records
// TIMEOUT, the holder reports it.
func (e *testBundle) ambiguous(t *testing.T, p pc.Payout, f railclient.Faults) pc.Payout {
	t.Helper()
	e.setFaults(t, f)
	g := e.grant(t, p.AccountID)
	defer e.release(t, g)
	got, rec := e.submit(t, p, g)
	if got.State != pc.RailAmbiguous {
		t.Fatalf("payout %s is %s (proxy outcome %q), want RAIL_AMBIGUOUS", p.ID, got.State, rec.Outcome)
	}
	if _, err := e.rail.SetFaults(ctxT(t), railclient.Faults{}.Full()); err != nil {
		t.Fatal(err)
	}
	return got
}

// exec runs SQL on one of the stack's databases. replica disables the
// triggers that would refuse a planted row (session_replication_role).
func (e *testBundle) exec(t *testing.T, db string, replica bool, sql string, args ...any) {
	t.Helper()
	urls := e.st.Ready.DatabaseURLs
	url := map[string]string{"paydb": urls.PayDB, "proxydb": urls.ProxyDB, "lockdb": urls.LockDB}[db]
	ctx := ctxT(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", db, err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if replica {
		if _, err := tx.Exec(ctx, "SET LOCAL session_replication_role = replica"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("plant in %s: %v\n%s", db, err, sql)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("plant in %s: commit: %v", db, err)
	}
}

// reconciler returns a Reconciler as `payouts reconcile` builds it, with
// the reconciler role's token, and a reconciler-role rail credential for
// lookups (the stack issues one reconciler token, so the same string); the
// rail's settlement report gets railToken ("" for the rail credential).
func (e *testBundle) reconciler(t *testing.T, opts reconcile.Options, railToken string) *reconcile.Reconciler {
	t.Helper()
	return e.reconcilerWith(t, opts, railToken, nil)
}

// reconcilerWith is reconciler with the lock service wrapped by wrap (nil:
// as is).
func (e *testBundle) reconcilerWith(t *testing.T, opts reconcile.Options, railToken string, wrap func(reconcile.LockService) reconcile.LockService) *reconcile.Reconciler {
	t.Helper()
	return e.reconcilerAt(t, opts, railToken, wrap, e.st.Ready.PaymentURL)
}

// reconcilerAt is reconcilerWith reaching the payment resource at paymentURL.
func (e *testBundle) reconcilerAt(t *testing.T, opts reconcile.Options, railToken string, wrap func(reconcile.LockService) reconcile.LockService, paymentURL string) *reconcile.Reconciler {
	t.Helper()
	r := e.st.Ready
	tok := r.Tokens.Reconciler
	pay, err := pc.New(paymentURL, tok)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := proxyclient.New(r.ProxyURL, tok)
	if err != nil {
		t.Fatal(err)
	}
	rail, err := railclient.New(r.RailURL, tok)
	if err != nil {
		t.Fatal(err)
	}
	var report *railclient.Client // nil: the rail credential's, as without --rail-report-token-file
	if railToken != "" {
		if report, err = railclient.New(r.RailURL, railToken); err != nil {
			t.Fatal(err)
		}
	}
	lock, err := reconcile.NewLockService(r.LockURL, tok, "reconcile-test", 15*time.Second, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lock.Close(context.Background()) })
	if wrap != nil {
		lock = wrap(lock)
	}
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	rec, err := reconcile.New(reconcile.Clients{Lock: lock, Payment: pay, Proxy: proxy, Rail: rail, RailReport: report}, opts)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// testLogger logs warnings and errors into the test's log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// pass runs one pass that must complete.
func pass(t *testing.T, r *reconcile.Reconciler) *reconcile.Report {
	t.Helper()
	rep, err := r.Pass(ctxT(t))
	if err != nil {
		t.Fatalf("pass: %v", err)
	}
	return rep
}

// find returns the findings of check whose objects have every given
// member (compared as printed).
func find(rep *reconcile.Report, check string, want map[string]any) []reconcile.Finding {
	var out []reconcile.Finding
	for _, f := range rep.Findings {
		if f.Check != check {
			continue
		}
		ok := true
		for k, v := range want {
			if fmt.Sprint(f.Objects[k]) != fmt.Sprint(v) {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, f)
		}
	}
	return out
}

// mustFind fails unless rep has a finding of check about want, with the
// check's invariant; it also insists the report is not clean.
func mustFind(t *testing.T, rep *reconcile.Report, invariant, check string, want map[string]any) reconcile.Finding {
	t.Helper()
	got := find(rep, check, want)
	if len(got) == 0 {
		b, _ := json.MarshalIndent(rep.Findings, "", "  ")
		t.Fatalf("no %s finding about %v; findings:\n%s", check, want, b)
	}
	if got[0].Invariant != invariant {
		t.Fatalf("%s finding names %s, want %s", check, got[0].Invariant, invariant)
	}
	if got[0].Evidence == "" {
		t.Fatalf("%s finding has no evidence", check)
	}
	if rep.Clean() {
		t.Fatal("report with findings says clean")
	}
	return got[0]
}

func mustNotFind(t *testing.T, rep *reconcile.Report, check string, want map[string]any) {
	t.Helper()
	if got := find(rep, check, want); len(got) > 0 {
		t.Fatalf("unexpected %s finding about %v: %+v", check, want, got)
	}
}
