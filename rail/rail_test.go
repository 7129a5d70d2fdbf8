package rail

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/rail/railclient"
)

const (
	operatorToken   = "operator-token-0123456789"
	executorToken   = "executor-token-0123456789"
	proxyToken      = "proxy-token-0123456789"
	reconcilerToken = "reconciler-token-0123456789"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// bundle is a rail stub on a loopback port with a client per caller role
// and its clock.
type bundle struct {
	op, ex, px, rc *railclient.Client // operator, executor, proxy, reconciler
	clk            *clock
}

// testAuth holds a token per role.
const testAuth = `{"tokens":[{"token":"` + operatorToken + `","role":"operator","name":"op"},
	{"token":"` + executorToken + `","role":"executor","name":"ex"},
	{"token":"` + proxyToken + `","role":"proxy","name":"px"},
	{"token":"` + reconcilerToken + `","role":"reconciler","name":"rc"}]}`

// serveRail runs a rail stub built from cfg on a loopback port (with a
// discarding logger, testAuth and railclient.DefaultFaults unless cfg has
// its own) and returns it,
// its URL, and a stop that ends it and waits, also run at the end.
func serveRail(tb testing.TB, cfg Config) (s *Server, url string, stop func()) {
	tb.Helper()
	cfg.Addr = "127.0.0.1:0"
	if cfg.Faults == (railclient.Faults{}) {
		cfg.Faults = railclient.DefaultFaults()
	}
	if cfg.Logger == nil {
		cfg.Logger = obs.NewLogger(io.Discard, slog.LevelInfo, "rail")
	}
	if cfg.Auth == nil {
		a, err := auth.Parse([]byte(testAuth))
		if err != nil {
			tb.Fatal(err)
		}
		cfg.Auth = a
	}
	s, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	addr, err := s.Listen()
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				tb.Error(err)
			}
		})
	}
	tb.Cleanup(stop)
	return s, "http://" + addr.String(), stop
}

func setup(t *testing.T, window time.Duration) *bundle {
	t.Helper()
	b := &bundle{clk: &clock{t: time.Now()}}
	_, url, _ := serveRail(t, Config{SettlementWindow: window, Now: b.clk.Now})
	var err error
	if b.op, err = railclient.New(url, operatorToken); err != nil {
		t.Fatal(err)
	}
	if b.ex, err = railclient.New(url, executorToken); err != nil {
		t.Fatal(err)
	}
	if b.px, err = railclient.New(url, proxyToken); err != nil {
		t.Fatal(err)
	}
	if b.rc, err = railclient.New(url, reconcilerToken); err != nil {
		t.Fatal(err)
	}
	return b
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func req(ref string) railclient.PaymentRequest {
	return railclient.PaymentRequest{ClientRef: ref, Amount: 500, Currency: "EUR", BeneficiaryRef: "ben-1"}
}

// An empty decline prefix given at start declines no one, as the same
// value does when set by PUT /v1/faults (`serve rail
// --decline-beneficiary-prefix ""`); it used to mean the default.
func TestAnEmptyDeclinePrefixDeclinesNoOne(t *testing.T) {
	t.Parallel()
	_, url, _ := serveRail(t, Config{SettlementWindow: time.Minute, Faults: railclient.Faults{LatencyMS: 1}})
	op, err := railclient.New(url, operatorToken)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t)
	if f, err := op.Faults(ctx); err != nil || f.DeclineBeneficiaryPrefix != "" {
		t.Fatalf("faults at start %+v %v, want no decline prefix", f, err)
	}
	d := req("ref-1")
	d.BeneficiaryRef = railclient.DefaultDeclinePrefix + "-x"
	px, err := railclient.New(url, proxyToken)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := px.Pay(ctx, d); err != nil || p.Status != railclient.StatusSettled {
		t.Fatalf("%s paid with no decline prefix: %+v %v, want settled", d.BeneficiaryRef, p, err)
	}
}

