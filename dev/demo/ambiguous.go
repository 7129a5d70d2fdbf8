package demo

import (
	"context"
	"strings"
	"time"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

// ambiguous drains the queue, waits out the settlement window and lets the
// reconciler resolve the ambiguous payouts; executors post the settled.
func (dm *demo) ambiguous(ctx context.Context) error {
	dm.d.Step(3, "Ambiguous payouts: the rail accepted them and never answered")
	if err := dm.drain(ctx); err != nil {
		return err
	}
	amb, err := dm.payoutsIn(ctx, pc.RailAmbiguous)
	if err != nil {
		return err
	}
	dm.sum.AmbiguousSeen = len(amb)
	if len(amb) == 0 {
		dm.d.Printf("  no payout is ambiguous this time (the rail's timeouts are random); the reconciler still runs")
	} else {
		ids := make([]string, len(amb))
		for i, p := range amb {
			ids[i] = p.ID
		}
		dm.d.Printf("  %d RAIL_AMBIGUOUS: %s — never resubmitted; their money is held back from the funds check", len(amb), strings.Join(ids, ", "))
	}
	for pass := 1; ; pass++ {
		if dm.sum.AmbiguousSeen > 0 {
			dm.d.Printf("  waiting out the rail's settlement window (%s): only then is its answer final", dm.cfg.SettlementWindow)
			if err := pause(ctx, dm.cfg.SettlementWindow+time.Second); err != nil {
				return err
			}
		}
		rep, code, err := dm.reconcile(ctx, pass)
		if err != nil {
			return err
		}
		dm.d.Printf("  payouts reconcile --once --json (pass %d): exit %d, %d resolved, %d left", pass, code, len(rep.Resolved), len(rep.Unresolved))
		for _, r := range rep.Resolved {
			dm.sum.AmbiguousResolved++
			dm.sum.Resolutions[r.Resolution]++
			dm.d.Printf("    %s: the rail says %s -> %s (under token %d)", r.PayoutID, r.Resolution, r.State, r.Token)
		}
		for _, u := range rep.Unresolved {
			dm.d.Printf("    %s left ambiguous: %s", u.PayoutID, u.Reason)
		}
		if err := dm.drain(ctx); err != nil {
			return err
		}
		left, err := dm.payoutsIn(ctx, pc.RailAmbiguous)
		if err != nil {
			return err
		}
		if len(left) == 0 || pass >= 3 {
			return nil
		}
	}
}

// drain waits until no payout is in an actionable state.
func (dm *demo) drain(ctx context.Context) error {
	return waitFor(ctx, 3*time.Minute, 150*time.Millisecond, "the executors to drain the queue", func() (bool, error) {
		c, err := dm.counts(ctx)
		if err != nil {
			return false, err
		}
		dm.d.Progress(c)
		for s, n := range c {
			if n > 0 && s.Actionable() {
				return false, nil
			}
		}
		dm.d.Done(c)
		return true, nil
	})
}
