package reconcile_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/payouts/payouts/reconcile"
)

// railRecorder stands in front of the stack's rail and records the path
// and bearer of every request it forwards.
type railRecorder struct {
	mu   sync.Mutex
	seen []string // "PATH BEARER"
}

func (rr *railRecorder) requests() []string {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	return append([]string(nil), rr.seen...)
}

func (e *testBundle) recordingRail(t *testing.T) (*httptest.Server, *railRecorder) {
	t.Helper()
	target, err := url.Parse(e.st.Ready.RailURL)
	if err != nil {
		t.Fatal(err)
	}
	rr := &railRecorder{}
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rr.mu.Lock()
		rr.seen = append(rr.seen, r.URL.Path+" "+strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
		rr.mu.Unlock()
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, rr
}

// onceConfig is a single pass of the stack's reconciler with the
// reconciler's token, railURL as the rail and no rail credential.
func (e *testBundle) onceConfig(t *testing.T, railURL, owner string) reconcile.Config {
	r := e.st.Ready
	return reconcile.Config{LockURL: r.LockURL, PaymentURL: r.PaymentURL, ProxyURL: r.ProxyURL, RailURL: railURL,
		Token: r.Tokens.Reconciler, Once: true, Logger: testLogger(t), Options: reconcile.Options{Owner: owner}}
}

// TestNoRailCredentialExitsTwo: the reconciler uses the rail only with an
// explicitly given rail credential. Without one it exits 2 naming
// --rail-token-file, and the rail sees no request carrying the
// reconciler's own token.
func TestNoRailCredentialExitsTwo(t *testing.T) {
	e := setup(t)
	r := e.st.Ready
	rail, rec := e.recordingRail(t)
	ctx := ctxT(t)
	cfg := e.onceConfig(t, rail.URL, "no-rail-credential")
	code, err := reconcile.Run(ctx, cfg)
	if code != reconcile.ExitCannotRun || err == nil || !strings.Contains(err.Error(), "--rail-token-file") {
		t.Fatalf("exit %d, %v; want exit 2 naming --rail-token-file", code, err)
	}
	for _, req := range rec.requests() {
		if strings.HasSuffix(req, " "+r.Tokens.Reconciler) {
			t.Fatalf("the rail saw the reconciler's own token: %s", req)
		}
	}

	// Given explicitly, the report credential reads the settlement report
	// and the rail credential is the bearer of every other call.
	var out bytes.Buffer
	cfg.RailToken, cfg.RailReportToken, cfg.Out, cfg.JSON = r.Tokens.Reconciler, r.Tokens.Operator, &out, true
	if code, err := reconcile.Run(ctx, cfg); code == reconcile.ExitCannotRun || err != nil {
		t.Fatalf("with rail credentials: exit %d, %v", code, err)
	}
	var report bool
	for _, req := range rec.requests() {
		path, bearer, _ := strings.Cut(req, " ")
		if path == "/v1/settlement-report" {
			report = true
			if bearer != r.Tokens.Operator {
				t.Fatalf("settlement report asked for with %q, want the report credential", bearer)
			}
		} else if bearer != r.Tokens.Reconciler {
			t.Fatalf("%s asked with %q, want the rail credential", path, bearer)
		}
	}
	if !report || strings.Contains(out.String(), "were looked up per payout") {
		t.Fatalf("the settlement report was not read with the report credential (asked: %v): %s", report, out.String())
	}
}

// TestRefusedReportCredentialExitsTwo: a --rail-report-token-file the rail
// refuses its settlement report (here a lookup-only token) is a refused
// token: exit 2 naming the flag, not a note under a clean exit 0.
func TestRefusedReportCredentialExitsTwo(t *testing.T) {
	e := setup(t)
	r := e.st.Ready
	ctx := ctxT(t)
	cfg := e.onceConfig(t, r.RailURL, "refused-report-credential")
	cfg.RailToken, cfg.RailReportToken = r.Tokens.Reconciler, r.Tokens.Reconciler
	code, err := reconcile.Run(ctx, cfg)
	if code != reconcile.ExitCannotRun || err == nil || !strings.Contains(err.Error(), "--rail-report-token-file") {
		t.Fatalf("exit %d, %v; want exit 2 naming --rail-report-token-file", code, err)
	}
}

// TestAnotherRolesTokenExitsTwoBeforeAPass: an executor's token may read
// everything a pass reads, but not resolve or look up an ambiguous
// payout. The reconciler asks the guards which role they know its token
// as and stops at once: exit 2 naming the payment resource and the role,
// no pass run (nothing reported); a reconciler's token passes the same
// question.
func TestAnotherRolesTokenExitsTwoBeforeAPass(t *testing.T) {
	e := setup(t)
	r := e.st.Ready
	ctx := ctxT(t)
	var out bytes.Buffer
	cfg := e.onceConfig(t, r.RailURL, "executor-token")
	cfg.Token, cfg.RailToken, cfg.JSON, cfg.Out = r.Tokens.Executor, r.Tokens.Reconciler, true, &out
	code, err := reconcile.Run(ctx, cfg)
	if code != reconcile.ExitCannotRun || err == nil || !strings.Contains(err.Error(), "payment resource") ||
		!strings.Contains(err.Error(), "refused the token") || !strings.Contains(err.Error(), "role executor") {
		t.Fatalf("exit %d, %v; want exit 2 saying the payment resource refuses a token of role executor", code, err)
	}
	if out.Len() != 0 {
		t.Fatalf("a pass ran with another role's token: %s", out.String())
	}
	cfg.Token, cfg.Out = r.Tokens.Reconciler, &out
	if code, err := reconcile.Run(ctx, cfg); code == reconcile.ExitCannotRun || err != nil {
		t.Fatalf("with a reconciler's token: exit %d, %v", code, err)
	}
}

// TestARailCredentialThatCannotReadTheReportDoesNotAskForIt: without
// --rail-report-token-file the reconciler asks the rail which role its rail
// credential has, and a lookup-only one (the rail's reconciler role) is
// not sent for the settlement report: the pass checks per payout and says
// so, and the rail answers no 403 each pass (a refusal an operator is
// alerted to, PayoutsCredentialRefused).
func TestARailCredentialThatCannotReadTheReportDoesNotAskForIt(t *testing.T) {
	e := setup(t)
	r := e.st.Ready
	rail, rec := e.recordingRail(t)
	ctx := ctxT(t)
	var out bytes.Buffer
	cfg := e.onceConfig(t, rail.URL, "lookup-only")
	cfg.RailToken, cfg.JSON, cfg.Out = r.Tokens.Reconciler, true, &out
	if code, err := reconcile.Run(ctx, cfg); code == reconcile.ExitCannotRun || err != nil {
		t.Fatalf("exit %d, %v", code, err)
	}
	asked := func(path string) bool {
		for _, req := range rec.requests() {
			if p, _, _ := strings.Cut(req, " "); p == path {
				return true
			}
		}
		return false
	}
	if asked("/v1/settlement-report") || !asked("/v1/whoami") {
		t.Fatalf("a lookup-only rail credential: requests %v; want whoami and no settlement report", rec.requests())
	}
	if !strings.Contains(out.String(), "were looked up per payout") {
		t.Fatalf("the pass does not say the report was not read: %s", out.String())
	}
}
