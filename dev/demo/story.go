package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
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
			s.name, dm.procs[s.name].Process.Pid, s.key, s.token, s.payout.ID, s.payout.State)
	}

	// Past the lease: the session expires at the lock service and exec-1
	// takes the account over with a higher token.
	for _, s := range frozen {
		var newToken fencing.Token
		err := waitFor(ctx, 2*time.Minute, 200*time.Millisecond, "another executor to take "+s.key+" over", func() (bool, error) {
			cctx, cancel := callCtx(ctx)
			defer cancel()
			a, err := dm.pay.Account(cctx, s.payout.AccountID)
			if err != nil {
				return false, err
			}
			newToken = a.FenceToken
			return a.FenceToken > s.token, nil
		})
		if err != nil {
			return err
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

// waitHolding waits until name logs that its hold hook fired and returns
// the payout it holds.
func (dm *demo) waitHolding(ctx context.Context, name string) (string, error) {
	var id string
	err := waitFor(ctx, 2*time.Minute, 100*time.Millisecond, name+" to hold a payout (its hold hook)", func() (bool, error) {
		for _, line := range logLines(dm.st.Ready.Logs[name], "test hook: holding") {
			if v, _ := line["payout_id"].(string); v != "" {
				id = v
				return true, nil
			}
		}
		return false, nil
	})
	return id, err
}

// logLines returns the JSON log lines of path whose msg is msg.
func logLines(path, msg string) []map[string]any {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []map[string]any
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, msg) {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
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

// fenceEvent is a fenced_out safety event at either guard.
type fenceEvent struct {
	guard             string
	key               string
	presented, stored fencing.Token
	holder            fencing.Holder
	payoutID          string
}

// fencedEvents reads every fenced_out safety event from both guards.
func (dm *demo) fencedEvents(ctx context.Context) ([]fenceEvent, error) {
	cctx, cancel := callCtx(ctx)
	defer cancel()
	var out []fenceEvent
	var after int64
	for {
		page, err := dm.pay.SafetyEvents(cctx, after, 1000)
		if err != nil {
			return nil, fmt.Errorf("read the payment resource's safety events: %w", err)
		}
		for _, e := range page.Items {
			after = max(after, e.ID)
			if e.Kind == pc.KindFencedOut {
				out = append(out, fenceEvent{"payment", e.Key, e.PresentedToken, e.StoredToken, e.Holder, e.PayoutID})
			}
		}
		if page.Next == "" || len(page.Items) == 0 {
			break
		}
	}
	cursor := ""
	for {
		page, err := dm.proxy.SafetyEvents(cctx, cursor, 1000)
		if err != nil {
			return nil, fmt.Errorf("read the proxy's safety events: %w", err)
		}
		for _, e := range page.Items {
			if e.Kind == proxyclient.KindFencedOut {
				out = append(out, fenceEvent{"proxy", e.Key, e.PresentedToken, e.StoredToken, e.Holder, e.PayoutID})
			}
		}
		if page.Next == "" || len(page.Items) == 0 {
			return out, nil
		}
		cursor = page.Next
	}
}

func (dm *demo) allFenced(ctx context.Context) []fenceEvent {
	evs, _ := dm.fencedEvents(ctx)
	return evs
}

// staleFences are the events that refused a frozen holder's token.
func staleFences(evs []fenceEvent, frozen []stale) []fenceEvent {
	var out []fenceEvent
	for _, e := range evs {
		for _, s := range frozen {
			if e.key == s.key && e.presented == s.token && e.presented < e.stored {
				out = append(out, e)
				break
			}
		}
	}
	return out
}

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

// summary runs the final reconciliation and checks the story.
func (dm *demo) summary(ctx context.Context) error {
	dm.d.Step(4, "Summary")
	rep, code, err := dm.reconcile(ctx, 99)
	if err != nil {
		return err
	}
	dm.sum.ReconcileExit = code
	dm.sum.ReconcileFindings = map[string]int{}
	for _, f := range rep.Findings {
		dm.sum.ReconcileFindings[f.Check]++
		if f.Invariant == "INV-03" {
			dm.sum.LedgerFindings = append(dm.sum.LedgerFindings, f.Check+": "+f.Evidence)
		}
	}
	unresolved := map[string]string{}
	for _, u := range rep.Unresolved {
		unresolved[u.PayoutID] = u.Reason
	}

	all, err := dm.payoutsOf(ctx, "")
	if err != nil {
		return err
	}
	dm.sum.FinalStates = map[pc.State]int{}
	var posted int64
	postedRef := map[string]bool{}
	for _, p := range all {
		dm.sum.FinalStates[p.State]++
		switch {
		case p.State == pc.Posted:
			posted += p.Amount
			postedRef[p.ClientRef] = true
		case p.State.Terminal():
		case p.State == pc.RailAmbiguous && unresolved[p.ID] != "":
		default:
			dm.fail("payout %s ended %s (neither terminal nor left ambiguous with a reason)", p.ID, p.State)
		}
	}
	for _, e := range dm.allFenced(ctx) {
		dm.sum.FencedOut[e.guard]++
	}

	cctx, cancel := callCtx(ctx)
	defer cancel()
	report, err := dm.rail.SettlementReport(cctx)
	if err != nil {
		return fmt.Errorf("read the rail's settlement report: %w", err)
	}
	settled := map[string]int{}
	var settledPosted int64
	for _, p := range report {
		if p.Status != railclient.StatusSettled {
			continue
		}
		settled[p.ClientRef]++
		if postedRef[p.ClientRef] {
			settledPosted += p.Amount
		}
	}
	var dupRefs []string
	for ref, n := range settled {
		if n > 1 {
			dm.sum.RailDuplicates++
			dupRefs = append(dupRefs, fmt.Sprintf("%s x%d", ref, n))
		}
	}
	sort.Strings(dupRefs)

	accounts, err := dm.accounts(ctx)
	if err != nil {
		return err
	}
	for _, a := range accounts {
		dm.sum.BalanceSum += a.Balance
	}
	balanced := dm.sum.BalanceSum == 0 && len(dm.sum.LedgerFindings) == 0

	s := dm.sum
	dm.d.Printf("  payouts by final state:          %s", formatCounts(s.FinalStates))
	dm.d.Printf("  fenced-out events per guard:     payment %d, proxy %d%s", s.FencedOut["payment"], s.FencedOut["proxy"], freezeNote(s))
	dm.d.Printf("  ambiguous resolved:              %d of %d (settled %d, absent %d)", s.AmbiguousResolved, s.AmbiguousSeen, s.Resolutions["SETTLED"], s.Resolutions["ABSENT"])
	dm.d.Printf("  duplicate payments at the rail: %d", s.RailDuplicates)
	dm.d.Printf("  money settled at the rail for POSTED payouts: %d; posted in the ledger: %d", settledPosted, posted)
	dm.d.Printf("  ledger balanced: %s (sum of %d account balances = %d; reconciler INV-03 findings: %d)", yesNo(balanced), len(accounts), s.BalanceSum, len(s.LedgerFindings))
	dm.d.Printf("  reconciler exit code: %d%s", code, findingsNote(s.ReconcileFindings))

	if s.RailDuplicates > 0 {
		dm.fail("%d client references were paid more than once at the rail: %s", s.RailDuplicates, strings.Join(dupRefs, ", "))
	}
	if s.BalanceSum != 0 {
		dm.fail("the account balances sum to %d, not 0", s.BalanceSum)
	}
	for _, f := range s.LedgerFindings {
		dm.fail("the reconciler found a ledger problem (INV-03): %s", f)
	}
	if settledPosted != posted {
		dm.fail("money settled at the rail for POSTED payouts (%d) differs from money posted (%d)", settledPosted, posted)
	}
	if s.FencedOut["payment"]+s.FencedOut["proxy"] == 0 {
		dm.fail("no fence fired: the stale holder was never shown refused")
	}
	switch {
	case code == 2:
		dm.fail("the final reconciliation could not run (exit 2); see %s", dm.st.Ready.Dir+"/logs/reconcile-99.log")
	case code != 0 && code != 1:
		dm.fail("the final reconciliation exited %d", code)
	}
	for check, n := range s.ReconcileFindings {
		if !evidenceCheck[check] {
			dm.fail("the reconciler reported %d %s finding(s)", n, check)
		}
	}
	return nil
}

// evidenceCheck are the reconciler's findings that record a safety net
// firing (expected in this story) rather than an invariant broken.
var evidenceCheck = map[string]bool{
	pc.KindFencedOut:                 true,
	proxyclient.KindDuplicateAttempt: true,
	pc.KindRejectedTransition:        true,
}

func freezeNote(s Summary) string {
	switch {
	case s.FreezeMode == FreezeByHook:
		return " (holders frozen at the executor's hold hook)"
	case s.Replayed:
		return " (holder frozen by timing; its stale writes presented by the demo)"
	default:
		return " (holder frozen by timing)"
	}
}

func findingsNote(f map[string]int) string {
	if len(f) == 0 {
		return " (clean)"
	}
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	expected := true
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, f[k])
		expected = expected && evidenceCheck[k]
	}
	note := " (findings: " + strings.Join(parts, ", ")
	if expected {
		note += " — evidence that the guards fired, expected in this story"
	}
	return note + ")"
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
