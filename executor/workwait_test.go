package executor

import (
	"context"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

// workWaits reads payouts_payment_work_waits_total from the payment
// resource's /metrics: how often a GET /work call has waited for work.
func (s *testBundle) workWaits(t *testing.T) float64 {
	t.Helper()
	for _, line := range metricLines(t, s.st.Ready.PaymentURL) {
		if v, ok := strings.CutPrefix(line, "payouts_payment_work_waits_total "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatal("the payment resource exports no payouts_payment_work_waits_total")
	return 0
}

// An idle executor has a GET /work waiting for work: a payout created then
// is paid at once, not at the next poll (here ten minutes away), and a stop
// request ends the wait.
func TestIdleExecutorTakesANewPayoutAtOnce(t *testing.T) {
	t.Parallel() // owns its stack and databases
	s := setup(t)
	ctx := context.Background()
	if _, err := s.pay.CreateAccount(ctx, pc.CreateAccountRequest{ID: "ww-1", Currency: "EUR", OpeningBalance: 10_000}); err != nil {
		t.Fatal(err)
	}
	cfg := s.config(t, "ww-exec", io.Discard)
	cfg.PollInterval, cfg.CallTimeout, cfg.GrantLinger = 10*time.Minute, time.Minute, 0
	if w := (&Executor{cfg: cfg}).workWait(); w != pc.MaxWorkWait {
		t.Fatalf("an idle executor polling every 10 minutes waits %s for work per ask, want %s", w, pc.MaxWorkWait)
	}
	_, stop := startExecutor(t, cfg)
	waitFor(t, time.Minute, "the executor to wait for work", func() bool { return s.workWaits(t) >= 1 })
	if _, err := s.pay.CreatePayout(ctx, pc.CreatePayoutRequest{ID: "ww-po-1", AccountID: "ww-1", Amount: 100, Currency: "EUR", BeneficiaryRef: "BEN-ww-po-1"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the new payout to be posted", func() bool { return s.state(t, "ww-po-1") == pc.Posted })
	// Idle again: the next ask waits, and the stop ends it.
	n := s.workWaits(t)
	waitFor(t, time.Minute, "the executor to wait for work again", func() bool { return s.workWaits(t) > n })
	start := time.Now()
	stop()
	if took := time.Since(start); took >= pc.MaxWorkWait-2*time.Second {
		t.Fatalf("stopping an executor waiting for work took %s: the wait (%s) was not ended", took, pc.MaxWorkWait)
	}
}
