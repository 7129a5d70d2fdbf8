package reconcile_test

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
	"github.com/payouts/payouts/reconcile"
)

// slow is a stack whose rail answers are not final for an hour, shared by
// the three tests below: the clean one starts it, the one that removes the
// proxy's uniqueness index spends it. They hold in any order and on any
// -count: a test that needs a clean stack starts one, and a spent stack is
// never handed out again (TestMain stops every stack started).
var slow *testBundle

// setupSlowRail returns the slow-rail stack, started if there is none.
func setupSlowRail(t *testing.T) *testBundle {
	t.Helper()
	if slow == nil {
		slow = startStack(t, time.Hour)
	}
	return slow
}

// freshSlowRail starts a slow-rail stack nothing has planted into yet.
func freshSlowRail(t *testing.T) *testBundle {
	t.Helper()
	slow = startStack(t, time.Hour)
	return slow
}

// spendSlowRail returns the slow-rail stack for a test that breaks it: once
// the test ends, the next one to ask starts a new stack.
func spendSlowRail(t *testing.T) *testBundle {
	t.Helper()
	e := setupSlowRail(t)
	t.Cleanup(func() { slow = nil })
	return e
}

func TestCleanSystemReportsNothing(t *testing.T) {
	e := freshSlowRail(t)
	acc := e.newAccount(t, 10_000)
	for i := 0; i < 3; i++ {
		e.payOut(t, e.newPayout(t, acc, 100))
	}
	e.newPayout(t, acc, 50) // pending work is not a finding
	r := e.reconciler(t, reconcile.Options{Resolve: true, PageSize: 2}, e.st.Ready.Tokens.Operator)
	rep := pass(t, r)
	if !rep.Clean() || len(rep.Findings) != 0 {
		b, _ := json.MarshalIndent(rep, "", "  ")
		t.Fatalf("clean system has findings:\n%s", b)
	}
	if rep.Scanned.Payouts != 4 || rep.Scanned.RailPayments != 3 || rep.Scanned.LedgerEntries < 8 {
		t.Fatalf("scanned %+v: paging missed something", rep.Scanned)
	}
	if rep.HighestFence == 0 || rep.LockHighToken < rep.HighestFence {
		t.Fatalf("highest fence %d, lock high token %d", rep.HighestFence, rep.LockHighToken)
	}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil || !strings.Contains(buf.String(), "No findings.") {
		t.Fatalf("table: %v\n%s", err, buf.String())
	}
	// With only a reconciler-role rail credential the rail refuses its
	// settlement report: the pass still completes, checking per payout, and says so.
	rep = pass(t, e.reconciler(t, reconcile.Options{Resolve: true}, ""))
	if !rep.Clean() || len(rep.Notes) == 0 {
		t.Fatalf("clean: %v, notes %v", rep.Clean(), rep.Notes)
	}
}

func TestAmbiguousNotFinalIsLeft(t *testing.T) {
	e := setupSlowRail(t)
	acc := e.newAccount(t, 10_000)
	p := e.ambiguous(t, e.newPayout(t, acc, 300), railclient.Faults{TimeoutAfterAccept: 1})
	r := e.reconciler(t, reconcile.Options{Resolve: true}, e.st.Ready.Tokens.Operator)
	rep := pass(t, r)
	if len(rep.Resolved) != 0 {
		t.Fatalf("resolved %+v though the rail is not final", rep.Resolved)
	}
	left := false
	for _, u := range rep.Unresolved {
		if u.PayoutID == p.ID {
			left = strings.Contains(u.Reason, "not final")
		}
	}
	if !left {
		t.Fatalf("payout %s not reported as left for a non-final answer: %+v", p.ID, rep.Unresolved)
	}
	got, err := e.pay.Payout(ctxT(t), p.ID)
	if err != nil || got.State != pc.RailAmbiguous {
		t.Fatalf("payout %s: %v %s, want still RAIL_AMBIGUOUS", p.ID, err, got.State)
	}
	// Young ambiguity is not a finding; past the SLA it is.
	mustNotFind(t, rep, reconcile.CheckAmbiguousOverSLA, map[string]any{"payout_id": p.ID})
	rep = pass(t, e.reconciler(t, reconcile.Options{AmbiguitySLA: time.Nanosecond}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV02, reconcile.CheckAmbiguousOverSLA, map[string]any{"payout_id": p.ID})
}

func TestForwardedSubmissionsMoreThanOne(t *testing.T) {
	e := spendSlowRail(t)
	acc := e.newAccount(t, 10_000)
	p := e.payOut(t, e.newPayout(t, acc, 100))
	// Remove the primary (the partial unique index) and forward again.
	e.exec(t, "proxydb", false, `DROP INDEX rail_submission_one_forwarded_per_payout`)
	e.exec(t, "proxydb", true, `INSERT INTO rail_submission (payout_id, account_id, fence_token, holder, client_ref, amount, currency, beneficiary_ref, outcome, outcome_at)
		SELECT payout_id, account_id, fence_token, holder, client_ref, amount, currency, beneficiary_ref, 'TIMEOUT', now() FROM rail_submission WHERE payout_id = $1`, p.ID)
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV02, reconcile.CheckForwardedSubmissions, map[string]any{"payout_id": p.ID})
}

