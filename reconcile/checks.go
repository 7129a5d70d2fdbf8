package reconcile

import (
	"context"
	"slices"
	"sync"

	"github.com/payouts/payouts/lock/fencing"
)

// The services are read one after another, never in one snapshot, while
// executors keep working. Every check is therefore written so that a
// correct system cannot produce a finding from the order of the reads:
// either the reads follow the order in which a correct system writes
// (lock before guards, paydb before proxy, proxy before rail), or a
// suspect is read again, fresh and in that order, before it is reported.

// check runs every check into rep.
func (r *Reconciler) check(ctx context.Context, rep *Report) error {
	// Guards first, then the lock service: a grant is issued before any
	// guard can store its token, so a correct system always shows
	// lock_high_token >= every fence read before it.
	payHigh, err := r.c.Payment.HighFence(ctx)
	if err != nil {
		return cannotRun("read the payment resource's highest fence", err)
	}
	proxyHigh, err := r.c.Proxy.HighFence(ctx)
	if err != nil {
		return cannotRun("read the rail proxy's highest fence", err)
	}
	lockHigh, err := r.c.Lock.HighToken(ctx)
	if err != nil {
		return cannotRun("read the lock service's highest token", err)
	}
	rep.PayDBFence, rep.ProxyFence, rep.LockHighToken = payHigh, proxyHigh, lockHigh
	rep.HighestFence = max(payHigh, proxyHigh)

	grants := newGrantIndex(r.c.Lock, r.opts.PageSize).withRetention(r.opts.GrantRetention, r.opts.Now()).withLoss(r.opts.GrantLogLostThrough)
	if err := grants.load(ctx); err != nil {
		return cannotRun("read the lock service's grant log", err)
	}

	// The books (ledger, balances, fences) and the payouts are checked at
	// the same time: neither reads what the other finds, and each waits on
	// its own services.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error // the failure that stopped the other half too
	)
	fail := func(err error) {
		if err != nil {
			once.Do(func() { first = err; cancel() })
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		fail(r.checkPayouts(cctx, rep, grants))
	}()
	fail(r.checkBooks(cctx, rep, grants))
	wg.Wait()
	if first != nil {
		return first
	}
	if err := r.checkSafetyEvents(ctx, rep); err != nil {
		return err
	}
	rep.Scanned.Grants = grants.len()
	grants.noteBeyond(rep)
	return nil
}

// checkBooks: the ledger (group sums, grants of payout entries), then
// every balance against it, then the proxy's high-water marks against
// paydb's fences, then the order of the proxy's forwarded submissions,
// then the changes of payouts out of a final state.
func (r *Reconciler) checkBooks(ctx context.Context, rep *Report, grants *grantIndex) error {
	ledger, err := r.scanLedger(ctx, rep, grants)
	if err != nil {
		return err
	}
	fences, err := r.checkAccounts(ctx, rep, ledger)
	if err != nil {
		return err
	}
	checkLockRewound(rep, fences)
	if err := r.checkHighWater(ctx, rep, fences); err != nil {
		return err
	}
	if err := r.checkSubmissionOrder(ctx, rep); err != nil {
		return err
	}
	return r.checkTerminalLeft(ctx, rep)
}

// checkLockRewound: no guard stores a fence above the highest token the
// lock service has issued (INV-04): the guards' highest fences were read
// before it (check), so a correct system cannot make this fire. The
// finding names the accounts whose paydb fence is above that token (read
// since, so an account granted meanwhile may be among them): they stall
// until the lock service is bumped past their fences.
func checkLockRewound(rep *Report, fences map[string]fencing.Token) {
	lockHigh := rep.LockHighToken
	if rep.HighestFence <= lockHigh {
		return
	}
	var above []string
	for id, f := range fences {
		if f > lockHigh {
			above = append(above, id)
		}
	}
	slices.Sort(above)
	n := len(above)
	if n > maxNamed {
		above = above[:maxNamed]
	}
	rep.add(CheckLockRewound, map[string]any{
		"highest_fence": rep.HighestFence, "paydb_high_fence": rep.PayDBFence, "proxy_high_fence": rep.ProxyFence, "lock_high_token": lockHigh,
		"accounts_above": above, "accounts_above_count": n,
	}, "the guards store fence %d but the lock service's tokens reach only %d: it was restored or rewound and will re-issue tokens already issued (stop the lock services and bump it above %d by a margin, DESIGN D-13); %d account(s) in paydb have a fence above %d and stall until then",
		rep.HighestFence, lockHigh, rep.HighestFence, n, lockHigh)
}

// maxNamed bounds the ids a finding lists (its count says how many there are).
const maxNamed = 100

// grantIndex is the grant log as token -> key. It is the one structure
// that grows with the history (one small entry per grant).
