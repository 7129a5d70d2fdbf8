package executor

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// stepsCall is one POST /v1/accounts/{id}/steps the executor made.
type stepsCall struct {
	account  string
	token    fencing.Token
	op, then pc.StepOp
	items    int
}

// stepsRecorder stands in front of the payment resource and records every
// steps request it passes on.
type stepsRecorder struct {
	mu    sync.Mutex
	calls []stepsCall
}

func (s *stepsRecorder) front(t *testing.T, paymentURL string) string {
	t.Helper()
	target, err := url.Parse(paymentURL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if account, ok := strings.CutPrefix(r.URL.Path, "/v1/accounts/"); ok && r.Method == http.MethodPost && strings.HasSuffix(account, "/steps") {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				t.Errorf("read a steps request: %v", err)
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			var req pc.StepsRequest
			if err := json.Unmarshal(body, &req); err != nil {
				t.Errorf("decode a steps request: %v", err)
			}
			s.mu.Lock()
			s.calls = append(s.calls, stepsCall{strings.TrimSuffix(account, "/steps"), req.Token, req.Op, req.Then, len(req.Items)})
			s.mu.Unlock()
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// of returns the steps requests made for account, in order.
func (s *stepsRecorder) of(account string) []stepsCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []stepsCall
	for _, c := range s.calls {
		if c.account == account {
			out = append(out, c)
		}
	}
	return out
}

// TestPageIsDrivenWithTwoStepCalls: a page of PENDING payouts takes two
// payment-resource calls, claim then submitting and outcome then post, each
// one compound request (not four, one per step); and a test hook armed
// between the two steps of a pair splits that pair, so that it fires where
// it says, with the page in the state between.
func TestPageIsDrivenWithTwoStepCalls(t *testing.T) {
	t.Parallel() // owns its stack and databases
	s := setup(t)
	rec := &stepsRecorder{}
	front := rec.front(t, s.st.Ready.PaymentURL)
	const n = 6
	// run runs an executor with hooks until cond, then stops it.
	run := func(name string, hooks Hooks, log io.Writer, what string, cond func() bool) {
		t.Helper()
		cfg := s.config(t, name, log)
		cfg.PaymentURL, cfg.Hooks = front, hooks
		runUntil(t, cfg, what, cond)
	}
	ops := func(calls []stepsCall) string {
		var out []string
		for _, c := range calls {
			out = append(out, strings.TrimSuffix(string(c.op)+"+"+string(c.then), "+"))
		}
		return strings.Join(out, ",")
	}

	ids := s.fundedPage(t, "cp-a", n)
	run("cp-exec", Hooks{}, io.Discard, "the page to be posted", s.allIn(t, ids, pc.Posted))
	calls := rec.of("cp-a")
	if got := ops(calls); got != "claim+submitting,outcome+post" {
		t.Fatalf("steps calls for one page: %s; want claim+submitting,outcome+post", got)
	}
	for _, c := range calls {
		if c.items != n || c.token != calls[0].token {
			t.Fatalf("steps call %+v: want all %d payouts under one grant's token %d", c, n, calls[0].token)
		}
	}

	for _, c := range []struct {
		point Point
		at    pc.State
		calls string
	}{
		{AfterClaimed, pc.Claimed, "claim"},
		{AfterOutcome, pc.RailAcked, "claim+submitting,outcome"},
	} {
		account := "cp-" + string(c.point)
		ids := s.fundedPage(t, account, n)
		log := newSyncBuf()
		held := func() bool {
			for _, line := range strings.Split(log.String(), "\n") {
				if containsAll(line, `"msg":"test hook: holding"`, `"point":"`+string(c.point)+`"`, `"account_id":"`+account+`"`) {
					return s.allIn(t, ids, c.at)()
				}
			}
			return false
		}
		run("cp-hold-"+string(c.point), Hooks{HoldAfter: c.point}, log, "the hold after "+string(c.point), held)
		if got := ops(rec.of(account)); got != c.calls {
			t.Fatalf("hold after %s: steps calls %s, want %s", c.point, got, c.calls)
		}
		// Another executor finishes the page.
		run("cp-finish-"+string(c.point), Hooks{}, io.Discard, account+"'s page to be posted", s.allIn(t, ids, pc.Posted))
	}
}
