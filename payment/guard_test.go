//go:build !negativecontrol

package payment

import (
	"fmt"
	"strings"
	"testing"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// validIn is, for each request, a state in which the model accepts it, so a
// refusal can only come from the guard.
var validIn = map[string]pc.State{
	"claim": pc.Pending, "submitting": pc.Claimed, "outcome-acked": pc.RailSubmitted,
	"outcome-rejected": pc.RailSubmitted, "outcome-timeout": pc.RailSubmitted, "post": pc.RailAcked,
	"resolve-settled": pc.RailAmbiguous, "resolve-absent": pc.RailAmbiguous,
	"cancel": pc.Pending, "abandon": pc.RailAmbiguous, "refuse": pc.RailSubmitted,
}

// TestGuard presents a stale token, an equal token from another holder, and
// a higher token to every mutating endpoint, in a state where the request
// is otherwise valid (D-1).
func TestGuard(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cases := []struct {
		name       string
		token      fencing.Token
		holder     fencing.Holder
		accepted   bool
		regression bool
	}{
		{"stale", 9, "holder-b", false, false},
		{"equal-other-holder", 10, "holder-b", false, true},
		{"equal-same-holder", 10, "holder-a", true, false},
		{"higher", 11, "holder-b", true, false},
	}
	n := 0
	for _, rq := range requests {
		for _, c := range cases {
			n++
			rq, c, n := rq, c, n
			t.Run(rq.name+"/"+c.name, func(t *testing.T) {
				acct, id := fmt.Sprintf("acc-%d", n), fmt.Sprintf("po-%d", n)
				e.account(t, acct, 1_000)
				e.payout(t, id, acct, 100)
				before := e.drive(t, id, validIn[rq.name], 10, "holder-a")
				if before.State == pc.Pending {
					// Set the fence through another payout of the account.
					e.payout(t, id+"-x", acct, 100)
					e.drive(t, id+"-x", pc.Claimed, 10, "holder-a")
				}
				events := e.eventCount(t, id)
				fenced0 := counterValue(e.svc.m.fencedOut)
				regress0 := counterValue(e.svc.m.tokenRegressions)

				got, err := rq.do(e, id, c.token, c.holder)
				a, aerr := e.exec.Account(bg, acct)
				if aerr != nil {
					t.Fatal(aerr)
				}
				if c.accepted {
					if err != nil {
						t.Fatalf("want accepted, got %v", err)
					}
					if got.Token != c.token || a.FenceToken != c.token || a.FenceHolder != c.holder {
						t.Fatalf("after accept: payout token %d, fence (%d, %s); want %d/%s", got.Token, a.FenceToken, a.FenceHolder, c.token, c.holder)
					}
					if k := e.safetyKinds(t, id); len(k) != 0 {
						t.Fatalf("accepted request left safety events %v", k)
					}
					return
				}
				pe := wantCode(t, err, problem.FencedOut)
				if pe.Key != fencing.Key(acct) || pe.PresentedToken != int64(c.token) || pe.StoredToken != 10 {
					t.Fatalf("fenced_out body key=%q presented=%d stored=%d", pe.Key, pe.PresentedToken, pe.StoredToken)
				}
				if pe.Status() != 409 {
					t.Fatalf("status %d, want 409", pe.Status())
				}
				if problem.IsTokenRegression(err) != c.regression {
					t.Fatalf("answer marked token_regression %t, want %t: %v", problem.IsTokenRegression(err), c.regression, err)
				}
				if a.FenceToken != 10 || a.FenceHolder != "holder-a" {
					t.Fatalf("fence moved on refusal: (%d, %s)", a.FenceToken, a.FenceHolder)
				}
				after, _ := e.exec.Payout(bg, id)
				if after.State != before.State || after.Token != before.Token {
					t.Fatalf("refused request changed the payout: %+v -> %+v", before, after)
				}
				if got := e.eventCount(t, id); got != events {
					t.Fatalf("refused request wrote payout events")
				}
				wantKinds := []string{pc.KindFencedOut}
				if c.regression {
					wantKinds = append(wantKinds, pc.KindTokenRegression)
				}
				if k := e.safetyKinds(t, id); strings.Join(k, ",") != strings.Join(wantKinds, ",") {
					t.Fatalf("safety events %v, want %v", k, wantKinds)
				}
				if d := counterValue(e.svc.m.fencedOut) - fenced0; d != 1 {
					t.Fatalf("fenced_out counter moved by %v, want 1", d)
				}
				wantReg := 0.0
				if c.regression {
					wantReg = 1
				}
				if d := counterValue(e.svc.m.tokenRegressions) - regress0; d != wantReg {
					t.Fatalf("token_regression counter moved by %v, want %v", d, wantReg)
				}
				if !containsAll(e.logs.String(), `"level":"WARN"`, `"event":"fenced_out"`, `"payout_id":"`+id+`"`, `"key":"payout:`+acct+`"`) {
					t.Fatalf("no structured fenced_out WARN line for %s in the log", id)
				}
			})
		}
	}
	// The evidence is served, with both tokens and holders.
	evs, err := e.recon.SafetyEvents(bg, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var fenced, regressions int
	for _, ev := range evs.Items {
		switch ev.Kind {
		case pc.KindFencedOut:
			fenced++
			if ev.StoredToken != 10 || ev.StoredHolder != "holder-a" || ev.Holder != "holder-b" || !strings.HasPrefix(ev.Key, "payout:") {
				t.Fatalf("fenced_out event %+v", ev)
			}
		case pc.KindTokenRegression:
			regressions++
		}
	}
	if fenced != 2*len(requests) || regressions != len(requests) {
		t.Fatalf("served %d fenced_out and %d token_regression events, want %d and %d", fenced, regressions, 2*len(requests), len(requests))
	}
	if h, err := e.recon.HighFence(bg); err != nil || h != 11 {
		t.Fatalf("high fence %d %v, want 11", h, err)
	}
	e.assertLedger(t)
}

// TestFenceIsPerAccount: a stale holder cannot use a different payout of
// the same account to get past the fence (domain model 2.2).
func TestFenceIsPerAccount(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 100)
	e.payout(t, "po-2", "acc-1", 100)
	e.drive(t, "po-1", pc.Claimed, 20, "new")
	_, err := e.exec.Claim(bg, "po-2", 19, "old")
	wantCode(t, err, problem.FencedOut)
	if p, _ := e.exec.Payout(bg, "po-2"); p.State != pc.Pending {
		t.Fatalf("po-2 is %s", p.State)
	}
}

// TestBadTokenLeavesFence: a request rejected as bad input changes nothing,
// the fence included, and records nothing.
func TestBadTokenLeavesFence(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 100)
	e.drive(t, "po-1", pc.Claimed, 7, "h")
	before := e.counts(t)
	for _, c := range []struct {
		token  fencing.Token
		holder fencing.Holder
		field  string
	}{{0, "h", "token"}, {-3, "h", "token"}, {fencing.MaxToken + 1, "h", "token"}, {8, "", "holder"}} {
		_, err := e.exec.Submitting(bg, "po-1", c.token, c.holder)
		pe := wantCode(t, err, problem.InvalidRequest)
		var f string
		if !pe.Extension("field", &f) || f != c.field || !strings.HasPrefix(pe.Message, c.field+":") {
			t.Fatalf("token %d holder %q: problem %+v does not name %s", c.token, c.holder, pe, c.field)
		}
	}
	if a, _ := e.exec.Account(bg, "acc-1"); a.FenceToken != 7 || a.FenceHolder != "h" {
		t.Fatalf("fence moved: %+v", a)
	}
	if after := e.counts(t); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("rows changed: %v -> %v", before, after)
	}
}

// A fence, a payout's state and its ledger lines are answered only once on
// disk, whatever the server's default: the test clusters run with
// synchronous_commit off, and the payment resource's sessions turn it on.
func TestCommitsAreDurableWhateverTheServersDefault(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var v string
	if err := e.svc.pool.QueryRow(tctx(t), "SHOW synchronous_commit").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v != "on" {
		t.Fatalf("synchronous_commit = %q in the payment resource's sessions, want on", v)
	}
}
