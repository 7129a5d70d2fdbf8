package negativecontrol

import (
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// TestNegativeControls runs one scenario per invariant on one stack, in a
// fixed order: the scenarios that remove a primary from the whole stack's
// database for good (INV-02's index, INV-04's token sequence) come last.
func TestNegativeControls(t *testing.T) {
	if testing.Short() {
		t.Skip("whole-system test")
	}
	s := startSys(t)
	t.Logf("primaries removed: %v", primariesRemoved)
	for _, sc := range []struct {
		name string
		fn   func(*testing.T, *sys)
	}{
		{"INV-01", inv01},
		{"INV-03", inv03},
		{"INV-05", inv05},
		{"INV-05-proxy", inv05Proxy},
		{"INV-07", inv07},
		{"INV-08", inv08},
		{"INV-02", inv02},
		{"INV-04", inv04},
	} {
		if !t.Run(sc.name, func(t *testing.T) { sc.fn(t, s) }) {
			return
		}
	}
}

func isFenced(err error) bool { return problem.Has(err, problem.FencedOut) }

// INV-01, at most one worker mutates a payout. Primary: guard 1's fence
// (negativecontrol: compiled out). A claims, loses its grant; B takes over
// and moves the payout on; A, stale, writes the outcome. Detective: the
// reconciler's claim_token_order.
func inv01(t *testing.T, s *sys) {
	ctx := ctxT(t)
	acc := s.account(t, 10_000)
	p := s.payout(t, acc, 100)
	ga := s.grant(t, s.a, acc)
	if _, err := s.pay.Claim(ctx, p.ID, ga.Token, ga.Holder()); err != nil {
		t.Fatal(err)
	}
	s.release(t, s.a, ga) // A's grant is gone; A does not know yet
	gb := s.grant(t, s.b, acc)
	defer s.release(t, s.b, gb)
	if _, err := s.pay.Submitting(ctx, p.ID, gb.Token, gb.Holder()); err != nil {
		t.Fatal(err)
	}
	_, err := s.pay.ReportOutcome(ctx, p.ID, ga.Token, ga.Holder(), pc.OutcomeTimeout, "", "stale")
	rep := s.reconcile(t)
	got := s.get(t, p.ID)
	if primariesRemoved {
		if err != nil || got.State != pc.RailAmbiguous || got.Token != ga.Token {
			t.Fatalf("guard 1 removed: the stale write should land; err %v, payout %s token %d", err, got.State, got.Token)
		}
		fired(t, rep, "INV-01", "claim_token_order", map[string]any{"payout_id": p.ID, "token": ga.Token, "previous_token": gb.Token})
		return
	}
	if !isFenced(err) || got.State != pc.RailSubmitted || got.Token != gb.Token {
		t.Fatalf("guard 1 in place: want fenced_out and nothing changed; err %v, payout %s token %d", err, got.State, got.Token)
	}
	silent(t, rep, "claim_token_order", map[string]any{"payout_id": p.ID})
	fired(t, rep, "INV-05", "fenced_out", map[string]any{"payout_id": p.ID, "guard": "payment", "presented_token": ga.Token})
}

// INV-03, the ledger balances. Primary: both legs in one transaction,
// checked at commit by the deferred constraint trigger
// ledger_entry_group_sums_to_zero (negativecontrol: disabled in the test's
// paydb). A writer posts one leg only. Detectives: the payment resource's
// continuous check (payouts_payment_ledger_unbalanced_groups) and the
// reconciler's ledger_group_sum and balance_drift.
func inv03(t *testing.T, s *sys) {
	acc := s.account(t, 10_000)
	group := "one-leg:" + acc
	if primariesRemoved {
		if err := s.exec(t, "paydb", false, `ALTER TABLE ledger_entry DISABLE TRIGGER ledger_entry_group_sums_to_zero`); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := s.exec(t, "paydb", false, `ALTER TABLE ledger_entry ENABLE TRIGGER ledger_entry_group_sums_to_zero`); err != nil {
				t.Error(err)
			}
		})
	}
	err := s.exec(t, "paydb", false, `INSERT INTO ledger_entry (group_id, account_id, amount, counterparty_account_id) VALUES ($1, $2, 500, $3)`,
		group, acc, pc.FundingAccount)
	if !primariesRemoved {
		if err == nil || !strings.Contains(err.Error(), "ledger_entry_group_sums_to_zero") && !strings.Contains(err.Error(), "does not sum to zero") {
			t.Fatalf("zero-sum trigger in place: a one-legged group must be refused at commit, got %v", err)
		}
		rep := s.reconcile(t)
		silent(t, rep, "ledger_group_sum", map[string]any{"group_id": group})
		silent(t, rep, "balance_drift", map[string]any{"account_id": acc})
		if a, err := s.pay.Account(ctxT(t), acc); err != nil || a.Balance != 10_000 {
			t.Fatalf("account after the refused leg: %+v %v", a, err)
		}
		return
	}
	if err != nil {
		t.Fatalf("zero-sum trigger disabled: the one-legged group should land: %v", err)
	}
	waitUntil(t, time.Minute, "the payment resource's ledger check reports the unbalanced group", func() (bool, error) {
		return metric(t, s.st.Ready.PaymentURL, "payouts_payment_ledger_unbalanced_groups") >= 1 &&
			metric(t, s.st.Ready.PaymentURL, "payouts_payment_ledger_drift_accounts") >= 1, nil
	})
	rep := s.reconcile(t)
	fired(t, rep, "INV-03", "ledger_group_sum", map[string]any{"group_id": group, "sum": 500})
	fired(t, rep, "INV-03", "balance_drift", map[string]any{"account_id": acc, "balance": 10_000, "drift": -500})
}