func TestInFlightPerAccount(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	a, b := e.newPayout(t, acc, 10), e.newPayout(t, acc, 20)
	// a was claimed under token 900; b afterwards under the older 800: an
	// older holder worked the account after a newer one.
	e.exec(t, "paydb", false, `UPDATE payout SET state = 'CLAIMED', claimed_at = now() WHERE id IN ($1, $2)`, a.ID, b.ID)
	e.exec(t, "paydb", false, `INSERT INTO payout_event (payout_id, from_state, to_state, token, holder, actor) VALUES
		($1, 'PENDING', 'CLAIMED', 900, 'h-new', 'planted')`, a.ID)
	e.exec(t, "paydb", false, `INSERT INTO payout_event (payout_id, from_state, to_state, token, holder, actor) VALUES
		($1, 'PENDING', 'CLAIMED', 800, 'h-old', 'planted')`, b.ID)
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	f := mustFind(t, rep, reconcile.INV01, reconcile.CheckInFlightPerAccount,
		map[string]any{"account_id": acc, "payout_id": b.ID, "token": 800, "previous_payout_id": a.ID, "previous_token": 900})
	if !strings.Contains(f.Evidence, a.ID) || !strings.Contains(f.Evidence, b.ID) {
		t.Fatalf("evidence does not name both payouts: %s", f.Evidence)
	}
}

// TestInFlightBatchUnderOneGrantIsNoFinding: an executor claims and
// submits a page of one account's payouts under one grant, and a later
// grant carries on from where an expired one stopped; neither is two
// holders at once (the check flagged any two payouts of an account in
// flight, and paged on every pass that met a batch).
func TestInFlightBatchUnderOneGrantIsNoFinding(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	ctx := ctxT(t)
	g1 := e.grant(t, acc)
	var ps []pc.Payout
	for i := range 3 {
		p := e.newPayout(t, acc, int64(10+i))
		if _, err := e.pay.Claim(ctx, p.ID, g1.Token, g1.Holder()); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	e.release(t, g1)
	// The next grant moves the first payout on and claims another.
	g2 := e.grant(t, acc)
	if _, err := e.pay.Submitting(ctx, ps[0].ID, g2.Token, g2.Holder()); err != nil {
		t.Fatal(err)
	}
	p := e.newPayout(t, acc, 40)
	if _, err := e.pay.Claim(ctx, p.ID, g2.Token, g2.Holder()); err != nil {
		t.Fatal(err)
	}
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	mustNotFind(t, rep, reconcile.CheckInFlightPerAccount, map[string]any{"account_id": acc})
	e.release(t, g2)
}

func TestClaimTokenOrder(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.newPayout(t, acc, 10)
	e.exec(t, "paydb", false, `INSERT INTO payout_event (payout_id, from_state, to_state, token, holder, actor) VALUES
		($1, 'PENDING', 'CLAIMED', 900, 'h-new', 'planted'), ($1, 'CLAIMED', 'CLAIMED', 800, 'h-old', 'planted')`, p.ID)
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV01, reconcile.CheckClaimTokenOrder, map[string]any{"payout_id": p.ID, "token": 800, "previous_token": 900})
}

func TestRailDuplicatePayment(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.payOut(t, e.newPayout(t, acc, 250))
	// Pay the same client reference again at the rail, around the system.
	if _, err := e.railPay.Pay(ctxT(t), railclient.PaymentRequest{ClientRef: p.ClientRef, Amount: p.Amount, Currency: p.Currency, BeneficiaryRef: p.BeneficiaryRef}); err != nil {
		t.Fatal(err)
	}
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV02, reconcile.CheckSettledPerClientRef, map[string]any{"payout_id": p.ID})
}

