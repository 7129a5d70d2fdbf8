package demo

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// stale is a frozen holder and what it was doing.
type stale struct {
	name   string
	payout pc.Payout // the payout it was working on when frozen
	key    string
	token  fencing.Token
	holder fencing.Holder
	guard  string // the guard its next write goes to
}

// uc03 freezes holders past their lease, lets another executor take over,
// thaws them and shows the guards fencing them out.
func (dm *demo) uc03(ctx context.Context) error {
	dm.d.Step(2, "UC-03: a holder frozen past its lease is fenced out")
	var frozen []stale
	if dm.cfg.Freeze == FreezeByHook {
		for _, h := range []struct{ name, guard string }{{exec2, "payment"}, {exec3, "proxy"}} {
			id, err := dm.waitHolding(ctx, h.name)
			if err != nil {
				return err
			}
			if err := dm.signal(h.name, syscall.SIGSTOP); err != nil {
				return err
			}
			p, err := dm.payout(ctx, id)
			if err != nil {
				return err
			}
			frozen = append(frozen, stale{name: h.name, payout: p, key: fencing.Key(p.AccountID), token: p.Token, holder: p.ClaimedBy, guard: h.guard})
		}
	} else {
		s, err := dm.freezeByTiming(ctx, exec2)
		if err != nil {
			return err
		}
		frozen = append(frozen, s)
	}
	for _, s := range frozen {
		dm.d.Printf("  SIGSTOP %s (pid %d): it holds %s under token %d and was working on %s (%s)",
			s.name, dm.procs[s.name].Pid(), s.key, s.token, s.payout.ID, s.payout.State)
	}

	// Past the lease: the session expires at the lock service and exec-1
	// takes the account over with a higher token.
	for i, recaught := 0, 0; i < len(frozen); i++ {
		s := frozen[i]
		newToken, left, err := dm.awaitTakeover(ctx, s)
		if err != nil {
			return err
		}
		if !left {
			// Timing mode: the holder's last write was already on its way
			// when it froze and landed afterwards, so the account has nothing
			// left to do and no one will take it over. Thaw it and catch it
			// again.
			if recaught++; recaught > 5 {
				return fmt.Errorf("%s's writes kept landing as it froze: nothing left to take over", s.name)
			}
			if err := dm.signal(s.name, syscall.SIGCONT); err != nil {
				return err
			}
			dm.d.Printf("  (%s's last write landed as it froze: %s has nothing left to take over; thawed it to catch it again)", s.name, s.key)
			if frozen[i], err = dm.freezeByTiming(ctx, s.name); err != nil {
				return err
			}
			s = frozen[i]
			dm.d.Printf("  SIGSTOP %s (pid %d): it holds %s under token %d and was working on %s (%s)",
				s.name, dm.procs[s.name].Pid(), s.key, s.token, s.payout.ID, s.payout.State)
			i--
			continue
		}
		dm.d.Printf("  %s's session expired; %s was taken over: the payment guard's fence is now token %d", s.name, s.key, newToken)
		err = waitFor(ctx, 2*time.Minute, 200*time.Millisecond, "the new holder to finish "+s.payout.ID, func() (bool, error) {
			p, err := dm.payout(ctx, s.payout.ID)
			if err != nil {
				return false, err
			}
			return !p.State.Actionable(), nil
		})
		if err != nil {
			return err
		}
		p, err := dm.payout(ctx, s.payout.ID)
		if err != nil {
			return err
		}
		dm.d.Printf("  the new holder finished %s: %s under token %d", p.ID, p.State, p.Token)
	}

	// Thaw: each frozen holder carries on with its old token.
	seen, err := dm.fencedEvents(ctx)
	if err != nil {
		return err
	}
	before := len(seen)
	for _, s := range frozen {
		if err := dm.signal(s.name, syscall.SIGCONT); err != nil {
			return err
		}
		dm.d.Printf("  SIGCONT %s: it resumes as if nothing happened, still carrying token %d", s.name, s.token)
	}
	wait := 2 * time.Minute
	if dm.cfg.Freeze == FreezeByTiming {
		wait = 10 * time.Second
	}
	var fenced []fenceEvent
	_ = waitFor(ctx, wait, 200*time.Millisecond, "the guards to fence the frozen holders out", func() (bool, error) {
		evs, err := dm.fencedEvents(ctx)
		if err != nil {
			return false, err
		}
		fenced = staleFences(evs, frozen)
		if dm.cfg.Freeze == FreezeByHook {
			return len(unfenced(evs, frozen)) == 0, nil
		}
		// Frozen by timing, its next write may go to either guard.
		return len(fenced) >= len(frozen), nil
	})
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if dm.cfg.Freeze == FreezeByTiming && len(fenced) == 0 {
		dm.d.Printf("  %s wrote nothing with token %d within %s of waking: its own lease check (liveness, not safety) saw the lease gone.", exec2, frozen[0].token, wait)
		dm.d.Printf("  A pause between that check and the write is what the guards are for; the demo sends the writes")
		dm.d.Printf("  %s would then have sent, with its stale token and holder:", exec2)
		if err := dm.replay(ctx, frozen[0]); err != nil {
			return err
		}
		dm.sum.Replayed = true
		evs, err := dm.fencedEvents(ctx)
		if err != nil {
			return err
		}
		fenced = staleFences(evs, frozen)
	}
	if len(fenced) == 0 {
		dm.fail("no guard fenced out the frozen holder(s) within %s of thawing", wait)
	}
	if dm.cfg.Freeze == FreezeByHook {
		// Held at the hook, each holder's next write goes to a known
		// guard: the story is that each of them fences its holder out.
		evs, err := dm.fencedEvents(ctx)
		if err != nil {
			return err
		}
		for _, s := range unfenced(evs, frozen) {
			dm.fail("%s (token %d) was not fenced out at the %s guard within %s of thawing", s.name, s.token, s.guard, wait)
		}
	}
	for _, e := range fenced {
		dm.d.Printf("  FENCED OUT at the %-7s guard: key %s, presented token %d < stored token %d (holder %s, payout %s)",
			e.guard, e.key, e.presented, e.stored, e.holder, e.payoutID)
	}
	dm.d.Printf("  (%d fenced_out safety events in all; %d before the thaw)", len(dm.allFenced(ctx)), before)

	if dm.cfg.Freeze == FreezeByHook {
		// A held executor would hold again at its next claim: restart both
		// without the hook, as an operator would restart a process.
		for _, s := range frozen {
			dm.st.StopRole(s.name, 30*time.Second)
			if err := dm.startExecutor(s.name, 2, ""); err != nil {
				return err
			}
		}
		dm.d.Printf("  %s restarted as ordinary executors", strings.Join([]string{exec2, exec3}, " and "))
	}
	return nil
}

