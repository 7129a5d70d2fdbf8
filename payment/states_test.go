package payment

import (
	"fmt"
	"testing"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// want is domain model 2.3 written out independently of Transitions, so
// the test fails if the table in code drifts from the model.
var want = map[pc.State]map[Event]pc.State{
	pc.Pending:       {EvClaim: pc.Claimed, EvInsufficientFunds: pc.Failed, EvCancel: pc.Abandoned},
	pc.Claimed:       {EvClaim: pc.Claimed, EvSubmitting: pc.RailSubmitted},
	pc.RailSubmitted: {EvRailAcked: pc.RailAcked, EvRailDeclined: pc.Failed, EvRailTimeout: pc.RailAmbiguous, EvRailRefused: pc.Failed},
	pc.RailAcked:     {EvPost: pc.Posted},
	pc.RailAmbiguous: {EvResolveSettled: pc.RailAcked, EvResolveAbsent: pc.Failed, EvAbandon: pc.Abandoned},
	pc.Posted:        {},
	pc.Failed:        {},
	pc.Abandoned:     {},
}

func TestTransitionTableIsTheModel(t *testing.T) {
	for _, from := range pc.States {
		for _, ev := range Events {
			t.Run(fmt.Sprintf("%s/%s", from, ev), func(t *testing.T) {
				to, ok := Next(from, ev)
				wantTo, wantOK := want[from][ev]
				if ok != wantOK || to != wantTo {
					t.Fatalf("Next(%s, %s) = %q, %v; want %q, %v", from, ev, to, ok, wantTo, wantOK)
				}
				if from.Terminal() && ok {
					t.Fatalf("terminal state %s accepted %s", from, ev)
				}
			})
		}
	}
	if len(want) != len(pc.States) {
		t.Fatalf("model lists %d states, want %d", len(want), len(pc.States))
	}
}

// request is one fenced request the API can receive, with the event the
// server derives from it on a funded account.
type request struct {
	name  string
	event Event
	do    func(e *testBundle, id string, tok fencing.Token, h fencing.Holder) (pc.Payout, error)
}

var requests = []request{
	{"claim", EvClaim, func(e *testBundle, id string, tok fencing.Token, h fencing.Holder) (pc.Payout, error) {
		return e.exec.Claim(bg, id, tok, h)
	}},
	{"submitting", EvSubmitting, func(e *testBundle, id string, tok fencing.Token, h fencing.Holder) (pc.Payout, error) {
		return e.exec.Submitting(bg, id, tok, h)
	}},
	{"outcome-acked", EvRailAcked, func(e *testBundle, id string, tok fencing.Token, h fencing.Holder) (pc.Payout, error) {
		return e.exec.ReportOutcome(bg, id, tok, h, pc.OutcomeAcked, "rail-1", "")
	}},
	{"outcome-rejected", EvRailDeclined, func(e *testBundle, id string, tok fencing.Token, h fencing.Holder) (pc.Payout, error) {
		return e.exec.ReportOutcome(bg, id, tok, h, pc.OutcomeRejected, "", "DECLINED")
	}},
	{"outcome-timeout", EvRailTimeout, func(e *testBundle, id string, tok fencing.Token, h fencing.Holder) (pc.Payout, error) {
		return e.exec.ReportOutcome(bg, id, tok, h, pc.OutcomeTimeout, "", "")
	}},
	{"post", EvPost, func(e *testBundle, id string, tok fencing.Token, h fencing.Holder) (pc.Payout, error) {
		return e.exec.Post(bg, id, tok, h)
	}},
	{"resolve-settled", EvResolveSettled, func(e *testBundle, id string, tok fencing.Token, h fencing.Holder) (pc.Payout, error) {
		return e.recon.Resolve(bg, id, tok, h, pc.ResolutionSettled, "rail lookup: settled rail-1", "rail-1")
	}},
	{"resolve-absent", EvResolveAbsent, func(e *testBundle, id string, tok fencing.Token, h fencing.Holder) (pc.Payout, error) {
		return e.recon.Resolve(bg, id, tok, h, pc.ResolutionAbsent, "rail lookup: final, no payment", "")
	}},
	{"cancel", EvCancel, func(e *testBundle, id string, tok fencing.Token, h fencing.Holder) (pc.Payout, error) {
		return e.oper.Cancel(bg, id, tok, h, "customer withdrew")
	}},
	{"abandon", EvAbandon, func(e *testBundle, id string, tok fencing.Token, h fencing.Holder) (pc.Payout, error) {
		return e.oper.Abandon(bg, id, tok, h, "SLA exceeded; handed to finance")
	}},
	{"refuse", EvRailRefused, func(e *testBundle, id string, tok fencing.Token, h fencing.Holder) (pc.Payout, error) {
		return e.exec.Refuse(bg, id, tok, h, "invalid_request:beneficiary_ref", "proxy 400, forwarded=false")
	}},
}

// TestTransitionsOverHTTP sends every request in every state: the pairs in
// the model succeed and land in the model's next state with one payout_event;
// every other pair is 409 invalid_transition, recorded as a
// rejected_transition safety event, and changes nothing — not even the fence.
func TestTransitionsOverHTTP(t *testing.T) {
	t.Parallel()
	e := setup(t)
	n := 0
	for _, from := range pc.States {
		for _, rq := range requests {
			n++
			from, rq, n := from, rq, n
			t.Run(fmt.Sprintf("%s/%s", from, rq.name), func(t *testing.T) {
				acct, id := fmt.Sprintf("acc-%d", n), fmt.Sprintf("po-%d", n)
				e.account(t, acct, 10_000)
				e.payout(t, id, acct, 100)
				before := e.drive(t, id, from, 5, "holder-a")
				beforeAcct, err := e.exec.Account(bg, acct)
				if err != nil {
					t.Fatal(err)
				}
				events := e.eventCount(t, id)

				got, err := rq.do(e, id, 6, "holder-b")
				wantTo, allowed := want[from][rq.event]
				if allowed {
					if err != nil {
						t.Fatalf("%s in %s: %v", rq.name, from, err)
					}
					if got.State != wantTo {
						t.Fatalf("state %s, want %s", got.State, wantTo)
					}
					if got.Token != 6 {
						t.Fatalf("payout token %d, want 6", got.Token)
					}
					if n := e.eventCount(t, id); n != events+1 {
						t.Fatalf("payout_event rows %d, want %d", n, events+1)
					}
					a, _ := e.exec.Account(bg, acct)
					if a.FenceToken != 6 || a.FenceHolder != "holder-b" {
						t.Fatalf("fence (%d, %s), want (6, holder-b)", a.FenceToken, a.FenceHolder)
					}
					if len(e.safetyKinds(t, id)) != 0 {
						t.Fatalf("accepted request left safety events: %v", e.safetyKinds(t, id))
					}
					return
				}
				pe := wantCode(t, err, problem.InvalidTransition)
				var st pc.State
				if !pe.Extension("state", &st) || st != from {
					t.Fatalf("problem state extension %q, want %s", st, from)
				}
				after, _ := e.exec.Payout(bg, id)
				if after.State != before.State || after.Token != before.Token || after.ClaimedBy != before.ClaimedBy {
					t.Fatalf("rejected request changed the payout: %+v -> %+v", before, after)
				}
				a, _ := e.exec.Account(bg, acct)
				if a != beforeAcct {
					t.Fatalf("rejected request changed the account: %+v -> %+v", beforeAcct, a)
				}
				if n := e.eventCount(t, id); n != events {
					t.Fatalf("rejected request wrote payout_event rows: %d, want %d", n, events)
				}
				if k := e.safetyKinds(t, id); len(k) != 1 || k[0] != pc.KindRejectedTransition {
					t.Fatalf("safety events %v, want [rejected_transition]", k)
				}
			})
		}
	}
	e.assertLedger(t)
}

// TestClaimInsufficientFunds: PENDING -> FAILED when available (balance
// minus held payouts, D-7) does not cover the amount.
func TestClaimInsufficientFunds(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 150)
	e.payout(t, "po-1", "acc-1", 100)
	e.payout(t, "po-2", "acc-1", 100)
	if p, err := e.exec.Claim(bg, "po-1", 1, "h1"); err != nil || p.State != pc.Claimed {
		t.Fatalf("claim po-1: %+v %v", p, err)
	}
	a, _ := e.exec.Account(bg, "acc-1")
	if a.Balance != 150 || a.Available != 50 {
		t.Fatalf("account %+v: want balance 150, available 50", a)
	}
	p, err := e.exec.Claim(bg, "po-2", 1, "h1")
	if err != nil {
		t.Fatal(err)
	}
	if p.State != pc.Failed || p.FailureReason != pc.FailureInsufficientFunds {
		t.Fatalf("po-2 %s/%q, want FAILED/insufficient_funds", p.State, p.FailureReason)
	}
	// A failed payout accepts nothing, and a re-claim of the claimed one is fine.
	_, err = e.exec.Claim(bg, "po-2", 2, "h2")
	wantCode(t, err, problem.InvalidTransition)
	if p, err := e.exec.Claim(bg, "po-1", 3, "h3"); err != nil || p.State != pc.Claimed || p.ClaimedBy != "h3" {
		t.Fatalf("re-claim po-1: %+v %v", p, err)
	}
}