// The rail is not idempotent: the same request twice is two payments.
func TestDuplicatesAreRealAndReported(t *testing.T) {
	t.Parallel()
	b := setup(t, time.Minute)
	op, ex := b.op, b.px
	ctx := ctxFor(t)
	a, err := ex.Pay(ctx, req("ref-1"))
	if err != nil {
		t.Fatal(err)
	}
	a2, err := ex.Pay(ctx, req("ref-1"))
	if err != nil {
		t.Fatal(err)
	}
	if a.RailRef == a2.RailRef || a.Status != railclient.StatusSettled {
		t.Fatalf("two payments expected: %+v %+v", a, a2)
	}
	d := req("ref-2")
	d.BeneficiaryRef = "DECLINE-x"
	if p, err := ex.Pay(ctx, d); err != nil || p.Status != railclient.StatusDeclined || p.DeclineCode == "" {
		t.Fatalf("declined beneficiary: %+v %v", p, err)
	}
	rep, err := op.SettlementReport(ctx)
	if err != nil || len(rep) != 3 {
		t.Fatalf("report %+v %v", rep, err)
	}
	if _, err := ex.SettlementReport(ctx); !problem.Has(err, problem.Forbidden) {
		t.Fatalf("executor reading the report: %v, want forbidden", err)
	}
	if _, err := ex.SetFaults(ctx, railclient.Faults{}.Full()); !problem.Has(err, problem.Forbidden) {
		t.Fatalf("executor setting faults: %v, want forbidden", err)
	}
}

func TestFindIsFinalOnlyAfterTheWindow(t *testing.T) {
	t.Parallel()
	b := setup(t, 10*time.Minute)
	op, ex, clk := b.op, b.px, b.clk
	ctx := ctxFor(t)
	if _, err := ex.Pay(ctx, req("ref-w")); err != nil {
		t.Fatal(err)
	}
	l, err := ex.Find(ctx, "ref-w")
	if err != nil || l.Final || len(l.Items) != 1 {
		t.Fatalf("inside the window: %+v %v", l, err)
	}
	if l, _ := ex.Find(ctx, "ref-unknown"); l.Final || len(l.Items) != 0 {
		t.Fatalf("unknown ref right after start: %+v", l)
	}
	clk.Advance(11 * time.Minute)
	if l, err := ex.Find(ctx, "ref-w"); err != nil || !l.Final || len(l.Items) != 1 {
		t.Fatalf("after the window: %+v %v", l, err)
	}
	// An attempt that never became a payment restarts the window too.
	if _, err := op.SetFaults(ctx, railclient.FaultsUpdate{ErrorBeforeAccept: ptr(1.0)}); err != nil {
		t.Fatal(err)
	}
	if _, err := ex.Pay(ctx, req("ref-w")); !problem.Has(err, problem.Unavailable) {
		t.Fatalf("error before accept: %v", err)
	}
	if l, _ := ex.Find(ctx, "ref-w"); l.Final || len(l.Items) != 1 {
		t.Fatalf("after a new attempt: %+v", l)
	}
}

func ptr[T any](v T) *T { return &v }