// TestRailDuplicatePaymentPerPayout: without the settlement report (flat
// memory for a long history) the duplicate is still found, by asking the
// rail about the payout's reference, and the report says what was skipped.
func TestRailDuplicatePaymentPerPayout(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.payOut(t, e.newPayout(t, acc, 260))
	if _, err := e.railPay.Pay(ctxT(t), railclient.PaymentRequest{ClientRef: p.ClientRef, Amount: p.Amount, Currency: p.Currency, BeneficiaryRef: p.BeneficiaryRef}); err != nil {
		t.Fatal(err)
	}
	rep := pass(t, e.reconciler(t, reconcile.Options{RailPerPayout: true}, ""))
	mustFind(t, rep, reconcile.INV02, reconcile.CheckSettledPerClientRef, map[string]any{"payout_id": p.ID})
	if rep.Scanned.RailPayments != 0 || len(rep.Notes) == 0 || !strings.Contains(strings.Join(rep.Notes, "\n"), "per payout") {
		t.Fatalf("per-payout pass read the settlement report or did not say so: scanned %d rail payments, notes %v", rep.Scanned.RailPayments, rep.Notes)
	}
}

func TestRailPaymentWithoutSubmission(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.newPayout(t, acc, 75)
	ctx := ctxT(t)
	// A known payout's reference, a wrong amount, never submitted...
	if _, err := e.railPay.Pay(ctx, railclient.PaymentRequest{ClientRef: p.ClientRef, Amount: p.Amount + 1, Currency: p.Currency, BeneficiaryRef: p.BeneficiaryRef}); err != nil {
		t.Fatal(err)
	}
	// ... and a reference that belongs to no payout at all.
	orphan := pc.ClientRef(uniq("ghost"))
	if _, err := e.railPay.Pay(ctx, railclient.PaymentRequest{ClientRef: orphan, Amount: 5, Currency: "EUR", BeneficiaryRef: "BEN-x"}); err != nil {
		t.Fatal(err)
	}
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV02, reconcile.CheckRailWithoutSubmission, map[string]any{"payout_id": p.ID})
	mustFind(t, rep, reconcile.INV02, reconcile.CheckRailWithoutSubmission, map[string]any{"client_ref": orphan})
	mustFind(t, rep, reconcile.INV03, reconcile.CheckSettledNotPosted, map[string]any{"payout_id": p.ID, "state": "PENDING"})
	mustFind(t, rep, reconcile.INV03, reconcile.CheckAmountMismatch, map[string]any{"payout_id": p.ID, "rail_amount": p.Amount + 1})

	// Without the settlement report the known payout is still caught.
	rep = pass(t, e.reconciler(t, reconcile.Options{}, ""))
	mustFind(t, rep, reconcile.INV02, reconcile.CheckRailWithoutSubmission, map[string]any{"payout_id": p.ID})
}

func TestDuplicateAttemptEvent(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.payOut(t, e.newPayout(t, acc, 40))
	g := e.grant(t, acc)
	defer e.release(t, g)
	_, err := e.proxy.Submit(ctxT(t), proxyclient.Submission{PayoutID: p.ID, AccountID: acc, ClientRef: p.ClientRef, Amount: p.Amount,
		Currency: p.Currency, BeneficiaryRef: p.BeneficiaryRef}, g.Token, g.Holder())
	if !problem.Has(err, problem.SubmissionExists) {
		t.Fatalf("second submission: %v, want submission_exists", err)
	}
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV02, reconcile.CheckDuplicateAttempt, map[string]any{"payout_id": p.ID, "guard": "proxy"})
}

func TestLedgerGroupAndBalance(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	group := uniq("planted-group")
	// One leg only: the group cannot sum to zero, and the balance no
	// longer equals the entries (the deferred trigger is off as replica).
	e.exec(t, "paydb", true, `INSERT INTO ledger_entry (group_id, account_id, amount, counterparty_account_id) VALUES ($1, $2, 7, 'funding')`, group, acc)
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV03, reconcile.CheckLedgerGroupSum, map[string]any{"group_id": group, "sum": 7})
	mustFind(t, rep, reconcile.INV03, reconcile.CheckBalanceDrift, map[string]any{"account_id": acc, "drift": -7})

	acc2 := e.newAccount(t, 500)
	e.exec(t, "paydb", false, `UPDATE account SET balance = balance + 100 WHERE id = $1`, acc2)
	rep = pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV03, reconcile.CheckBalanceDrift, map[string]any{"account_id": acc2, "balance": 600, "ledger_sum": 500})
}

