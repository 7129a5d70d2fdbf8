package reconcile_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
	"github.com/payouts/payouts/reconcile"
)

// passUntil runs passes until done says the last one shows what the test
// waits for (the rail's answer becomes final one settlement window after
// the attempt), failing after a generous timeout.
func passUntil(t *testing.T, r *reconcile.Reconciler, what string, done func(*reconcile.Report) bool) *reconcile.Report {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		rep := pass(t, r)
		if done(rep) {
			return rep
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not seen in time; left: %+v", what, rep.Unresolved)
		}
		time.Sleep(200 * time.Millisecond) // poll interval, not synchronisation
	}
}

// resolved is payout id's resolution in rep, if any.
func resolved(rep *reconcile.Report, id string) (reconcile.Resolved, bool) {
	for _, x := range rep.Resolved {
		if x.PayoutID == id {
			return x, true
		}
	}
	return reconcile.Resolved{}, false
}

// resolveUntil runs passes until the payout is resolved.
func resolveUntil(t *testing.T, r *reconcile.Reconciler, payoutID string) reconcile.Resolved {
	t.Helper()
	rep := passUntil(t, r, "payout "+payoutID+" resolved", func(rep *reconcile.Report) bool {
		_, ok := resolved(rep, payoutID)
		return ok
	})
	x, _ := resolved(rep, payoutID)
	return x
}

func TestResolveSettled(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	// The rail takes the payment and never answers.
	p := e.ambiguous(t, e.newPayout(t, acc, 321), railclient.Faults{TimeoutAfterAccept: 1})
	r := e.reconciler(t, reconcile.Options{Resolve: true}, e.st.Ready.Tokens.Operator)
	x := resolveUntil(t, r, p.ID)
	if x.Resolution != string(pc.ResolutionSettled) || x.State != string(pc.RailAcked) || !x.Token.Valid() {
		t.Fatalf("resolved %+v, want SETTLED -> RAIL_ACKED under a token", x)
	}
	var ev struct {
		ClientRef string                    `json:"client_ref"`
		Final     bool                      `json:"final"`
		RailItems []proxyclient.RailPayment `json:"rail_items"`
	}
	if err := json.Unmarshal([]byte(x.Evidence), &ev); err != nil || !ev.Final || ev.ClientRef != p.ClientRef || len(ev.RailItems) != 1 {
		t.Fatalf("evidence %s (%v)", x.Evidence, err)
	}
	got, err := e.pay.Payout(ctxT(t), p.ID)
	if err != nil || got.State != pc.RailAcked || got.RailRef == "" || got.RailRef != ev.RailItems[0].RailRef {
		t.Fatalf("payout %s: %v %s rail_ref %q, want RAIL_ACKED carrying the rail's reference %q", p.ID, err, got.State, got.RailRef, ev.RailItems[0].RailRef)
	}
	sub, err := e.proxy.Get(ctxT(t), p.ID)
	if err != nil || sub.Resolution != proxyclient.ResolutionSettled {
		t.Fatalf("proxy record: %v %+v", err, sub)
	}
	// The holder posts it; nothing is then out of place for this payout.
	g := e.grant(t, acc)
	if _, err := e.pay.Post(ctxT(t), p.ID, g.Token, g.Holder()); err != nil {
		t.Fatalf("post after resolution: %v", err)
	}
	e.release(t, g)
	rep := pass(t, r)
	for _, f := range rep.Findings {
		if f.Objects["payout_id"] == p.ID || f.Objects["account_id"] == acc {
			t.Fatalf("finding about the resolved payout: %+v", f)
		}
	}
}

func TestResolveAbsent(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	// The connection drops before the rail accepts: nothing was paid.
	p := e.ambiguous(t, e.newPayout(t, acc, 123), railclient.Faults{DropBeforeAccept: 1})
	r := e.reconciler(t, reconcile.Options{Resolve: true}, e.st.Ready.Tokens.Operator)
	x := resolveUntil(t, r, p.ID)
	if x.Resolution != string(pc.ResolutionAbsent) || x.State != string(pc.Failed) {
		t.Fatalf("resolved %+v, want ABSENT -> FAILED", x)
	}
	a, err := e.pay.Account(ctxT(t), acc)
	if err != nil || a.Available != 10_000 {
		t.Fatalf("account after failure: %v %+v", err, a)
	}
}

