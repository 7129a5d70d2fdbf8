package payment

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/faultproxy"
	"github.com/payouts/payouts/dev/logtest"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// TestAPaydbOutageIsLoggedOnce: while paydb cannot be reached, a create
// that fails announces no new work (it created none; the announcement
// failed too and logged a WARN line per create), and the listener for
// other processes' announcements, retried every second, says it failed in
// one WARN line when the outage starts and in one INFO line once it
// listens again.
func TestAPaydbOutageIsLoggedOnce(t *testing.T) {
	t.Parallel()
	capture, log := logtest.New()
	var link *faultproxy.Link
	e := setup(t, func(c *Config) {
		u, err := url.Parse(c.DatabaseURL)
		if err != nil {
			t.Fatal(err)
		}
		if link, err = faultproxy.Listen("paydb", u.Host); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { link.Close() })
		u.Host = link.Addr()
		c.DatabaseURL, c.Logger = u.String(), log
	})
	e.account(t, "acc-1", 1000)
	e.payout(t, "po-before", "acc-1", 1)
	ctx, cancel := context.WithCancel(context.Background())
	listening := make(chan error, 1)
	go func() { listening <- e.svc.listenForWork(ctx) }()
	t.Cleanup(func() { cancel(); <-listening })
	// The announcement of po-before is done before paydb goes away.
	e.svc.announce.wg.Wait()

	const (
		announce = "could not announce new work to the other payment-resource processes; their executors see it at their next poll"
		listen   = "listening for created payouts failed; listening again shortly"
	)
	start := time.Now()
	if err := link.Set(faultproxy.Reset, 0); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		req := pc.CreatePayoutRequest{ID: fmt.Sprintf("po-down-%d", i), AccountID: "acc-1", Amount: 1, Currency: "EUR", BeneficiaryRef: "ben"}
		if _, _, err := e.svc.CreatePayout(tctx(t), req, "alice"); err == nil {
			t.Fatalf("create %s succeeded while paydb was unreachable", req.ID)
		}
	}
	capture.WaitFor(t, 2*time.Minute, "3 failed attempts to listen", func(rs []logtest.Record) bool {
		n := 0
		for _, r := range rs {
			if r.Message == listen {
				n++
			}
		}
		return n >= 3
	})
	e.svc.announce.wg.Wait()
	if n := capture.Count(nil, announce); n != 0 {
		t.Errorf("%d lines %q after creates that created nothing, want none", n, announce)
	}
	limit := 1 + int(time.Since(start)/time.Minute)
	if n := capture.Count(logtest.Level(slog.LevelWarn), listen); n < 1 || n > limit {
		t.Errorf("%d WARN lines %q over the outage, want 1 to %d", n, listen, limit)
	}
	if t.Failed() {
		t.FailNow()
	}
	if err := link.Set(faultproxy.Pass, 0); err != nil {
		t.Fatal(err)
	}
	capture.WaitFor(t, 2*time.Minute, "INFO listening for created payouts again", func(rs []logtest.Record) bool {
		for _, r := range rs {
			if r.Message == "listening for created payouts again" && r.Level == slog.LevelInfo && r.Attrs["down_for"] != nil {
				return true
			}
		}
		return false
	})
}
