package executor

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

// A batch submission whose answer is lost after the proxy forwarded it is
// never sent again: its payouts go to the recovery path, which asks the
// proxy what happened (D-4), and each is paid exactly once. A resend would
// be refused by the proxy's own check (INV-02) and leave duplicate_attempt
// evidence: there must be none.
func TestLostBatchSubmissionAnswerIsNotResent(t *testing.T) {
	t.Parallel() // owns its stack and databases
	s := setup(t)
	ctx := context.Background()
	if _, err := s.pay.CreateAccount(ctx, pc.CreateAccountRequest{ID: "lost-a", Currency: "EUR", OpeningBalance: 10_000}); err != nil {
		t.Fatal(err)
	}
	const n = 5
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("lost-%d", i)
		if _, err := s.pay.CreatePayout(ctx, pc.CreatePayoutRequest{ID: ids[i], AccountID: "lost-a", Amount: 100, Currency: "EUR", BeneficiaryRef: "BEN-LOST"}); err != nil {
			t.Fatal(err)
		}
	}

	// In front of the proxy: the first batch submission reaches it and is
	// answered, but the answer never reaches the executor.
	target, err := url.Parse(s.st.Ready.ProxyURL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	var dropped atomic.Int32
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/submissions") && strings.Contains(r.URL.Path, "/accounts/") && dropped.Add(1) == 1 {
			rec := httptest.NewRecorder()
			rp.ServeHTTP(rec, r)
			if rec.Code != http.StatusOK {
				t.Errorf("the dropped batch submission was answered %d: %s", rec.Code, rec.Body.String())
			}
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Errorf("hijack: %v", err)
				return
			}
			conn.Close()
			return
		}
		rp.ServeHTTP(w, r)
	}))
	defer front.Close()

	cfg := s.config(t, "lost-exec", io.Discard)
	cfg.ProxyURL = front.URL
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(rctx, cfg) }()
	waitFor(t, 2*time.Minute, "every payout of the lost batch to be posted", func() bool {
		for _, id := range ids {
			if s.state(t, id) != pc.Posted {
				return false
			}
		}
		return true
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if dropped.Load() == 0 {
		t.Fatal("no batch submission was made: the test exercised nothing")
	}
	events, err := s.prx.SafetyEvents(ctx, "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range events.Items {
		t.Errorf("safety event at the proxy: %s for payout %s: %s (the lost batch was sent again)", ev.Kind, ev.PayoutID, ev.Detail)
	}
	report, err := s.rail.SettlementReport(ctx)
	if err != nil {
		t.Fatal(err)
	}
	paid := map[string]int{}
	for _, pm := range report {
		paid[pm.ClientRef]++
	}
	for _, id := range ids {
		p, err := s.pay.Payout(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if paid[p.ClientRef] != 1 {
			t.Errorf("payout %s (client ref %s) reached the rail %d times, want exactly once", id, p.ClientRef, paid[p.ClientRef])
		}
	}
}