func TestResolveWaitsForSettlementWindowAndLock(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.ambiguous(t, e.newPayout(t, acc, 55), railclient.Faults{TimeoutAfterAccept: 1})
	// Younger than the reconciler's settlement window: not even looked up.
	rep := pass(t, e.reconciler(t, reconcile.Options{Resolve: true, SettlementWindow: time.Hour}, e.st.Ready.Tokens.Operator))
	if !leftWith(rep, p.ID, "settlement window") {
		t.Fatalf("payout %s not left for the settlement window: %+v", p.ID, rep.Unresolved)
	}
	// Someone else holds the account: left for a later pass.
	g := e.grant(t, acc)
	rep = pass(t, e.reconciler(t, reconcile.Options{Resolve: true}, e.st.Ready.Tokens.Operator))
	if !leftWith(rep, p.ID, "held by another session") {
		t.Fatalf("payout %s not left while the lock is held: %+v", p.ID, rep.Unresolved)
	}
	e.release(t, g)
	resolveUntil(t, e.reconciler(t, reconcile.Options{Resolve: true}, e.st.Ready.Tokens.Operator), p.ID)
}

// waitingLock is the lock service as a reconciler sees it, telling the test
// when the reconciler asks to wait for a key, and whether that wait ended
// with the lease.
type waitingLock struct {
	reconcile.LockService
	waiting chan string
	got     atomic.Bool
}

func (l *waitingLock) Acquire(ctx context.Context, key string, wait time.Duration) (reconcile.Lease, bool, error) {
	if wait == 0 {
		return l.LockService.Acquire(ctx, key, 0)
	}
	select {
	case l.waiting <- key:
	default:
	}
	lease, held, err := l.LockService.Acquire(ctx, key, wait)
	if err == nil && !held {
		l.got.Store(true)
	}
	return lease, held, err
}

// TestResolveWaitsForAHeldLock: with LockWait, a payout whose account
// another session holds (an executor keeping its grant between rounds) is
// resolved in the same pass once the holder lets go, instead of being left
// for a later pass that may find the account held again.
func TestResolveWaitsForAHeldLock(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.ambiguous(t, e.newPayout(t, acc, 66), railclient.Faults{TimeoutAfterAccept: 1})
	g := e.grant(t, acc)
	lock := &waitingLock{waiting: make(chan string, 1)}
	r := e.reconcilerWith(t, reconcile.Options{Resolve: true, LockWait: 2 * time.Minute}, e.st.Ready.Tokens.Operator,
		func(l reconcile.LockService) reconcile.LockService { lock.LockService = l; return lock })
	released := make(chan struct{})
	t.Cleanup(func() { <-released })
	go func() {
		defer close(released)
		select {
		case key := <-lock.waiting:
			if key != fencing.Key(acc) {
				t.Errorf("the reconciler waited for %s, want %s", key, fencing.Key(acc))
			}
		case <-time.After(2 * time.Minute):
			t.Error("the reconciler never waited for the held lock")
		}
		if err := e.lock.Release(context.Background(), g); err != nil {
			t.Errorf("release: %v", err)
		}
	}()
	x := resolveUntil(t, r, p.ID)
	if x.Resolution != string(pc.ResolutionSettled) {
		t.Fatalf("resolved %+v, want SETTLED", x)
	}
	// Resolved through the wait, not by a later pass that found the
	// account free.
	if !lock.got.Load() {
		t.Fatal("the reconciler's wait for the held lock did not end with the lease")
	}
}

func leftWith(rep *reconcile.Report, payoutID, reason string) bool {
	for _, u := range rep.Unresolved {
		if u.PayoutID == payoutID && strings.Contains(u.Reason, reason) {
			return true
		}
	}
	return false
}