// Timeout after accept: the payment is made and the answer held until the
// caller gives up — the stub does not hang.
func TestTimeoutAfterAcceptHoldsUntilTheCallerLeaves(t *testing.T) {
	t.Parallel()
	b := setup(t, time.Minute)
	op, ex := b.op, b.px
	ctx := ctxFor(t)
	f, err := op.SetFaults(ctx, railclient.FaultsUpdate{TimeoutAfterAccept: ptr(1.0)})
	if err != nil || f.TimeoutAfterAccept != 1 || f.DeclineBeneficiaryPrefix != railclient.DefaultDeclinePrefix {
		t.Fatalf("faults %+v %v (absent members must keep their value)", f, err)
	}
	// The caller gives up only once the rail has made the payment (seen in
	// its report), however long a loaded machine takes to get there.
	short, cancel := context.WithCancel(ctx)
	defer cancel()
	paid := make(chan error, 1)
	go func() {
		_, err := ex.Pay(short, req("ref-t"))
		paid <- err
	}()
	for deadline := time.Now().Add(50 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		rep, err := op.SettlementReport(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep) > 0 {
			break
		}
		select {
		case err := <-paid:
			t.Fatalf("pay answered before the payment was made: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the payment never reached the rail")
		}
	}
	select {
	case err := <-paid:
		t.Fatalf("pay answered while the caller was still waiting: %v, want the answer held", err)
	default:
	}
	cancel()
	if err := <-paid; !errors.Is(err, httpx.ErrTransport) {
		t.Fatalf("pay: %v, want no answer", err)
	}
	rep, err := op.SettlementReport(ctx)
	if err != nil || len(rep) != 1 || rep[0].ClientRef != "ref-t" {
		t.Fatalf("report %+v %v: the payment was made", rep, err)
	}
	// Drop before accept: no answer and no payment.
	if _, err := op.SetFaults(ctx, railclient.Faults{DropBeforeAccept: 1, DeclineBeneficiaryPrefix: "DECLINE"}.Full()); err != nil {
		t.Fatal(err)
	}
	if _, err := ex.Pay(ctx, req("ref-d")); !errors.Is(err, httpx.ErrTransport) {
		t.Fatalf("drop: %v, want no answer", err)
	}
	if rep, _ := op.SettlementReport(ctx); len(rep) != 1 {
		t.Fatalf("drop made a payment: %+v", rep)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, time.Minute)
	op, ex := b.op, b.px
	ctx := ctxFor(t)
	for _, c := range []struct {
		u     railclient.FaultsUpdate
		field string
	}{
		{railclient.FaultsUpdate{TimeoutAfterAccept: ptr(1.5)}, "timeout_after_accept"},
		{railclient.FaultsUpdate{DropBeforeAccept: ptr(-0.1)}, "drop_before_accept"},
		{railclient.FaultsUpdate{LatencyMS: ptr(int64(-1))}, "latency_ms"},
		{railclient.FaultsUpdate{LatencyMS: ptr(int64(10_000_000))}, "latency_ms"},
		{railclient.FaultsUpdate{DeclineBeneficiaryPrefix: ptr(strings.Repeat("D", 300))}, "decline_beneficiary_prefix"},
		// A prefix is held to what a beneficiary_ref may hold: one it
		// could never match, or that reads as another, was stored.
		{railclient.FaultsUpdate{DeclineBeneficiaryPrefix: ptr("a\x00")}, "decline_beneficiary_prefix"},
		{railclient.FaultsUpdate{DeclineBeneficiaryPrefix: ptr("x\u202ey")}, "decline_beneficiary_prefix"},
		{railclient.FaultsUpdate{DeclineBeneficiaryPrefix: ptr("  ")}, "decline_beneficiary_prefix"},
	} {
		_, err := op.SetFaults(ctx, c.u)
		var field string
		if !problem.Has(err, problem.InvalidRequest) || !problem.From(err).Extension("field", &field) || field != c.field {
			t.Errorf("faults %+v: %v (field %q), want invalid_request naming %s", c.u, err, field, c.field)
		}
	}
	for _, r := range []railclient.PaymentRequest{
		{Amount: 1, Currency: "EUR", BeneficiaryRef: "b"},
		{ClientRef: "r", Amount: 0, Currency: "EUR", BeneficiaryRef: "b"},
		{ClientRef: "r", Amount: 1, Currency: "euro", BeneficiaryRef: "b"},
		{ClientRef: "r", Amount: 1, Currency: "EUR"},
	} {
		if _, err := ex.Pay(ctx, r); !problem.Has(err, problem.InvalidRequest) {
			t.Errorf("pay %+v: %v, want invalid_request", r, err)
		}
	}
	if _, err := ex.Find(ctx, ""); !problem.Has(err, problem.InvalidRequest) {
		t.Errorf("find without client_ref: %v", err)
	}
	if rep, _ := op.SettlementReport(ctx); len(rep) != 0 {
		t.Fatalf("bad input made payments: %+v", rep)
	}
	resp, err := http.Post(op.BaseURL()+"/v1/payments", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no bearer token: %d", resp.StatusCode)
	}
}

// Only the rail proxy pays (issue: an executor's or reconciler's token paid
// around both guards); lookups are the proxy's and the reconciler's; faults
// and the settlement report the operator's.
func TestOnlyTheProxyPays(t *testing.T) {
	t.Parallel()
	b := setup(t, time.Minute)
	ctx := ctxFor(t)
	for name, c := range map[string]*railclient.Client{"executor": b.ex, "reconciler": b.rc, "operator": b.op} {
		if _, err := c.Pay(ctx, req("ref-"+name)); !problem.Has(err, problem.Forbidden) {
			t.Errorf("%s paying at the rail: %v, want forbidden", name, err)
		}
	}
	if rep, _ := b.op.SettlementReport(ctx); len(rep) != 0 {
		t.Fatalf("a refused caller made a payment: %+v", rep)
	}
	if _, err := b.px.Pay(ctx, req("ref-proxy")); err != nil {
		t.Fatalf("the proxy paying: %v", err)
	}
	for name, c := range map[string]*railclient.Client{"proxy": b.px, "reconciler": b.rc} {
		if l, err := c.Find(ctx, "ref-proxy"); err != nil || len(l.Items) != 1 {
			t.Errorf("%s looking up: %+v %v", name, l, err)
		}
	}
	for name, c := range map[string]*railclient.Client{"executor": b.ex, "operator": b.op} {
		if _, err := c.Find(ctx, "ref-proxy"); !problem.Has(err, problem.Forbidden) {
			t.Errorf("%s looking up: %v, want forbidden", name, err)
		}
	}
	for name, c := range map[string]*railclient.Client{"proxy": b.px, "reconciler": b.rc, "executor": b.ex} {
		if _, err := c.SettlementReport(ctx); !problem.Has(err, problem.Forbidden) {
			t.Errorf("%s reading the settlement report: %v, want forbidden", name, err)
		}
		if _, err := c.Faults(ctx); !problem.Has(err, problem.Forbidden) {
			t.Errorf("%s reading the faults: %v, want forbidden", name, err)
		}
	}
	// A reference the rail could never have been sent is refused, not looked up.
	if _, err := b.px.Find(ctx, "ref\x00x"); !problem.Has(err, problem.InvalidRequest) {
		t.Errorf("find with a NUL in client_ref: %v, want invalid_request", err)
	}
}

