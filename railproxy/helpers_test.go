package railproxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/migrations"
	"github.com/payouts/payouts/rail"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// Bearer tokens of the test authenticator, one per role.
const (
	executorBearer   = "executor-token-0123456789"
	reconcilerBearer = "reconciler-token-0123456789"
	operatorBearer   = "operator-token-0123456789"
	proxyBearer      = "proxy-token-0123456789"
)

// testAuth knows one token per role; the rail and the proxy both use it
// (each server checks only the roles its routes allow).
func testAuth() *auth.Authenticator {
	a, err := auth.Parse([]byte(`{"tokens":[
		{"token":"` + executorBearer + `","role":"executor","name":"exec-1"},
		{"token":"` + reconcilerBearer + `","role":"reconciler","name":"recon-1"},
		{"token":"` + operatorBearer + `","role":"operator","name":"alice"},
		{"token":"` + proxyBearer + `","role":"proxy","name":"proxy-1"}]}`))
	if err != nil {
		panic(err)
	}
	return a
}

// helperEnv marks a re-executed test binary that runs a proxy with a crash
// point armed (see runCrashHelper).
const helperEnv = "RAILPROXY_CRASH_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(runCrashHelper())
	}
	code := pgtest.Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left behind:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// syncBuffer collects log output from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// fakeClock is the rail's clock, moved by tests to pass settlement windows.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type bundle struct {
	dbURL   string
	clock   *fakeClock
	railURL string
	rail    *railclient.Client
	proxy   *Server
	pc      *proxyclient.Client // executor: submits and reads
	recon   *proxyclient.Client // reconciler: looks up
	url     string
	logs    *syncBuffer
	now     func() time.Time // the proxy's clock (nil: the real one)
	// sendWindow is the proxy's SendWindow (0: its default).
	sendWindow time.Duration
	// outcomeAttempt bounds each attempt to record a rail answer (0: its default).
	outcomeAttempt time.Duration
	// beforeRailCall runs just before each rail call (nil: nothing).
	beforeRailCall func()
}

type options struct {
	railTimeout time.Duration
	window      time.Duration
	railURL     string // use this rail instead of starting a stub
	dbURL       string // reuse a database (restart)
	// now is the proxy's clock for the rail pause (default: the real one).
	now func() time.Time
	// sendWindow is the proxy's SendWindow (default: its own).
	sendWindow time.Duration
	// outcomeAttempt bounds each attempt to record a rail answer (default:
	// the proxy's own, dbTimeout).
	outcomeAttempt time.Duration
	// beforeRailCall runs just before each rail call: a stall there.
	beforeRailCall func()
}