// holdState is the state a payout is left in by each executor whose hold
// hook is armed (FreezeByHook): exec-2 holds after its claim, exec-3 after
// recording RAIL_SUBMITTED.
var holdState = map[string]pc.State{exec2: pc.Claimed, exec3: pc.RailSubmitted}

// waitHolding waits until name holds a payout at its hold hook and returns
// that payout. It asks the services, not the executor's log: the lock
// service's grant log names name's grants still in force, and the payment
// resource shows a payout of that account claimed under one of them, in
// the state the hook holds it in.
func (dm *demo) waitHolding(ctx context.Context, name string) (string, error) {
	var id string
	err := waitFor(ctx, 2*time.Minute, 100*time.Millisecond, name+" to hold a payout (its hold hook)", func() (bool, error) {
		grants, err := dm.liveGrants(ctx, name)
		if err != nil {
			return false, err
		}
		for _, g := range grants {
			ps, err := dm.payoutsOf(ctx, strings.TrimPrefix(g.Key, fencing.Key("")))
			if err != nil {
				return false, err
			}
			for _, p := range ps {
				if p.State == holdState[name] && p.ClaimedBy == g.Holder() && p.Token == g.Token {
					id = p.ID
					return true, nil
				}
			}
		}
		return false, nil
	})
	return id, err
}

// awaitTakeover waits until another executor has written to s's account
// under a higher token than s's, and returns that token. left is false
// when, in timing mode, the account has nothing left to do while its
// fence still holds s's token: the frozen holder's last write landed after
// it froze, and no one will take the account over.
func (dm *demo) awaitTakeover(ctx context.Context, s stale) (newToken fencing.Token, left bool, err error) {
	left = true
	err = waitFor(ctx, 2*time.Minute, 200*time.Millisecond, "another executor to take "+s.key+" over", func() (bool, error) {
		cctx, cancel := callCtx(ctx)
		defer cancel()
		a, err := dm.pay.Account(cctx, s.payout.AccountID)
		if err != nil {
			return false, err
		}
		if newToken = a.FenceToken; newToken > s.token {
			return true, nil
		}
		if dm.cfg.Freeze != FreezeByTiming {
			return false, nil
		}
		ps, err := dm.payoutsOf(cctx, s.payout.AccountID)
		if err != nil {
			return false, err
		}
		for _, p := range ps {
			if p.State.Actionable() {
				return false, nil
			}
		}
		left = false
		return true, nil
	})
	return newToken, left, err
}

// freezeByTiming stops name with SIGSTOP at a moment it holds a grant with
// a payout of that account in flight under its session. It tries for a
// while; failing that it settles for a grant on an account with work left.
func (dm *demo) freezeByTiming(ctx context.Context, name string) (stale, error) {
	deadline := time.Now().Add(20 * time.Second)
	for attempt := 1; ; attempt++ {
		strict := time.Now().Before(deadline)
		s, ok, err := dm.catch(ctx, name, strict)
		if err != nil {
			return s, err
		}
		if ok {
			if !strict {
				dm.d.Printf("  (no payout caught in flight after %d tries: froze %s while it holds %s with work left)", attempt, name, s.key)
			}
			return s, nil
		}
		if time.Now().After(deadline.Add(time.Minute)) {
			return s, fmt.Errorf("could not catch %s holding a grant in %d tries; is there work left?", name, attempt)
		}
		if err := pause(ctx, 20*time.Millisecond); err != nil {
			return s, err
		}
	}
}

