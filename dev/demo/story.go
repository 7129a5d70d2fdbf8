package demo

import (
	"context"
	"fmt"
	"time"

	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
)

const (
	currency      = "EUR"
	poorAccount   = "acc-poor" // too little money for all its payouts
	declinePrefix = railclient.DefaultDeclinePrefix
)

// The executors. In hook mode exec-2 holds after a claim (the payment
// guard fences it) and exec-3 after recording RAIL_SUBMITTED (the proxy
// fences it); exec-1 does the rest and takes their accounts over. In
// timing mode exec-1 and exec-2 are ordinary and exec-2 is frozen.
const (
	exec1 = "exec-1"
	exec2 = "exec-2"
	exec3 = "exec-3"
)

// story walks the four chapters.
func (dm *demo) story(ctx context.Context) error {
	if err := dm.loadFixtures(ctx); err != nil {
		return err
	}
	if err := dm.flowing(ctx); err != nil {
		return err
	}
	if err := dm.uc03(ctx); err != nil {
		return err
	}
	if err := dm.ambiguous(ctx); err != nil {
		return err
	}
	return dm.summary(ctx)
}

// loadFixtures creates the accounts and payouts and turns rail faults on.
func (dm *demo) loadFixtures(ctx context.Context) error {
	cfg := dm.cfg
	dm.d.Step(1, "Payouts flowing")
	accounts := make([]string, 0, cfg.Accounts)
	for i := 1; i < cfg.Accounts; i++ {
		accounts = append(accounts, fmt.Sprintf("acc-%02d", i))
	}
	accounts = append(accounts, poorAccount)
	for _, id := range accounts {
		balance := int64(10_000_000)
		if id == poorAccount {
			balance = 2_500
		}
		cctx, cancel := callCtx(ctx)
		_, err := dm.pay.CreateAccount(cctx, pc.CreateAccountRequest{ID: id, Currency: currency, OpeningBalance: balance})
		cancel()
		if err != nil {
			return fmt.Errorf("create account %s: %w", id, err)
		}
	}
	declines := 0
	for i := 1; i <= cfg.Payouts; i++ {
		ben := fmt.Sprintf("BEN-%03d", i)
		if i%17 == 0 {
			ben = declinePrefix + "-" + ben
			declines++
		}
		cctx, cancel := callCtx(ctx)
		_, err := dm.pay.CreatePayout(cctx, pc.CreatePayoutRequest{ID: fmt.Sprintf("po-%03d", i),
			AccountID: accounts[(i-1)%len(accounts)], Amount: 1_000 + int64(i)*7, Currency: currency, BeneficiaryRef: ben})
		cancel()
		if err != nil {
			return fmt.Errorf("create payout po-%03d: %w", i, err)
		}
	}
	dm.d.Printf("  loaded %d accounts and %d payouts: %d to beneficiaries starting with %s (the rail declines them); account %s has money for only a couple of its payouts",
		len(accounts), cfg.Payouts, declines, declinePrefix, poorAccount)

	f := railclient.Faults{TimeoutAfterAccept: 0.08, ErrorBeforeAccept: 0.05, LatencyMS: 120, DeclineBeneficiaryPrefix: declinePrefix}
	cctx, cancel := callCtx(ctx)
	defer cancel()
	if _, err := dm.rail.SetFaults(cctx, f.Full()); err != nil {
		return fmt.Errorf("turn rail faults on: %w", err)
	}
	dm.d.Printf("  rail faults on: %.0f%% of payments accepted but never answered (ambiguous), %.0f%% refused with a 5xx, %dms latency",
		f.TimeoutAfterAccept*100, f.ErrorBeforeAccept*100, f.LatencyMS)
	return nil
}

// flowing starts the executors and shows payouts moving.
func (dm *demo) flowing(ctx context.Context) error {
	ttl := dm.cfg.SessionTTL
	if dm.cfg.Freeze == FreezeByHook {
		// The two holders start first so each holds a payout of its own
		// while the queue is full; exec-1 then works the other accounts.
		if err := dm.startExecutor(exec2, 1, dm.cfg.HoldClaimed); err != nil {
			return err
		}
		if err := dm.startExecutor(exec3, 1, dm.cfg.HoldSubmitting); err != nil {
			return err
		}
		for _, name := range []string{exec2, exec3} {
			if _, err := dm.waitHolding(ctx, name); err != nil {
				return err
			}
		}
		if err := dm.startExecutor(exec1, 4, ""); err != nil {
			return err
		}
		dm.d.Printf("  three executors (session TTL %s): exec-1 works the queue; exec-2 and exec-3 are each in the middle of a payout", ttl)
	} else {
		for _, name := range []string{exec1, exec2} {
			if err := dm.startExecutor(name, 2, ""); err != nil {
				return err
			}
		}
		dm.d.Printf("  two executors (session TTL %s), each working two accounts at a time", ttl)
	}
	target := dm.cfg.Payouts / 4
	return waitFor(ctx, 3*time.Minute, 150*time.Millisecond, "payouts to flow", func() (bool, error) {
		c, err := dm.counts(ctx)
		if err != nil {
			return false, err
		}
		dm.d.Progress(c)
		if c[pc.Posted]+c[pc.Failed]+c[pc.RailAmbiguous] >= target {
			dm.d.Done(c)
			return true, nil
		}
		return false, nil
	})
}