// A lookup is not final while an attempt with its reference is still being
// processed (here: waiting out the injected latency), however long ago the
// attempt arrived: the payment it makes appears afterwards.
func TestFindIsNotFinalWhileAnAttemptIsInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, 10*time.Minute)
	op, ex, clk := b.op, b.px, b.clk
	ctx := ctxFor(t)
	clk.Advance(11 * time.Minute) // a reference never seen is final by now
	if l, err := ex.Find(ctx, "ref-slow"); err != nil || !l.Final {
		t.Fatalf("unknown reference past the window: %+v %v", l, err)
	}
	if _, err := op.SetFaults(ctx, railclient.FaultsUpdate{LatencyMS: ptr(int64(5000))}); err != nil {
		t.Fatal(err)
	}
	paid := make(chan error, 1)
	go func() {
		_, err := ex.Pay(ctx, req("ref-slow"))
		paid <- err
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		l, err := ex.Find(ctx, "ref-slow")
		if err != nil {
			t.Fatal(err)
		}
		if !l.Final {
			break // the attempt has arrived
		}
		if time.Now().After(deadline) {
			t.Fatal("the payment attempt never reached the rail")
		}
		time.Sleep(5 * time.Millisecond)
	}
	clk.Advance(11 * time.Minute) // the window has passed since it arrived
	if l, err := ex.Find(ctx, "ref-slow"); err != nil || l.Final || len(l.Items) != 0 {
		t.Fatalf("lookup while the attempt is in flight: %+v %v, want not final", l, err)
	}
	if err := <-paid; err != nil {
		t.Fatal(err)
	}
	if l, err := ex.Find(ctx, "ref-slow"); err != nil || l.Final || len(l.Items) != 1 {
		t.Fatalf("lookup right after the attempt: %+v %v, want its payment, not final", l, err)
	}
	clk.Advance(11 * time.Minute)
	if l, err := ex.Find(ctx, "ref-slow"); err != nil || !l.Final || len(l.Items) != 1 {
		t.Fatalf("lookup a window after the attempt ended: %+v %v, want final", l, err)
	}
}

// A lookup is not final while a payment request is still arriving (its
// body being read, so its reference not yet known): the payment it makes
// appears afterwards. Before, the attempt counted only once its body was
// read, and a lookup in between answered final with no payment, for a
// reference whose payment then settled.
func TestFindIsNotFinalWhileAPaymentIsArriving(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Now()}
	_, url, _ := serveRail(t, Config{SettlementWindow: 10 * time.Minute, Now: clk.Now})
	ex, err := railclient.New(url, proxyToken)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t)
	clk.Advance(11 * time.Minute) // a reference never seen is final by now
	if l, err := ex.Find(ctx, "ref-arriving"); err != nil || !l.Final {
		t.Fatalf("unknown reference past the window: %+v %v", l, err)
	}
	body, feed := io.Pipe()
	post, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/payments", body)
	if err != nil {
		t.Fatal(err)
	}
	post.Header.Set("Authorization", "Bearer "+proxyToken)
	post.Header.Set("Content-Type", "application/json")
	answered := make(chan *http.Response, 1)
	go func() {
		resp, err := http.DefaultClient.Do(post)
		if err != nil {
			t.Error(err)
			close(answered)
			return
		}
		answered <- resp
	}()
	if _, err := io.WriteString(feed, `{"client_ref":"ref-arriving",`); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err := ex.Find(ctx, "ref-arriving")
		if err != nil {
			t.Fatal(err)
		}
		if !l.Final {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("lookups stayed final for 30 s while a payment request was arriving")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := io.WriteString(feed, `"amount":500,"currency":"EUR","beneficiary_ref":"ben-1"}`); err != nil {
		t.Fatal(err)
	}
	feed.Close()
	resp, ok := <-answered
	if !ok {
		t.Fatal("the payment request failed")
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("payment: %d", resp.StatusCode)
	}
	if l, err := ex.Find(ctx, "ref-arriving"); err != nil || l.Final || len(l.Items) != 1 {
		t.Fatalf("lookup right after the payment: %+v %v, want its payment, not final", l, err)
	}
}
