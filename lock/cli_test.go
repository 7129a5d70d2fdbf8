package lock_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/lock/lockclient"
)

// runCLI runs the payouts binary and returns stdout, failing on a non-zero
// exit unless wantCode says otherwise.
func runCLI(t *testing.T, wantCode int, args ...string) string {
	t.Helper()
	cmd := exec.Command(payoutsBinary(t), args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if code != wantCode {
		t.Fatalf("payouts %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, wantCode, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// TestCLI drives `payouts lock list|show|revoke|grants|bump-tokens` against a
// running service (PostgreSQL backend, for bump-tokens).
func TestCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the payouts binary")
	}
	sys := setup(t, "postgres")
	st, svc := sys.store, sys.svc
	ctx := testCtx(t)
	s, err := lockclient.Open(ctx, svc.URL, "cli-holder", lockclient.WithToken(executorToken), lockclient.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	g, err := s.TryAcquire(ctx, "payout:cli-1")
	if err != nil {
		t.Fatal(err)
	}
	common := []string{"--lock-url", svc.URL, "--token", operatorToken}

	var list lockclient.LockList
	out := runCLI(t, 0, append([]string{"lock", "list", "--prefix", "payout:", "--output", "json"}, common...)...)
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Items) != 1 || list.Items[0].Token != g.Token {
		t.Fatalf("lock list: %s (%v)", out, err)
	}
	out = runCLI(t, 0, append([]string{"lock", "show", "payout:cli-1"}, common...)...)
	if !strings.Contains(out, "payout:cli-1") || !strings.Contains(out, "cli-holder") || !strings.Contains(out, g.Token.String()) {
		t.Fatalf("lock show (table): %s", out)
	}
	// Revoke: refused without a reason, or with a non-operator token.
	runCLI(t, 2, append([]string{"lock", "revoke", "payout:cli-1"}, common...)...)
	runCLI(t, 2, "lock", "revoke", "payout:cli-1", "--reason", "x", "--lock-url", svc.URL, "--token", executorToken) // a refused credential exits 2
	var rec lockclient.GrantRecord
	out = runCLI(t, 0, append([]string{"lock", "revoke", "payout:cli-1", "--reason", "wedged worker", "--output", "json"}, common...)...)
	if err := json.Unmarshal([]byte(out), &rec); err != nil || rec.Token != g.Token || *rec.EndReason != "revoked" || rec.Actor != "alice" {
		t.Fatalf("lock revoke: %s (%v)", out, err)
	}
	var page lockclient.GrantPage
	out = runCLI(t, 0, append([]string{"lock", "grants", "--output", "json"}, common...)...)
	if err := json.Unmarshal([]byte(out), &page); err != nil || len(page.Items) != 1 || page.Items[0].Reason != "wedged worker" {
		t.Fatalf("lock grants: %s (%v)", out, err)
	}
	runCLI(t, 2, append([]string{"lock", "list", "--output", "yaml"}, common...)...)

	// bump-tokens (D-13): up works, down is refused, and the next grant is above N.
	runCLI(t, 2, "lock", "bump-tokens", "--to", "0", "--database-url", st.url) // not a token: usage error
	out = runCLI(t, 0, "lock", "bump-tokens", "--to", "5000", "--database-url", st.url, "--output", "json")
	if !strings.Contains(out, `"to": 5000`) {
		t.Fatalf("bump-tokens: %s", out)
	}
	runCLI(t, 1, "lock", "bump-tokens", "--to", "10", "--database-url", st.url)
	g2, err := s.TryAcquire(ctx, "payout:cli-2")
	if err != nil {
		t.Fatal(err)
	}
	if g2.Token <= 5000 {
		t.Fatalf("token after bump-tokens --to 5000: %d", g2.Token)
	}
}

// guardStub answers GET /v1/fences/high as a guard does, for a bearer
// token; anything else is 401.
func guardStub(t *testing.T, token string, high int64) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/v1/fences/high" || r.Header.Get("Authorization") != "Bearer "+token {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"code":"unauthorized","title":"Unauthorized","status":401}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"token":%d}`, high)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestBumpTokensFromGuards: bump-tokens --from-guards reads both guards'
// highest fence and moves the sequence above the larger plus the margin;
// it changes nothing unless both guards answer.
func TestBumpTokensFromGuards(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the payouts binary")
	}
	sys := setup(t, "postgres")
	pay := guardStub(t, "guard-token", 7000)
	proxy := guardStub(t, "guard-token", 9000)
	bump := func(token string, extra ...string) []string {
		return append([]string{"lock", "bump-tokens", "--database-url", sys.store.url, "--payment-url", pay,
			"--proxy-url", proxy, "--token", token}, extra...)
	}
	runCLI(t, 2, bump("guard-token", "--from-guards", "--to", "5")...) // both: usage error
	runCLI(t, 2, bump("wrong-token", "--from-guards")...)              // the guards refuse the token (exit 2): no bump
	out := runCLI(t, 0, bump("guard-token", "--from-guards", "--margin", "500", "--output", "json")...)
	var res struct {
		From   int64 `json:"from"`
		To     int64 `json:"to"`
		Guards []struct {
			Guard string `json:"guard"`
			Token int64  `json:"token"`
		} `json:"guards"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.To != 9500 || len(res.Guards) != 2 ||
		res.Guards[0].Token != 7000 || res.Guards[1].Token != 9000 {
		t.Fatalf("bump-tokens --from-guards: %s (%v); want to 9500 from fences 7000 and 9000", out, err)
	}
	ctx := testCtx(t)
	s, err := lockclient.Open(ctx, sys.svc.URL, "after-bump", lockclient.WithToken(executorToken), lockclient.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	g, err := s.TryAcquire(ctx, "payout:bumped")
	if err != nil {
		t.Fatal(err)
	}
	if g.Token <= 9500 {
		t.Fatalf("first token after bump-tokens --from-guards: %d, want above 9500", g.Token)
	}
	// Tokens already above the guards' fences plus the margin: nothing to
	// do, and it says so (the sequence stays where it is).
	runCLI(t, 0, "lock", "bump-tokens", "--to", "20000", "--database-url", sys.store.url)
	out = runCLI(t, 0, bump("guard-token", "--from-guards", "--margin", "500", "--output", "json")...)
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.From != 20000 || res.To != 20000 {
		t.Fatalf("bump-tokens --from-guards below tokens already issued: %s (%v); want a no-op from and to 20000", out, err)
	}
	g2, err := s.TryAcquire(ctx, "payout:bumped-again")
	if err != nil {
		t.Fatal(err)
	}
	if g2.Token <= 20000 {
		t.Fatalf("token after the no-op bump: %d, want above 20000", g2.Token)
	}
}