func TestPostedNotSettledAndFailedButSettled(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	posted := e.newPayout(t, acc, 60)
	e.exec(t, "paydb", false, `UPDATE payout SET state = 'POSTED' WHERE id = $1`, posted.ID)
	failed := e.newPayout(t, acc, 70)
	if _, err := e.railPay.Pay(ctxT(t), railclient.PaymentRequest{ClientRef: failed.ClientRef, Amount: failed.Amount, Currency: failed.Currency, BeneficiaryRef: failed.BeneficiaryRef}); err != nil {
		t.Fatal(err)
	}
	e.exec(t, "paydb", false, `UPDATE payout SET state = 'FAILED', failure_reason = 'planted' WHERE id = $1`, failed.ID)
	// RAIL_ACKED says money has left (the executor posts it next): with no
	// acknowledged submission at the proxy it is reported before it is posted.
	acked := e.newPayout(t, acc, 80)
	e.exec(t, "paydb", false, `UPDATE payout SET state = 'RAIL_ACKED' WHERE id = $1`, acked.ID)
	paid := e.payOut(t, e.newPayout(t, acc, 90))
	e.exec(t, "paydb", false, `UPDATE payout SET state = 'RAIL_ACKED' WHERE id = $1`, paid.ID)
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV03, reconcile.CheckPostedNotSettled, map[string]any{"payout_id": posted.ID})
	mustFind(t, rep, reconcile.INV03, reconcile.CheckSubmissionStateMismatch, map[string]any{"payout_id": posted.ID})
	mustFind(t, rep, reconcile.INV03, reconcile.CheckSubmissionStateMismatch, map[string]any{"payout_id": acked.ID, "state": "RAIL_ACKED"})
	mustNotFind(t, rep, reconcile.CheckSubmissionStateMismatch, map[string]any{"payout_id": paid.ID})
	mustFind(t, rep, reconcile.INV03, reconcile.CheckSettledNotPosted, map[string]any{"payout_id": failed.ID, "state": "FAILED"})
}

func TestAmbiguousWithoutSubmission(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.newPayout(t, acc, 10)
	e.exec(t, "paydb", false, `UPDATE payout SET state = 'RAIL_AMBIGUOUS', submitted_at = now() - interval '1 hour' WHERE id = $1`, p.ID)
	rep := pass(t, e.reconciler(t, reconcile.Options{Resolve: true}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV02, reconcile.CheckAmbiguousNoSubmission, map[string]any{"payout_id": p.ID})
	got, err := e.pay.Payout(ctxT(t), p.ID)
	if err != nil || got.State != pc.RailAmbiguous {
		t.Fatalf("payout %s: %v %s: resolved without evidence", p.ID, err, got.State)
	}
}

func TestHighWaterAboveFence(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	e.payOut(t, e.newPayout(t, acc, 10))
	// As if paydb had been restored from a backup older than the proxy.
	e.exec(t, "proxydb", false, `UPDATE account_high_water SET token = token + 5 WHERE account_id = $1`, acc)
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV04, reconcile.CheckHighWaterAboveFence, map[string]any{"account_id": acc})
}