// INV-05, no write below the stored fence (UC-03 at both guards). Primary:
// the fence condition of guard 1 and guard 2 (negativecontrol: compiled
// out of both). A marks the payout RAIL_SUBMITTED and stalls; B takes it
// over (D-4), submits it and records the acknowledgement; A resumes and
// submits, then reports its outcome, with its stale token. With the guards,
// both writes are fenced out and the fenced_out detective fires at each.
// Without them the stale writes pass both fences: the proxy's is still
// stopped by INV-02's index (duplicate_attempt), paydb's lands and the
// reconciler's claim_token_order fires.
func inv05(t *testing.T, s *sys) {
	ctx := ctxT(t)
	acc := s.account(t, 10_000)
	p := s.payout(t, acc, 100)
	ga := s.grant(t, s.a, acc)
	if _, err := s.pay.Claim(ctx, p.ID, ga.Token, ga.Holder()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pay.Submitting(ctx, p.ID, ga.Token, ga.Holder()); err != nil {
		t.Fatal(err)
	}
	s.release(t, s.a, ga) // A stalls past its grant
	gb := s.grant(t, s.b, acc)
	defer s.release(t, s.b, gb)
	if _, err := s.proxy.Get(ctx, p.ID); !problem.Has(err, problem.NotFound) {
		t.Fatalf("B asks the proxy: want not_found, got %v", err)
	}
	rec, err := s.proxy.Submit(ctx, submission(p), gb.Token, gb.Holder())
	if err != nil || rec.Outcome != proxyclient.OutcomeAcked {
		t.Fatalf("B submits: %+v %v", rec, err)
	}
	if _, err := s.pay.ReportOutcome(ctx, p.ID, gb.Token, gb.Holder(), pc.OutcomeAcked, rec.RailRef, ""); err != nil {
		t.Fatal(err)
	}
	// A resumes.
	_, proxyErr := s.proxy.Submit(ctx, submission(p), ga.Token, ga.Holder())
	_, payErr := s.pay.ReportOutcome(ctx, p.ID, ga.Token, ga.Holder(), pc.OutcomeTimeout, "", "stale")
	rep := s.reconcile(t)
	if n := len(s.railPayments(t, p.ClientRef)); n != 1 {
		t.Fatalf("rail payments for %s: %d, want 1", p.ClientRef, n)
	}
	got := s.get(t, p.ID)
	if primariesRemoved {
		if !problem.Has(proxyErr, problem.SubmissionExists) {
			t.Fatalf("guard 2 removed: the stale submission should pass the fence and meet the index, got %v", proxyErr)
		}
		if payErr != nil || got.Token != ga.Token {
			t.Fatalf("guard 1 removed: the stale outcome should land; err %v, payout %s token %d", payErr, got.State, got.Token)
		}
		fired(t, rep, "INV-01", "claim_token_order", map[string]any{"payout_id": p.ID, "token": ga.Token, "previous_token": gb.Token})
		fired(t, rep, "INV-02", "duplicate_attempt", map[string]any{"payout_id": p.ID})
		silent(t, rep, "fenced_out", map[string]any{"payout_id": p.ID})
	} else {
		if !isFenced(proxyErr) || !isFenced(payErr) {
			t.Fatalf("guards in place: want fenced_out at both; proxy %v, payment %v", proxyErr, payErr)
		}
		if got.State != pc.RailAcked || got.Token != gb.Token {
			t.Fatalf("guards in place: the payout changed: %s token %d", got.State, got.Token)
		}
		fired(t, rep, "INV-05", "fenced_out", map[string]any{"payout_id": p.ID, "guard": "payment", "presented_token": ga.Token})
		fired(t, rep, "INV-05", "fenced_out", map[string]any{"payout_id": p.ID, "guard": "proxy", "presented_token": ga.Token})
		silent(t, rep, "claim_token_order", map[string]any{"payout_id": p.ID})
		silent(t, rep, "duplicate_attempt", map[string]any{"payout_id": p.ID})
	}
	// B pays another payout of the account; A, still stale, pays one more.
	byB, byA := s.payout(t, acc, 100), s.payout(t, acc, 100)
	s.payOut(t, byB, gb.Token, gb.Holder())
	if primariesRemoved {
		// It lands below the fence, and the ledger keeps the order of the
		// two postings once both payouts have left flight.
		s.payOut(t, byA, ga.Token, ga.Holder())
		rep := s.reconcile(t)
		fired(t, rep, "INV-05", "ledger_token_order", map[string]any{"payout_id": byA.ID, "token": ga.Token,
			"previous_payout_id": byB.ID, "previous_token": gb.Token})
		fired(t, rep, "INV-05", "submission_token_order", map[string]any{"payout_id": byA.ID, "token": ga.Token,
			"previous_payout_id": byB.ID, "previous_token": gb.Token})
		return
	}
	if _, err := s.pay.Claim(ctx, byA.ID, ga.Token, ga.Holder()); !isFenced(err) {
		t.Fatalf("guards in place: A's claim of another payout: %v, want fenced_out", err)
	}
	silent(t, s.reconcile(t), "ledger_token_order", map[string]any{"account_id": acc})
}

// INV-05 at guard 2 alone, the domain model's guard for a resource that
// cannot be changed. A marks P1 RAIL_SUBMITTED and stalls before calling
// the proxy; B pays P2 of the account; A resumes and submits P1 under its
// stale token; B finds P1 RAIL_SUBMITTED and finishes it from the proxy's
// record (D-4). Guard 1 has nothing to refuse (A's write came before B's
// grant): only guard 2 stands between A and the rail. Without it A's
// submission is forwarded and paid, paydb ends as if all were well, and
// the reconciler's submission_token_order fires; with it, fenced_out at
// the proxy and B submits P1 itself. Either way the rail pays P1 once.
func inv05Proxy(t *testing.T, s *sys) {
	ctx := ctxT(t)
	acc := s.account(t, 10_000)
	p1, p2 := s.payout(t, acc, 100), s.payout(t, acc, 100)
	ga := s.grant(t, s.a, acc)
	if _, err := s.pay.Claim(ctx, p1.ID, ga.Token, ga.Holder()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pay.Submitting(ctx, p1.ID, ga.Token, ga.Holder()); err != nil {
		t.Fatal(err)
	}
	s.release(t, s.a, ga) // A stalls past its grant
	gb := s.grant(t, s.b, acc)
	defer s.release(t, s.b, gb)
	s.payOut(t, p2, gb.Token, gb.Holder())
	_, staleErr := s.proxy.Submit(ctx, submission(p1), ga.Token, ga.Holder()) // A resumes
	rec, err := s.proxy.Get(ctx, p1.ID)                                       // B asks (D-4)
	if err != nil {
		t.Fatalf("B asks the proxy about %s: %v", p1.ID, err)
	}
	if primariesRemoved {
		if staleErr != nil || rec.Outcome != proxyclient.OutcomeAcked || rec.FenceToken != ga.Token {
			t.Fatalf("guard 2 removed: A's stale submission should be forwarded and acknowledged; err %v, record %+v", staleErr, rec)
		}
	} else {
		if !isFenced(staleErr) || rec.Outcome != proxyclient.OutcomeFenced {
			t.Fatalf("guard 2 in place: want A fenced out and only a FENCED attempt; err %v, record %+v", staleErr, rec)
		}
		if rec, err = s.proxy.Submit(ctx, submission(p1), gb.Token, gb.Holder()); err != nil || rec.Outcome != proxyclient.OutcomeAcked {
			t.Fatalf("B submits: %+v %v", rec, err)
		}
	}
	if _, err := s.pay.ReportOutcome(ctx, p1.ID, gb.Token, gb.Holder(), pc.OutcomeAcked, rec.RailRef, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pay.Post(ctx, p1.ID, gb.Token, gb.Holder()); err != nil {
		t.Fatal(err)
	}
	if n := len(s.railPayments(t, p1.ClientRef)); n != 1 {
		t.Fatalf("rail payments for %s: %d, want 1", p1.ClientRef, n)
	}
	rep := s.reconcile(t)
	if primariesRemoved {
		fired(t, rep, "INV-05", "submission_token_order", map[string]any{"payout_id": p1.ID, "token": ga.Token,
			"previous_payout_id": p2.ID, "previous_token": gb.Token})
		silent(t, rep, "fenced_out", map[string]any{"payout_id": p1.ID})
		return
	}
	fired(t, rep, "INV-05", "fenced_out", map[string]any{"payout_id": p1.ID, "guard": "proxy", "presented_token": ga.Token})
	silent(t, rep, "submission_token_order", map[string]any{"account_id": acc})
}

// INV-07, no side effect without a grant. Primary: every mutating path
// takes its token from a grant and fails closed without one. Removed by the
// test bypassing the system: it pays a payout under a token the lock
// service granted for another account. Detectives: the reconciler's
// submission_without_grant and ledger_without_grant. In place: the
// operator CLI, with the lock service unreachable, fails closed and the
// payout is untouched.
func inv07(t *testing.T, s *sys) {
	acc := s.account(t, 10_000)
	p := s.payout(t, acc, 100)
	if primariesRemoved {
		other := s.account(t, 10_000)
		g := s.grant(t, s.a, other)
		s.release(t, s.a, g)
		s.payOut(t, p, g.Token, "no-grant-writer")
		if got := s.get(t, p.ID); got.State != pc.Posted {
			t.Fatalf("bypass: payout %s, want POSTED", got.State)
		}
		rep := s.reconcile(t)
		want := map[string]any{"payout_id": p.ID, "token": g.Token, "granted_key": fencing.Key(other)}
		fired(t, rep, "INV-07", "submission_without_grant", want)
		fired(t, rep, "INV-07", "ledger_without_grant", want)
		return
	}
	r := s.st.Ready
	dead := "http://127.0.0.1:1"
	out, errOut, code := s.run(t, r.Tokens.Operator, "payout", "cancel", p.ID, "--reason", "no grant to be had",
		"--lock-url", dead, "--payment-url", r.PaymentURL, "--proxy-url", r.ProxyURL)
	if code == 0 {
		t.Fatalf("cancel without a reachable lock service succeeded:\n%s\n%s", out, errOut)
	}
	if got := s.get(t, p.ID); got.State != pc.Pending || got.Token != 0 {
		t.Fatalf("payout changed without a grant: %s token %d", got.State, got.Token)
	}
	if ev := s.events(t, p.ID); len(ev) > 1 {
		t.Fatalf("payout history grew without a grant: %+v", ev)
	}
	rep := s.reconcile(t)
	silent(t, rep, "submission_without_grant", map[string]any{"payout_id": p.ID})
	silent(t, rep, "ledger_without_grant", map[string]any{"payout_id": p.ID})
}

// INV-08, terminal states are terminal. Primary: the transition table
// (negativecontrol: its refusal compiled out). A cleanup job cancels a
// payout that was paid and POSTED, and a replay job claims again a payout
// an operator had cancelled (ABANDONED, nothing paid). Without the table
// both land: the first becomes ABANDONED with money at the rail
// (settled_not_posted), and each leaves a change out of a final state in
// its history (terminal_state_left), the only evidence of the second; with
// it, invalid_transition and the rejected_transition detective, and no
// such change.
func inv08(t *testing.T, s *sys) {
	acc := s.account(t, 10_000)
	p := s.payout(t, acc, 100)
	cancelled := s.payout(t, acc, 100)
	g := s.grant(t, s.a, acc)
	defer s.release(t, s.a, g)
	s.payOut(t, p, g.Token, g.Holder())
	if _, err := s.pay.Cancel(ctxT(t), cancelled.ID, g.Token, g.Holder(), "customer asked"); err != nil {
		t.Fatalf("cancel a PENDING payout: %v", err)
	}
	_, err := s.pay.Cancel(ctxT(t), p.ID, g.Token, g.Holder(), "cleanup job")
	_, replayErr := s.pay.Claim(ctxT(t), cancelled.ID, g.Token, g.Holder())
	rep := s.reconcile(t)
	got, again := s.get(t, p.ID), s.get(t, cancelled.ID)
	if primariesRemoved {
		if err != nil || got.State != pc.Abandoned || replayErr != nil || again.State != pc.Claimed {
			t.Fatalf("table removed: the re-executions should land; cancel: err %v, payout %s; claim: err %v, payout %s", err, got.State, replayErr, again.State)
		}
		fired(t, rep, "INV-03", "settled_not_posted", map[string]any{"payout_id": p.ID, "state": string(pc.Abandoned)})
		fired(t, rep, "INV-08", "terminal_state_left", map[string]any{"payout_id": p.ID, "from_state": string(pc.Posted), "to_state": string(pc.Abandoned)})
		fired(t, rep, "INV-08", "terminal_state_left", map[string]any{"payout_id": cancelled.ID, "from_state": string(pc.Abandoned), "to_state": string(pc.Claimed)})
		silent(t, rep, "rejected_transition", map[string]any{"payout_id": p.ID})
		silent(t, rep, "rejected_transition", map[string]any{"payout_id": cancelled.ID})
		return
	}
	if !problem.Has(err, problem.InvalidTransition) || got.State != pc.Posted ||
		!problem.Has(replayErr, problem.InvalidTransition) || again.State != pc.Abandoned {
		t.Fatalf("table in place: want invalid_transition, POSTED and ABANDONED; cancel: err %v, payout %s; claim: err %v, payout %s", err, got.State, replayErr, again.State)
	}
	fired(t, rep, "INV-08", "rejected_transition", map[string]any{"payout_id": p.ID})
	fired(t, rep, "INV-08", "rejected_transition", map[string]any{"payout_id": cancelled.ID})
	silent(t, rep, "settled_not_posted", map[string]any{"payout_id": p.ID})
	silent(t, rep, "terminal_state_left", map[string]any{"payout_id": p.ID})
	silent(t, rep, "terminal_state_left", map[string]any{"payout_id": cancelled.ID})
}

// INV-02, at most one rail submission ever succeeds. Primary: the partial
// unique index rail_submission_one_forwarded_per_payout (negativecontrol:
// dropped from the test's proxydb; the intent insert no longer names it).
// A replay submits an acknowledged payout again. Detectives: the
// reconciler's forwarded_submissions and settled_per_client_ref; in place,
// duplicate_attempt.
func inv02(t *testing.T, s *sys) {
	ctx := ctxT(t)
	acc := s.account(t, 10_000)
	p := s.payout(t, acc, 100)
	g := s.grant(t, s.a, acc)
	defer s.release(t, s.a, g)
	if _, err := s.pay.Claim(ctx, p.ID, g.Token, g.Holder()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pay.Submitting(ctx, p.ID, g.Token, g.Holder()); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.proxy.Submit(ctx, submission(p), g.Token, g.Holder()); err != nil || rec.Outcome != proxyclient.OutcomeAcked {
		t.Fatalf("first submission: %+v %v", rec, err)
	}
	if primariesRemoved {
		if err := s.exec(t, "proxydb", false, `DROP INDEX rail_submission_one_forwarded_per_payout`); err != nil {
			t.Fatal(err)
		}
	}
	rec, err := s.proxy.Submit(ctx, submission(p), g.Token, g.Holder()) // the replay
	rep := s.reconcile(t)
	pays := s.railPayments(t, p.ClientRef)
	if primariesRemoved {
		if err != nil || rec.Outcome != proxyclient.OutcomeAcked || len(pays) != 2 {
			t.Fatalf("index removed: the replay should be forwarded and paid; %+v %v, rail payments %d", rec, err, len(pays))
		}
		fired(t, rep, "INV-02", "forwarded_submissions", map[string]any{"payout_id": p.ID})
		fired(t, rep, "INV-02", "settled_per_client_ref", map[string]any{"payout_id": p.ID})
		return
	}
	if !problem.Has(err, problem.SubmissionExists) || len(pays) != 1 {
		t.Fatalf("index in place: want submission_exists and one payment; %v, rail payments %d", err, len(pays))
	}
	fired(t, rep, "INV-02", "duplicate_attempt", map[string]any{"payout_id": p.ID})
	silent(t, rep, "forwarded_submissions", map[string]any{"payout_id": p.ID})
	silent(t, rep, "settled_per_client_ref", map[string]any{"payout_id": p.ID})
}

// INV-04, tokens never repeat or go backwards. Primary: lockdb's
// lock_token_seq, never rewound. Removed by the test: lockdb goes back as a
// restore from an older backup would (the grant log and the sequence
// rewound below a token the guards have stored). B's grant then carries a
// token below A's, and (guards off too) B's re-claim lands. Detective: the
// reconciler's lock_service_rewound (and claim_token_order). In place, B's
// token is above A's and nothing is reported.
func inv04(t *testing.T, s *sys) {
	ctx := ctxT(t)
	acc := s.account(t, 10_000)
	p := s.payout(t, acc, 100)
	ga := s.grant(t, s.a, acc)
	if _, err := s.pay.Claim(ctx, p.ID, ga.Token, ga.Holder()); err != nil {
		t.Fatal(err)
	}
	s.release(t, s.a, ga)
	if primariesRemoved {
		back := max(1, int64(ga.Token)-3)
		if err := s.exec(t, "lockdb", true, `DELETE FROM lock_grant WHERE token >= $1`, back); err != nil {
			t.Fatal(err)
		}
		if err := s.exec(t, "lockdb", false, `SELECT setval('lock_token_seq', $1, false)`, back); err != nil {
			t.Fatal(err)
		}
	}
	gb := s.grant(t, s.b, acc)
	defer s.release(t, s.b, gb)
	_, err := s.pay.Claim(ctx, p.ID, gb.Token, gb.Holder()) // recovery re-claim
	rep := s.reconcile(t)
	got := s.get(t, p.ID)
	if err != nil || got.ClaimedBy != gb.Holder() {
		t.Fatalf("B's re-claim should land (guards %s); err %v, claimed by %s", map[bool]string{true: "removed", false: "in place"}[primariesRemoved], err, got.ClaimedBy)
	}
	if primariesRemoved {
		if gb.Token >= ga.Token {
			t.Fatalf("rewound lock service issued %d after %d", gb.Token, ga.Token)
		}
		fired(t, rep, "INV-04", "lock_service_rewound", map[string]any{"lock_high_token": gb.Token})
		fired(t, rep, "INV-01", "claim_token_order", map[string]any{"payout_id": p.ID, "token": gb.Token, "previous_token": ga.Token})
		return
	}
	if gb.Token <= ga.Token {
		t.Fatalf("lock service issued %d after %d", gb.Token, ga.Token)
	}
	if len(rep.find("lock_service_rewound", nil)) > 0 || rep.LockHighToken < rep.HighestFence {
		t.Fatalf("lock service reported rewound: lock high %d, highest fence %d", rep.LockHighToken, rep.HighestFence)
	}
	silent(t, rep, "claim_token_order", map[string]any{"payout_id": p.ID})
}