func ctxFor(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// serve runs fn's server until the test ends.
func serve(t *testing.T, start func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
}

func startRail(t *testing.T, clock *fakeClock, window time.Duration) string {
	t.Helper()
	rs, err := rail.New(rail.Config{
		Addr: "127.0.0.1:0", Logger: obs.NewLogger(io.Discard, slog.LevelInfo, "rail"), Auth: testAuth(),
		SettlementWindow: window, Now: clock.Now, Faults: railclient.DefaultFaults(),
	})
	if err != nil {
		t.Fatal(err)
	}
	addr, err := rs.Listen()
	if err != nil {
		t.Fatal(err)
	}
	serve(t, rs.Serve)
	return "http://" + addr.String()
}

func setup(t *testing.T, o options) *bundle {
	t.Helper()
	b := &bundle{clock: &fakeClock{t: time.Now()}, logs: &syncBuffer{}}
	if o.railTimeout == 0 {
		o.railTimeout = 20 * time.Second
	}
	if o.window == 0 {
		o.window = time.Minute
	}
	b.dbURL = o.dbURL
	if b.dbURL == "" {
		b.dbURL = pgtest.NewDB(t, migrations.ProxyDB)
	}
	b.railURL = o.railURL
	if b.railURL == "" {
		b.railURL = startRail(t, b.clock, o.window)
	}
	var err error
	if b.rail, err = railclient.New(b.railURL, operatorBearer); err != nil {
		t.Fatal(err)
	}
	b.now, b.sendWindow, b.outcomeAttempt, b.beforeRailCall = o.now, o.sendWindow, o.outcomeAttempt, o.beforeRailCall
	b.startProxy(t, o.railTimeout, "")
	return b
}

func (b *bundle) startProxy(t *testing.T, railTimeout time.Duration, crashPoint string) {
	t.Helper()
	s, err := New(ctxFor(t), Config{
		Addr: "127.0.0.1:0", Logger: obs.NewLogger(b.logs, slog.LevelDebug, "proxy"), Auth: testAuth(),
		DatabaseURL: b.dbURL, RailURL: b.railURL, RailToken: proxyBearer, RailTimeout: railTimeout, SendWindow: b.sendWindow,
		crashPoint: crashPoint, now: b.now, outcomeAttemptTimeout: b.outcomeAttempt, beforeRailCall: b.beforeRailCall,
	})
	if err != nil {
		t.Fatal(err)
	}
	addr, err := s.Listen()
	if err != nil {
		t.Fatal(err)
	}
	serve(t, func(ctx context.Context) error {
		defer s.Close()
		return s.Serve(ctx)
	})
	b.proxy, b.url = s, "http://"+addr.String()
	if b.pc, err = proxyclient.New(b.url, executorBearer); err != nil {
		t.Fatal(err)
	}
	if b.recon, err = proxyclient.New(b.url, reconcilerBearer); err != nil {
		t.Fatal(err)
	}
}

func sub(payoutID, accountID string) proxyclient.Submission {
	return proxyclient.Submission{
		PayoutID: payoutID, AccountID: accountID, ClientRef: "po-" + payoutID,
		Amount: 1250, Currency: "EUR", BeneficiaryRef: "ben-" + payoutID,
	}
}

func holder(n int) fencing.Holder { return fencing.Holder(fmt.Sprintf("session-%d", n)) }

// atRail returns the rail's payments for clientRef (from the settlement report).
func (b *bundle) atRail(t *testing.T, clientRef string) []railclient.Payment {
	t.Helper()
	all, err := b.rail.SettlementReport(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	var out []railclient.Payment
	for _, p := range all {
		if p.ClientRef == clientRef {
			out = append(out, p)
		}
	}
	return out
}

func (b *bundle) setFaults(t *testing.T, f railclient.Faults) {
	t.Helper()
	if f.DeclineBeneficiaryPrefix == "" {
		f.DeclineBeneficiaryPrefix = railclient.DefaultDeclinePrefix
	}
	if _, err := b.rail.SetFaults(ctxFor(t), f.Full()); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) safetyEvents(t *testing.T) []proxyclient.SafetyEvent {
	t.Helper()
	p, err := b.pc.SafetyEvents(ctxFor(t), "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	return p.Items
}

func (b *bundle) highWater(t *testing.T, account string) (proxyclient.HighWater, bool) {
	t.Helper()
	p, err := b.pc.HighWater(ctxFor(t), "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range p.Items {
		if h.AccountID == account {
			return h, true
		}
	}
	return proxyclient.HighWater{}, false
}

// eventually polls cond until it holds (generous timeout; no fixed sleeps
// as synchronisation).
func eventually(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runCrashHelper runs in a re-executed test binary: a proxy with a crash
// point armed, printing its address on stdout, serving until killed (or
// until the crash point makes it exit with status 3).
func runCrashHelper() int {
	ctx := context.Background()
	s, err := New(ctx, Config{
		Addr: "127.0.0.1:0", Logger: obs.NewLogger(os.Stderr, slog.LevelInfo, "proxy"), Auth: testAuth(),
		// The rail timeout of the proxy the tests restart on its database
		// (lookup_test.go): every proxy over one proxydb runs the same one.
		DatabaseURL: os.Getenv("RAILPROXY_DB"), RailURL: os.Getenv("RAILPROXY_RAIL"), RailToken: proxyBearer, RailTimeout: time.Second,
		crashPoint: os.Getenv(helperEnv),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	addr, err := s.Listen()
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	fmt.Println(addr.String())
	if err := s.Serve(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	return 0
}

// startCrashingProxy re-executes the test binary as a proxy process with
// crashPoint armed and returns a client of it and a wait for its exit code.
func startCrashingProxy(t *testing.T, b *bundle, crashPoint string) (*proxyclient.Client, func() int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+crashPoint, "RAILPROXY_DB="+b.dbURL, "RAILPROXY_RAIL="+b.railURL)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan int, 1)
	go func() {
		err := cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
			waited <- 0
		case errors.As(err, &ee):
			waited <- ee.ExitCode()
		default:
			waited <- -1
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("crash helper did not start: %v\n%s", err, stderr.String())
	}
	c, err := proxyclient.New("http://"+strings.TrimSpace(line), executorBearer)
	if err != nil {
		t.Fatal(err)
	}
	return c, func() int {
		select {
		case code := <-waited:
			return code
		case <-time.After(90 * time.Second):
			t.Fatalf("crash helper did not exit\n%s", stderr.String())
			return -1
		}
	}
}

// postRaw sends body to the proxy as is and returns the status and body.
func postRaw(t *testing.T, url, body string) (int, string) {
	t.Helper()
	status, _, raw := postRawHeader(t, url, body)
	return status, raw
}

// postRawHeader is postRaw, with the answer's header.
func postRawHeader(t *testing.T, url, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxFor(t), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+executorBearer)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(raw)
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// heldRail is a rail stub (its clock, settlement window) behind a front
// that holds the first request of method to /v1/payments until free is
// called (or the test ends); entered is closed when that request arrives.
func heldRail(t *testing.T, clock *fakeClock, method string) (railURL string, entered <-chan struct{}, free func()) {
	t.Helper()
	target, err := url.Parse(startRail(t, clock, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	in, release := make(chan struct{}), make(chan struct{})
	var held atomic.Bool
	var once sync.Once
	free = func() { once.Do(func() { close(release) }) }
	rp := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == method && r.URL.Path == "/v1/payments" && held.CompareAndSwap(false, true) {
			close(in)
			<-release
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	t.Cleanup(free) // before front.Close, which waits for the held request
	return front.URL, in, free
}