// TestHighWaterOfAResubmissionIsNotARestore: a later holder that finds a
// payout RAIL_SUBMITTED and never forwarded submits it at once (D-4), so
// the proxy sees its token before paydb does (with the outcome). That is
// the design, not a paydb restored from an older backup.
func TestHighWaterOfAResubmissionIsNotARestore(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.newPayout(t, acc, 10)
	ctx := ctxT(t)
	first := e.grant(t, acc)
	if _, err := e.pay.Claim(ctx, p.ID, first.Token, first.Holder()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pay.Submitting(ctx, p.ID, first.Token, first.Holder()); err != nil {
		t.Fatal(err)
	}
	e.release(t, first) // the holder is gone before it forwarded the payout
	later := e.grant(t, acc)
	defer e.release(t, later)
	if _, err := e.proxy.Submit(ctx, proxyclient.Submission{PayoutID: p.ID, AccountID: acc, ClientRef: p.ClientRef,
		Amount: p.Amount, Currency: p.Currency, BeneficiaryRef: p.BeneficiaryRef}, later.Token, later.Holder()); err != nil {
		t.Fatal(err)
	}
	// The later holder has not reported the outcome yet: paydb's fence is
	// still the first holder's.
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	mustNotFind(t, rep, reconcile.CheckHighWaterAboveFence, map[string]any{"account_id": acc})
}

func TestFencedOutAndTokenRegressionEvents(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	done := e.payOut(t, e.newPayout(t, acc, 10))
	stale := done.Token
	p := e.newPayout(t, acc, 10)
	g := e.grant(t, acc)
	ctx := ctxT(t)
	// A newer holder claims; the old token comes back at both guards.
	if _, err := e.pay.Claim(ctx, p.ID, g.Token, g.Holder()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pay.Claim(ctx, p.ID, stale, "stale-holder"); !problem.Has(err, problem.FencedOut) {
		t.Fatalf("stale claim: %v, want fenced_out", err)
	}
	if _, err := e.pay.Submitting(ctx, p.ID, g.Token, g.Holder()); err != nil {
		t.Fatal(err)
	}
	sub := proxyclient.Submission{PayoutID: p.ID, AccountID: acc, ClientRef: p.ClientRef, Amount: p.Amount, Currency: p.Currency, BeneficiaryRef: p.BeneficiaryRef}
	if _, err := e.proxy.Submit(ctx, sub, g.Token, g.Holder()); err != nil {
		t.Fatal(err)
	}
	// The same token from another holder: a re-issued token.
	if _, err := e.pay.Claim(ctx, p.ID, g.Token, "impostor"); !problem.Has(err, problem.FencedOut) {
		t.Fatalf("impostor claim: %v, want fenced_out", err)
	}
	e.release(t, g)
	other := e.newPayout(t, acc, 10)
	sub2 := proxyclient.Submission{PayoutID: other.ID, AccountID: acc, ClientRef: other.ClientRef, Amount: other.Amount, Currency: other.Currency, BeneficiaryRef: other.BeneficiaryRef}
	if _, err := e.proxy.Submit(ctx, sub2, stale, "stale-holder"); !problem.Has(err, problem.FencedOut) {
		t.Fatalf("stale submit: %v, want fenced_out", err)
	}
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	key := fencing.Key(acc)
	mustFind(t, rep, reconcile.INV05, reconcile.CheckFencedOut, map[string]any{"guard": "payment", "key": key, "presented_token": stale})
	mustFind(t, rep, reconcile.INV05, reconcile.CheckFencedOut, map[string]any{"guard": "proxy", "key": key, "presented_token": stale})
	mustFind(t, rep, reconcile.INV04, reconcile.CheckTokenRegression, map[string]any{"guard": "payment", "key": key, "holder": "impostor"})
}

func TestRejectedTransitionEvent(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.payOut(t, e.newPayout(t, acc, 10))
	g := e.grant(t, acc)
	defer e.release(t, g)
	if _, err := e.pay.Claim(ctxT(t), p.ID, g.Token, g.Holder()); !problem.Has(err, problem.InvalidTransition) {
		t.Fatalf("claim of a POSTED payout: %v, want invalid_transition", err)
	}
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV08, reconcile.CheckRejectedTransition, map[string]any{"payout_id": p.ID})
}

// TestTerminalStateLeft: a change out of a final state in a payout's
// history is finished work executed again that the transition table let
// through (INV-08; forged here as a table without its refusal would have
// written it). It is reported, with the change as evidence; a payout
// whose history only ever went forward is not.
func TestTerminalStateLeft(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.payOut(t, e.newPayout(t, acc, 10))
	clean := e.payOut(t, e.newPayout(t, acc, 10))
	e.exec(t, "paydb", true, `INSERT INTO payout_event (payout_id, from_state, to_state, token, holder, actor, reason)
		VALUES ($1, 'POSTED', 'ABANDONED', $2, 'replayer', 'cleanup-job', 'nightly cleanup')`, p.ID, int64(p.Token))
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV08, reconcile.CheckTerminalLeft, map[string]any{"payout_id": p.ID, "account_id": acc,
		"from_state": "POSTED", "to_state": "ABANDONED", "actor": "cleanup-job", "reason": "nightly cleanup"})
	mustNotFind(t, rep, reconcile.CheckTerminalLeft, map[string]any{"payout_id": clean.ID})
}

// TestStateNotInHistory: a payout's state written by hand (an UPDATE of
// payout with no event, which even the serving role may do) is not where
// its history ends: a POSTED payout put back to PENDING (an executor would
// pay it again) or to RAIL_ACKED (posted again); once the payment resource
// has moved such a payout on, its history jumps (a change that starts from
// a state the one before it did not end in). Each is reported (INV-08); a
// payout whose history explains its state, posted or never worked, is not,
// and terminal_state_left, which reads recorded changes, has nothing to
// say.
func TestStateNotInHistory(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	repaid := e.payOut(t, e.newPayout(t, acc, 10))
	reposted := e.payOut(t, e.newPayout(t, acc, 10))
	posted := e.payOut(t, e.newPayout(t, acc, 10))
	waiting := e.newPayout(t, acc, 10)
	e.exec(t, "paydb", false, `UPDATE payout SET state = 'PENDING' WHERE id = $1`, repaid.ID)
	e.exec(t, "paydb", false, `UPDATE payout SET state = 'RAIL_ACKED' WHERE id = $1`, reposted.ID)
	// Put back by hand, then moved on by the payment resource (claimed
	// again): its state is where its history ends, but the history jumps.
	reclaimed := e.payOut(t, e.newPayout(t, acc, 10))
	e.exec(t, "paydb", false, `UPDATE payout SET state = 'PENDING' WHERE id = $1`, reclaimed.ID)
	g := e.grant(t, acc)
	if _, err := e.pay.Claim(ctxT(t), reclaimed.ID, g.Token, g.Holder()); err != nil {
		t.Fatalf("claim the payout put back to PENDING: %v", err)
	}
	e.release(t, g)
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	f := mustFind(t, rep, reconcile.INV08, reconcile.CheckStateNotInHistory, map[string]any{"payout_id": reclaimed.ID,
		"state": "CLAIMED", "history_state": "CLAIMED", "from_state": "PENDING", "previous_to_state": "POSTED"})
	if id, _ := f.Objects["event_id"].(int64); id == 0 {
		t.Errorf("the finding for a history that jumps names no event: %v", f.Objects)
	}
	mustFind(t, rep, reconcile.INV08, reconcile.CheckStateNotInHistory, map[string]any{"payout_id": repaid.ID, "account_id": acc,
		"state": "PENDING", "history_state": "POSTED"})
	mustFind(t, rep, reconcile.INV08, reconcile.CheckStateNotInHistory, map[string]any{"payout_id": reposted.ID,
		"state": "RAIL_ACKED", "history_state": "POSTED"})
	for _, id := range []string{posted.ID, waiting.ID} {
		mustNotFind(t, rep, reconcile.CheckStateNotInHistory, map[string]any{"payout_id": id})
	}
	mustNotFind(t, rep, reconcile.CheckTerminalLeft, map[string]any{"payout_id": repaid.ID})
}