// catch makes one attempt: find name's grants, freeze it, and confirm
// (now that it cannot move) that it holds what we saw; otherwise thaw.
func (dm *demo) catch(ctx context.Context, name string, strict bool) (stale, bool, error) {
	cctx, cancel := callCtx(ctx)
	defer cancel()
	locks, err := dm.lock.Locks(cctx, "payout:")
	if err != nil {
		return stale{}, false, fmt.Errorf("list locks: %w", err)
	}
	for _, l := range locks {
		if !l.Held || l.Owner != name {
			continue
		}
		account := strings.TrimPrefix(l.Key, "payout:")
		if err := dm.signal(name, syscall.SIGSTOP); err != nil {
			return stale{}, false, err
		}
		// Frozen: what it holds can no longer change under us.
		s, ok, err := dm.confirmHold(cctx, name, account, l.Key, l.SessionID, strict)
		if err != nil || ok {
			return s, ok, err
		}
		if err := dm.signal(name, syscall.SIGCONT); err != nil {
			return stale{}, false, err
		}
	}
	return stale{}, false, nil
}

func (dm *demo) confirmHold(ctx context.Context, name, account, key, session string, strict bool) (stale, bool, error) {
	info, err := dm.lock.Lock(ctx, key)
	if err != nil {
		return stale{}, false, fmt.Errorf("read lock %s: %w", key, err)
	}
	if !info.Held || info.SessionID != session {
		return stale{}, false, nil
	}
	ps, err := dm.payoutsOf(ctx, account)
	if err != nil {
		return stale{}, false, err
	}
	s := stale{name: name, key: key, token: info.Token, holder: fencing.Holder(session), guard: "payment"}
	for _, p := range ps {
		if (p.State == pc.Claimed || p.State == pc.RailSubmitted) && p.ClaimedBy == s.holder {
			s.payout = p
			return s, true, nil
		}
	}
	if strict {
		return s, false, nil
	}
	for _, p := range ps {
		if p.State.Actionable() {
			s.payout = p
			return s, true, nil
		}
	}
	return s, false, nil
}

// replay presents a frozen holder's token and holder to both guards, as
// the frozen executor would have. The proxy is asked only when its fence
// for the account is above the stale token (a later holder has submitted
// there); otherwise the proxy has no later holder to protect.
func (dm *demo) replay(ctx context.Context, s stale) error {
	cctx, cancel := callCtx(ctx)
	defer cancel()
	_, err := dm.pay.Submitting(cctx, s.payout.ID, s.token, s.holder)
	switch {
	case problem.Has(err, problem.FencedOut):
		dm.d.Printf("    POST /v1/payouts/%s/submitting with token %d -> fenced_out", s.payout.ID, s.token)
	case err != nil:
		dm.fail("the payment guard answered a stale write (token %d on %s) with %v, not fenced_out", s.token, s.key, err)
	default:
		dm.fail("the payment guard ACCEPTED a stale write (token %d on %s)", s.token, s.key)
	}
	hw, err := dm.highWater(cctx, s.payout.AccountID)
	if err != nil {
		return err
	}
	if hw <= s.token {
		dm.d.Printf("    the proxy's fence for %s is still token %d (no later holder has submitted there): nothing to replay at the proxy", s.payout.AccountID, hw)
		return nil
	}
	p := s.payout
	_, err = dm.proxy.Submit(cctx, proxyclient.Submission{PayoutID: p.ID, AccountID: p.AccountID, ClientRef: p.ClientRef,
		Amount: p.Amount, Currency: p.Currency, BeneficiaryRef: p.BeneficiaryRef}, s.token, s.holder)
	switch {
	case problem.Has(err, problem.FencedOut):
		dm.d.Printf("    POST /v1/submissions for %s with token %d -> fenced_out (recorded as a FENCED attempt, never forwarded)", p.ID, s.token)
	case err != nil:
		dm.fail("the proxy answered a stale submission (token %d, fence %d) with %v, not fenced_out", s.token, hw, err)
	default:
		dm.fail("the proxy ACCEPTED a stale submission (token %d below its fence %d)", s.token, hw)
	}
	return nil
}

func (dm *demo) highWater(ctx context.Context, account string) (fencing.Token, error) {
	after := ""
	for {
		page, err := dm.proxy.HighWater(ctx, after, 1000)
		if err != nil {
			return 0, fmt.Errorf("read the proxy's high-water marks: %w", err)
		}
		for _, h := range page.Items {
			if h.AccountID == account {
				return h.Token, nil
			}
		}
		if page.Next == "" || len(page.Items) == 0 {
			return 0, nil
		}
		after = page.Next
	}
}
