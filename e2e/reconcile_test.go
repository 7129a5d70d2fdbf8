package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/dev/proctest"
	"github.com/payouts/payouts/dev/stack"
	"github.com/payouts/payouts/internal/problem"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
)

// reconcileOut is `payouts reconcile --json` as the contract names it.
type reconcileOut struct {
	Findings []struct {
		Invariant string         `json:"invariant"`
		Check     string         `json:"check"`
		Objects   map[string]any `json:"objects"`
		Evidence  string         `json:"evidence"`
	} `json:"findings"`
	Resolved []struct {
		PayoutID   string `json:"payout_id"`
		Resolution string `json:"resolution"`
		State      string `json:"state"`
		Token      int64  `json:"token"`
	} `json:"resolved"`
	HighestFence  int64 `json:"highest_fence"`
	LockHighToken int64 `json:"lock_high_token"`
}

// reconcileOnce runs `payouts reconcile --once` with the reconciler's token
// and, given explicitly, a reconciler-role rail credential for lookups by
// client reference (the settlement report is the operator's: refused).
func (s *system) reconcileOnce(t *testing.T, extra ...string) (reconcileOut, string, int) {
	t.Helper()
	r := s.st.Ready
	args := append([]string{"reconcile", "--once", "--lock-url", r.LockURL, "--payment-url", r.PaymentURL, "--proxy-url", r.ProxyURL,
		"--rail-url", r.RailURL, "--rail-token-file", r.TokenFiles["reconciler"]}, extra...)
	stdout, stderr, code := runCLI(t, []string{"PAYOUTS_TOKEN=" + r.Tokens.Reconciler}, args...)
	var out reconcileOut
	for _, a := range extra {
		if a == "--json" && code != 2 {
			if err := json.Unmarshal([]byte(stdout), &out); err != nil {
				t.Fatalf("reconcile --json output is not JSON: %v\n%s\nstderr:\n%s", err, stdout, stderr)
			}
		}
	}
	return out, stdout + stderr, code
}

func TestReconcileCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("whole-system test")
	}
	s := startSystem(t, stack.Options{SettlementWindow: time.Second, RailTimeout: time.Second})
	s.createAccount(t, "rc-1", 100_000)
	for i := 0; i < 3; i++ {
		s.createPayout(t, fmt.Sprintf("rc-ok-%d", i), "rc-1", 1000, "BEN-rc")
	}
	ex := s.startExecutor(t, "rc-executor", nil)
	for i := 0; i < 3; i++ {
		s.waitPayoutState(t, fmt.Sprintf("rc-ok-%d", i), 2*time.Minute, pc.Posted)
	}

	// Clean: exit 0, JSON with the fences, and a metrics file.
	metricsFile := filepath.Join(t.TempDir(), "reconcile.prom")
	out, log, code := s.reconcileOnce(t, "--json", "--metrics-file", metricsFile)
	if code != 0 || len(out.Findings) != 0 {
		t.Fatalf("clean system: exit %d, findings %+v\n%s", code, out.Findings, log)
	}
	if out.HighestFence <= 0 || out.LockHighToken < out.HighestFence {
		t.Fatalf("highest_fence %d, lock_high_token %d", out.HighestFence, out.LockHighToken)
	}
	b, err := os.ReadFile(metricsFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"payouts_reconcile_up 1", `payouts_reconcile_findings{check="settled_per_client_ref",invariant="INV-02"} 0`,
		"payouts_reconcile_highest_fence " + strconv.FormatInt(out.HighestFence, 10)} {
		if !strings.Contains(string(b), want) {
			t.Fatalf("metrics file lacks %q:\n%s", want, b)
		}
	}
	if _, log, code := s.reconcileOnce(t); code != 0 || !strings.Contains(log, "No findings.") {
		t.Fatalf("table output: exit %d\n%s", code, log)
	}

	// An ambiguous payout is resolved by the reconciler from rail evidence
	// and then posted by the executor.
	if _, err := s.rail.SetFaults(ctxT(t, 30*time.Second), railclient.Faults{TimeoutAfterAccept: 1}.Full()); err != nil {
		t.Fatal(err)
	}
	s.createPayout(t, "rc-amb", "rc-1", 777, "BEN-rc")
	s.waitPayoutState(t, "rc-amb", 2*time.Minute, pc.RailAmbiguous)
	if _, err := s.rail.SetFaults(ctxT(t, 30*time.Second), railclient.Faults{}.Full()); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 90*time.Second, "the reconciler to resolve rc-amb", func() (bool, error) {
		out, log, code := s.reconcileOnce(t, "--json", "--settlement-window", "0s")
		if code == 2 {
			return false, fmt.Errorf("could not run: %s", log)
		}
		for _, r := range out.Resolved {
			if r.PayoutID == "rc-amb" {
				if r.Resolution != "SETTLED" || r.State != "RAIL_ACKED" || r.Token <= 0 {
					t.Fatalf("resolved %+v", r)
				}
				return true, nil
			}
		}
		return false, nil
	})
	s.waitPayoutState(t, "rc-amb", 2*time.Minute, pc.Posted)
	stopExecutor(t, ex)
	if out, log, code := s.reconcileOnce(t, "--json"); code != 0 {
		t.Fatalf("after resolution and posting: exit %d, findings %+v\n%s", code, out.Findings, log)
	}

	// A stale holder is fenced out: with --state-file the event is reported
	// (exit 1) by one run, and the next run is clean again.
	stale := s.payout(t, "rc-ok-0").Token
	s.createPayout(t, "rc-stale", "rc-1", 10, "BEN-rc")
	if _, err := s.pay.Claim(ctxT(t, 30*time.Second), "rc-stale", stale, "stale-holder"); !problem.Has(err, problem.FencedOut) {
		t.Fatalf("stale claim: %v, want fenced_out", err)
	}
	stateFile := filepath.Join(t.TempDir(), "reconcile-state.json")
	out, log, code = s.reconcileOnce(t, "--json", "--state-file", stateFile)
	if code != 1 || len(out.Findings) != 1 || out.Findings[0].Check != "fenced_out" || out.Findings[0].Objects["holder"] != "stale-holder" {
		t.Fatalf("fenced-out event, first run with a state file: exit %d, findings %+v\n%s", code, out.Findings, log)
	}
	if out, log, code := s.reconcileOnce(t, "--json", "--state-file", stateFile); code != 0 || len(out.Findings) != 0 {
		t.Fatalf("second run with the same state file: exit %d, findings %+v\n%s", code, out.Findings, log)
	}
	if _, _, code := s.reconcileOnce(t, "--json"); code != 1 {
		t.Fatalf("without a state file every event is reported: exit %d, want 1", code)
	}

	// Paid twice at the rail, behind the system's back (with the proxy's
	// own rail credential, the one role the rail pays): exit 1, INV-02.
	p := s.payout(t, "rc-ok-0")
	payer, err := railclient.New(s.st.Ready.RailURL, s.st.Ready.Tokens.Proxy)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := payer.Pay(ctxT(t, 30*time.Second), railclient.PaymentRequest{ClientRef: p.ClientRef, Amount: p.Amount, Currency: p.Currency, BeneficiaryRef: p.BeneficiaryRef}); err != nil {
		t.Fatal(err)
	}
	out, log, code = s.reconcileOnce(t, "--json", "--metrics-file", metricsFile)
	if code != 1 {
		t.Fatalf("duplicate payment: exit %d, want 1\n%s", code, log)
	}
	found := false
	for _, f := range out.Findings {
		if f.Invariant == "INV-02" && f.Check == "settled_per_client_ref" && f.Objects["payout_id"] == "rc-ok-0" && f.Evidence != "" {
			found = true
		}
	}
	if !found {
		t.Fatalf("no INV-02 settled_per_client_ref finding for rc-ok-0: %+v", out.Findings)
	}
	if b, _ := os.ReadFile(metricsFile); !strings.Contains(string(b), `payouts_reconcile_findings{check="settled_per_client_ref",invariant="INV-02"} 1`) {
		t.Fatalf("metrics file does not count the finding:\n%s", b)
	}

	// Continuous mode serves the same on /metrics and /healthz.
	port, err := infra.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	r := s.st.Ready
	listen := "127.0.0.1:" + strconv.Itoa(port)
	proc := proctest.Start(t, "reconcile-continuous", []string{"PAYOUTS_TOKEN=" + r.Tokens.Reconciler},
		"reconcile", "--interval", "500ms", "--listen", listen, "--lock-url", r.LockURL, "--payment-url", r.PaymentURL,
		"--proxy-url", r.ProxyURL, "--rail-url", r.RailURL, "--rail-token-file", r.TokenFiles["reconciler"])
	if err := proctest.WaitReady(ctxT(t, time.Minute), "http://"+listen); err != nil {
		t.Fatalf("continuous reconciler not ready: %v\n%s", err, proc.Log())
	}
	waitUntil(t, time.Minute, "the finding on /metrics", func() (bool, error) {
		return metricValue(t, "http://"+listen+"/metrics", `payouts_reconcile_findings{check="settled_per_client_ref",invariant="INV-02"}`) == 1, nil
	})
	resp, err := http.Get("http://" + listen + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %v %v", err, resp)
	}
	resp.Body.Close()

	// A service that does not answer: exit 2, never "clean".
	s.st.StopRole("payment", 20*time.Second)
	if _, log, code := s.reconcileOnce(t, "--json"); code != 2 || !strings.Contains(log, "could not run") {
		t.Fatalf("payment resource down: exit %d, want 2\n%s", code, log)
	}
	if _, _, code := runCLI(t, []string{"PAYOUTS_TOKEN="}, "reconcile", "--once"); code != 2 {
		t.Fatalf("no token: exit %d, want 2", code)
	}
	// No rail credential: exit 2 naming the flag and what it is for.
	_, log, code = runCLI(t, []string{"PAYOUTS_TOKEN=" + r.Tokens.Reconciler, "PAYOUTS_RAIL_TOKEN=", "PAYOUTS_RAIL_TOKEN_FILE="}, "reconcile", "--once",
		"--lock-url", r.LockURL, "--payment-url", r.PaymentURL, "--proxy-url", r.ProxyURL, "--rail-url", r.RailURL)
	if code != 2 || !strings.Contains(log, "--rail-token-file") || !strings.Contains(log, "lookups") {
		t.Fatalf("no rail credential: exit %d, want 2 naming --rail-token-file and what it is for\n%s", code, log)
	}
}