func TestWritesWithoutGrant(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.newPayout(t, acc, 10)
	const never = 4_000_000_000_000 // far above anything the lock service issued
	e.exec(t, "proxydb", false, `INSERT INTO rail_submission (payout_id, account_id, fence_token, holder, client_ref, amount, currency, beneficiary_ref)
		VALUES ($1, $2, $3, 'nobody', $4, $5, 'EUR', 'BEN-x')`, p.ID, acc, never, p.ClientRef, p.Amount)
	group := uniq("nogrant")
	e.exec(t, "paydb", false, `INSERT INTO ledger_entry (group_id, account_id, amount, counterparty_account_id, payout_id, token) VALUES
		($1, $2, -10, 'payout-clearing', $3, $4), ($1, 'payout-clearing', 10, $2, $3, $4)`, group, acc, p.ID, never)
	// Written now, well inside the grant retention: checked.
	rep := pass(t, e.reconciler(t, reconcile.Options{GrantRetention: 7 * 24 * time.Hour}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV07, reconcile.CheckSubmissionWithoutGrant, map[string]any{"payout_id": p.ID, "token": never})
	mustFind(t, rep, reconcile.INV07, reconcile.CheckLedgerWithoutGrant, map[string]any{"payout_id": p.ID, "account_id": acc, "token": never})
	mustFind(t, rep, reconcile.INV07, reconcile.CheckLedgerWithoutGrant, map[string]any{"payout_id": p.ID, "account_id": "payout-clearing", "token": never})
}

// TestWritesBeyondTheGrantRetentionAreNotChecked: the lock service
// compacts ended grants after its retention, so a write older than that
// may have lost its grant's record. Such a write is not reported as
// without a grant (a healthy system a week old would page on every payout
// it ever made); it is counted in a note. Without a retention the same
// writes are findings, as in TestWritesWithoutGrant.
func TestWritesBeyondTheGrantRetentionAreNotChecked(t *testing.T) {
	checkUngrantedWrites(t, 4_100_000_000_000, 8*24*time.Hour,
		reconcile.Options{GrantRetention: 7 * 24 * time.Hour}, reconcile.Options{}, "written before")
}

// checkUngrantedWrites plants a submission and a ledger group of a new
// payout under token (far above anything the lock service issued, so the
// grant log has no grant of it), made age ago (the payout became
// RAIL_SUBMITTED then too). A pass with skip reports
// neither and counts them in a note containing note; a pass with report
// finds both.
func checkUngrantedWrites(t *testing.T, token int64, age time.Duration, skip, report reconcile.Options, note string) {
	t.Helper()
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.newPayout(t, acc, 10)
	e.exec(t, "paydb", true, `UPDATE payout SET submitted_at = now() - $2::interval WHERE id = $1`, p.ID, age)
	e.exec(t, "proxydb", false, `INSERT INTO rail_submission (payout_id, account_id, fence_token, holder, client_ref, amount, currency, beneficiary_ref, created_at)
		VALUES ($1, $2, $3, 'ungranted', $4, $5, 'EUR', 'BEN-x', now() - $6::interval)`, p.ID, acc, token, p.ClientRef, p.Amount, age)
	group := uniq("ungranted")
	e.exec(t, "paydb", false, `INSERT INTO ledger_entry (group_id, account_id, amount, counterparty_account_id, payout_id, token, created_at) VALUES
		($1, $2, -10, 'payout-clearing', $3, $4, now() - $5::interval), ($1, 'payout-clearing', 10, $2, $3, $4, now() - $5::interval)`, group, acc, p.ID, token, age)

	rep := pass(t, e.reconciler(t, skip, e.st.Ready.Tokens.Operator))
	mustNotFind(t, rep, reconcile.CheckSubmissionWithoutGrant, map[string]any{"payout_id": p.ID})
	mustNotFind(t, rep, reconcile.CheckLedgerWithoutGrant, map[string]any{"payout_id": p.ID})
	noted := false
	for _, n := range rep.Notes {
		noted = noted || strings.Contains(n, "not checked against the grant log") && strings.Contains(n, note)
	}
	if !noted {
		t.Errorf("no note of the writes left unchecked (%q); notes: %q", note, rep.Notes)
	}

	rep = pass(t, e.reconciler(t, report, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV07, reconcile.CheckSubmissionWithoutGrant, map[string]any{"payout_id": p.ID, "token": token})
	mustFind(t, rep, reconcile.INV07, reconcile.CheckLedgerWithoutGrant, map[string]any{"payout_id": p.ID, "account_id": acc, "token": token})
}

// TestSubmissionOfAPayoutPaydbDoesNotHold: the proxy forwarded a payout
// that paydb does not hold (lost by a restore, or sent around paydb):
// nothing accounts for what the rail may have paid for it. It is reported,
// and its submission checked against the grant log as any other.
func TestSubmissionOfAPayoutPaydbDoesNotHold(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	ghost := uniq("ghost")
	const never = 4_200_000_000_000 // far above anything the lock service issued
	e.exec(t, "proxydb", false, `INSERT INTO rail_submission (payout_id, account_id, fence_token, holder, client_ref, amount, currency, beneficiary_ref, outcome, outcome_at, rail_ref)
		VALUES ($1, $2, $3, 'nobody', $4, 10, 'EUR', 'BEN-x', 'ACKED', now(), 'r-ghost')`, ghost, acc, never, pc.ClientRefPrefix+ghost)
	rep := pass(t, e.reconciler(t, reconcile.Options{RailPerPayout: true}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV03, reconcile.CheckSubmissionStateMismatch, map[string]any{"payout_id": ghost, "token": never})
	mustFind(t, rep, reconcile.INV07, reconcile.CheckSubmissionWithoutGrant, map[string]any{"payout_id": ghost, "token": never})
}

// TestSubmissionUnderAnotherSessionsToken: a token the lock service granted
// for the right key, but to a different session than the submission's
// holder (a token issued twice), is flagged.
func TestSubmissionUnderAnotherSessionsToken(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.newPayout(t, acc, 10)
	g := e.grant(t, acc)
	e.release(t, g)
	e.exec(t, "proxydb", false, `INSERT INTO rail_submission (payout_id, account_id, fence_token, holder, client_ref, amount, currency, beneficiary_ref)
		VALUES ($1, $2, $3, 'impostor-session', $4, $5, 'EUR', 'BEN-x')`, p.ID, acc, int64(g.Token), p.ClientRef, p.Amount)
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV07, reconcile.CheckSubmissionWithoutGrant, map[string]any{"payout_id": p.ID, "holder": "impostor-session", "granted_session": g.SessionID})
}

// TestSubmissionUnderAnotherAccountsGrant: a submission of payout X (paydb:
// account A) forwarded with account B and a grant of B's key passed the
// proxy's guard for B, not A's: the grant is checked against the key of the
// payout's own account. Before, it was checked against the submission's
// account and passed.
func TestSubmissionUnderAnotherAccountsGrant(t *testing.T) {
	e := setup(t)
	accA, accB := e.newAccount(t, 10_000), e.newAccount(t, 10_000)
	p := e.newPayout(t, accA, 10)
	g := e.grant(t, accB)
	e.release(t, g)
	e.exec(t, "proxydb", false, `INSERT INTO rail_submission (payout_id, account_id, fence_token, holder, client_ref, amount, currency, beneficiary_ref)
		VALUES ($1, $2, $3, $4, $5, $6, 'EUR', 'BEN-x')`, p.ID, accB, int64(g.Token), g.SessionID, p.ClientRef, p.Amount)
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV07, reconcile.CheckSubmissionWithoutGrant, map[string]any{"payout_id": p.ID, "key": fencing.Key(accA), "account_id": accB})
}

// TestLedgerTokenOrder: a posting on an account under a token lower than an
// earlier posting's was written below the fence the account had stored
// (INV-05: the guard let a stale holder through). It is reported from the
// ledger, after both payouts have left flight; postings in token order are
// not.
func TestLedgerTokenOrder(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	first := e.payOut(t, e.newPayout(t, acc, 10))
	second := e.payOut(t, e.newPayout(t, acc, 10))
	stale := e.newPayout(t, acc, 10)
	// The stale holder's posting, as a guard without its fence condition
	// would have let it commit: after second's, under first's token.
	e.exec(t, "paydb", true, `INSERT INTO ledger_entry (group_id, account_id, amount, counterparty_account_id, payout_id, token)
		VALUES ('post:' || $1, $2, -10, $3, $1, $4), ('post:' || $1, $3, 10, $2, $1, $4)`, stale.ID, acc, pc.ClearingAccount, int64(first.Token))
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	f := mustFind(t, rep, reconcile.INV05, reconcile.CheckLedgerTokenOrder, map[string]any{"payout_id": stale.ID, "account_id": acc,
		"token": first.Token, "previous_payout_id": second.ID, "previous_token": second.Token})
	if len(find(rep, reconcile.CheckLedgerTokenOrder, map[string]any{"account_id": acc})) != 1 {
		t.Fatalf("the stale posting reported more than once (one per leg?): %+v", f)
	}
	mustNotFind(t, rep, reconcile.CheckLedgerTokenOrder, map[string]any{"payout_id": second.ID})
}

// TestSubmissionTokenOrder: a submission forwarded for an account under a
// token lower than an earlier forwarded submission's passed the proxy
// below its high-water mark (INV-05, guard 2): reported from the proxy's
// own order, whatever paydb holds. Submissions in token order are not.
func TestSubmissionTokenOrder(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	first := e.payOut(t, e.newPayout(t, acc, 10))
	second := e.payOut(t, e.newPayout(t, acc, 10))
	stale := e.newPayout(t, acc, 10)
	// The stale holder's submission, as a guard 2 without its fence
	// condition would have forwarded it: after second's, under first's token.
	e.exec(t, "proxydb", true, `INSERT INTO rail_submission (payout_id, account_id, fence_token, holder, client_ref, amount, currency, beneficiary_ref, outcome, rail_ref, outcome_at)
		VALUES ($1, $2, $3, 'stale-holder', $4, 10, $5, 'BEN', 'ACKED', 'forged', now())`, stale.ID, acc, int64(first.Token), stale.ClientRef, stale.Currency)
	rep := pass(t, e.reconciler(t, reconcile.Options{BulkPageSize: 2}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV05, reconcile.CheckSubmissionTokenOrder, map[string]any{"payout_id": stale.ID, "account_id": acc,
		"token": first.Token, "previous_payout_id": second.ID, "previous_token": second.Token})
	if n := len(find(rep, reconcile.CheckSubmissionTokenOrder, map[string]any{"account_id": acc})); n != 1 {
		t.Fatalf("%d submission_token_order findings for the account, want 1", n)
	}
}

// TestZLockServiceRewound leaves a fence far above anything the lock
// service has issued (on an account of its own), so every later pass on the
// shared stack reports it too.
func TestZLockServiceRewound(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	const restored = 3_000_000_000_000
	e.exec(t, "paydb", false, `UPDATE account SET fence_token = $2, fence_holder = 'from-the-future' WHERE id = $1`, acc, restored)
	below := e.newAccount(t, 10_000)
	e.payOut(t, e.newPayout(t, below, 10))
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	f := mustFind(t, rep, reconcile.INV04, reconcile.CheckLockRewound, map[string]any{"highest_fence": restored, "accounts_above_count": 1})
	// The account that stalls until the bump is named; one the lock
	// service's tokens are above is not.
	if above, _ := f.Objects["accounts_above"].([]string); !slices.Equal(above, []string{acc}) {
		t.Errorf("accounts_above %v, want [%s] (not %s)", f.Objects["accounts_above"], acc, below)
	}
	if rep.HighestFence != restored || rep.PayDBFence != restored || rep.LockHighToken >= restored {
		t.Fatalf("fences: highest %d paydb %d lock %d", rep.HighestFence, rep.PayDBFence, rep.LockHighToken)
	}
}

// TestWritesUnderTokensARestoreLostAreNotChecked: after a restore of the
// lock service, its grant log no longer holds the grants issued between the
// backup and the restore. With --grant-log-lost-through (the token it was
// bumped to), writes under tokens at or below it are counted in a note,
// not reported for ever; one above it is reported as always.
func TestWritesUnderTokensARestoreLostAreNotChecked(t *testing.T) {
	const lost = 4_300_000_000_000
	checkUngrantedWrites(t, lost, 0, reconcile.Options{GrantLogLostThrough: lost}, reconcile.Options{GrantLogLostThrough: lost - 1}, "--grant-log-lost-through")
}