// The proxy holds the rail's ACK of a payout the executor reported
// ambiguous (the answer was recorded late), and the rail's final lookup
// shows no payment of it: the rail contradicts itself. The reconciler does
// not resolve the payout ABSENT on the lookup alone (FAILED, its money
// released although the rail took it): it leaves it for a human, and
// reports it at once (ambiguous_evidence_conflict).
func TestResolveLeavesAPayoutWhoseRailContradictsItsAck(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.ambiguous(t, e.newPayout(t, acc, 77), railclient.Faults{DropBeforeAccept: 1})
	e.exec(t, "proxydb", true, `UPDATE rail_submission SET outcome = 'ACKED', rail_ref = 'rl-late', error_code = NULL WHERE payout_id = $1`, p.ID)
	r := e.reconciler(t, reconcile.Options{Resolve: true}, e.st.Ready.Tokens.Operator)
	deadline := time.Now().Add(90 * time.Second)
	for {
		rep := pass(t, r)
		for _, x := range rep.Resolved {
			if x.PayoutID == p.ID {
				t.Fatalf("resolved %+v on a lookup that contradicts the rail's recorded ACK", x)
			}
		}
		if leftWith(rep, p.ID, "contradicts itself") {
			mustFind(t, rep, reconcile.INV02, reconcile.CheckAmbiguousConflict, map[string]any{"payout_id": p.ID, "outcome": "ACKED", "resolution": "ABSENT"})
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("payout %s not left as contradicted; left: %+v", p.ID, rep.Unresolved)
		}
		time.Sleep(200 * time.Millisecond) // poll interval, not synchronisation
	}
	got, err := e.pay.Payout(ctxT(t), p.ID)
	if err != nil || got.State != pc.RailAmbiguous {
		t.Fatalf("payout %s: %v %s, want still RAIL_AMBIGUOUS", p.ID, err, got.State)
	}
}

// TestDeclinedButSettledAmbiguousPayoutIsReported: the proxy recorded the
// rail's decline of a payout left RAIL_AMBIGUOUS, and the rail settled it
// all the same. Resolution leaves it for a human (the rail contradicts
// itself); the pass reports the money that left without a ledger entry as
// settled_not_posted, instead of nothing until the ambiguity SLA.
func TestDeclinedButSettledAmbiguousPayoutIsReported(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.ambiguous(t, e.newPayout(t, acc, 78), railclient.Faults{TimeoutAfterAccept: 1})
	e.exec(t, "proxydb", true, `UPDATE rail_submission SET outcome = 'REJECTED', error_code = 'DECLINED' WHERE payout_id = $1`, p.ID)
	r := e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator)
	deadline := time.Now().Add(90 * time.Second)
	for {
		rep := pass(t, r)
		if len(find(rep, reconcile.CheckSettledNotPosted, map[string]any{"payout_id": p.ID})) > 0 {
			mustFind(t, rep, reconcile.INV03, reconcile.CheckSettledNotPosted, map[string]any{"payout_id": p.ID, "state": "RAIL_AMBIGUOUS"})
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("payout %s: no settled_not_posted once the rail settled it; findings: %+v", p.ID, rep.Findings)
		}
		time.Sleep(200 * time.Millisecond) // the rail's settlement window, not synchronisation
	}
}

// TestResolutionEvidenceOfManyRailPaymentsFits: the evidence recorded with
// a resolution lists the rail's payments of the client reference, and the
// rail may hold more of them than the payment resource records text for
// (here fifteen, with long beneficiary references). The evidence keeps what
// fits and counts the rest, so the payout is resolved instead of refused on
// every pass with its money held.
func TestResolutionEvidenceOfManyRailPaymentsFits(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	ben := strings.Repeat("B", 200)
	p, err := e.pay.CreatePayout(ctxT(t), pc.CreatePayoutRequest{ID: uniq("po"), AccountID: acc, Amount: 55, Currency: "EUR", BeneficiaryRef: ben})
	if err != nil {
		t.Fatal(err)
	}
	p = e.ambiguous(t, p, railclient.Faults{TimeoutAfterAccept: 1})
	const more = 14
	for range more {
		if _, err := e.railPay.Pay(ctxT(t), railclient.PaymentRequest{ClientRef: p.ClientRef, Amount: p.Amount, Currency: p.Currency, BeneficiaryRef: ben}); err != nil {
			t.Fatal(err)
		}
	}
	r := e.reconciler(t, reconcile.Options{Resolve: true}, e.st.Ready.Tokens.Operator)
	x := resolveUntil(t, r, p.ID)
	if x.State != string(pc.RailAcked) {
		t.Fatalf("resolved %+v, want RAIL_ACKED", x)
	}
	var ev struct {
		RailItems []proxyclient.RailPayment `json:"rail_items"`
		LeftOut   int                       `json:"rail_items_left_out"`
	}
	if err := json.Unmarshal([]byte(x.Evidence), &ev); err != nil {
		t.Fatalf("evidence %s: %v", x.Evidence, err)
	}
	if len(x.Evidence) > 4096 || ev.LeftOut == 0 || len(ev.RailItems)+ev.LeftOut != 1+more {
		t.Fatalf("evidence of %d bytes lists %d rail payments and leaves out %d; want at most 4096 bytes accounting for all %d",
			len(x.Evidence), len(ev.RailItems), ev.LeftOut, 1+more)
	}
}
