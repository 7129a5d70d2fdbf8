package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/stack"
	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

type statusJSON struct {
	OK       bool     `json:"ok"`
	Problems []string `json:"problems"`
	Roles    []struct {
		Role    string `json:"role"`
		Healthy bool   `json:"healthy"`
		Ready   bool   `json:"ready"`
		Version *struct {
			Version, Revision, Go string
		} `json:"version"`
		Sessions       *float64         `json:"sessions"`
		HeldLocks      *int             `json:"held_locks"`
		HighToken      *int64           `json:"high_token"`
		PayoutsByState map[string]int64 `json:"payouts_by_state"`
		Ambiguous      *int64           `json:"ambiguous"`
		FencedOut      *float64         `json:"fenced_out"`
		HighFence      *int64           `json:"high_fence"`
		RailPaused     *float64         `json:"rail_paused"`
	} `json:"roles"`
}

// TestStatus runs `payouts status` against a dev stack: every role healthy
// with its version and key numbers (exit 0); a guard whose fence is above
// the lock service's high token (as after a restore without D-13) and a
// role that is down each make it exit 1 and say why.
func TestStatus(t *testing.T) {
	if testing.Short() {
		t.Skip("whole-system test")
	}
	s := startSystem(t, stack.Options{})
	r := s.st.Ready
	tokenFile := filepath.Join(t.TempDir(), "operator.token")
	if err := os.WriteFile(tokenFile, []byte(r.Tokens.Operator), 0o600); err != nil {
		t.Fatal(err)
	}
	status := func(wantCode int) statusJSON {
		t.Helper()
		out, errOut, code := runCLI(t, nil, "status", "--lock-url", r.LockURL, "--payment-url", r.PaymentURL,
			"--proxy-url", r.ProxyURL, "--rail-url", r.RailURL, "--token-file", tokenFile, "-o", "json")
		var st statusJSON
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status -o json printed %q (%v); stderr %s", out, err, errOut)
		}
		if code != wantCode || st.OK != (wantCode == 0) {
			t.Fatalf("status: exit %d ok=%t, want exit %d\n%s\n%s", code, st.OK, wantCode, out, errOut)
		}
		return st
	}
	s.createAccount(t, "st-a", 10_000)
	s.createPayout(t, "st-1", "st-a", 100, "ben-1")
	s.createPayout(t, "st-2", "st-a", 100, "ben-2")

	st := status(0)
	byRole := map[string]int{}
	for i, role := range st.Roles {
		byRole[role.Role] = i
		if !role.Healthy || !role.Ready || role.Version == nil || role.Version.Go == "" {
			t.Errorf("%s: healthy %t ready %t version %v", role.Role, role.Healthy, role.Ready, role.Version)
		}
	}
	if len(st.Roles) != 4 {
		t.Fatalf("status reported %d roles, want 4: %+v", len(st.Roles), st.Roles)
	}
	lk, pay, px := st.Roles[byRole["lock"]], st.Roles[byRole["payment"]], st.Roles[byRole["proxy"]]
	if lk.Sessions == nil || lk.HeldLocks == nil || lk.HighToken == nil {
		t.Errorf("lock key numbers missing: %+v", lk)
	}
	if pay.PayoutsByState[string(pc.Pending)] != 2 || pay.Ambiguous == nil || *pay.Ambiguous != 0 || pay.FencedOut == nil || pay.HighFence == nil {
		t.Errorf("payment key numbers: %+v", pay)
	}
	if px.FencedOut == nil || px.HighFence == nil || px.RailPaused == nil || *px.RailPaused != 0 {
		t.Errorf("proxy key numbers missing: %+v", px)
	}

	// A refused token is fatal (DESIGN §4b): exit 2, naming the role that
	// refused it, for an unknown token (401) and another role's (403).
	for name, tok := range map[string]string{"unknown": "not-a-token-anyone-issued", "proxy role": r.Tokens.Proxy} {
		_, errOut, code := runCLI(t, nil, "status", "--lock-url", r.LockURL, "--payment-url", r.PaymentURL,
			"--proxy-url", r.ProxyURL, "--rail-url", r.RailURL, "--token", tok)
		if code != 2 || !strings.Contains(errOut, "refused the token") {
			t.Errorf("status with a %s token: exit %d, want 2 saying the token was refused\n%s", name, code, errOut)
		}
	}

	// A fence above every token the lock service has issued: what a guard
	// holds after lockdb is restored from an old backup without D-13.
	exec, err := pc.New(r.PaymentURL, r.Tokens.Executor)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.Claim(ctxT(t, 30*time.Second), "st-1", fencing.Token(1_000_000), "restored-holder"); err != nil {
		t.Fatalf("claim with a high token: %v", err)
	}
	st = status(1)
	if !strings.Contains(strings.Join(st.Problems, "\n"), "payment's high fence 1000000 exceeds the lock service's high token") {
		t.Fatalf("status problems %v do not name the fence above the high token", st.Problems)
	}

	s.st.StopRole("rail", 10*time.Second)
	st = status(1)
	if !strings.Contains(strings.Join(st.Problems, "\n"), "rail is down") {
		t.Fatalf("status problems %v do not say the rail is down", st.Problems)
	}
}
