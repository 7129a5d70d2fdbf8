package executor

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// TestOperatorChangesAskTheProxyFirst: an operator's cancel or abandon
// releases a payout's money, so it is refused while the rail proxy holds
// evidence that the rail may have paid: a forwarded submission of a PENDING
// payout (paydb restored from a backup taken before the claim), or the
// rail's answer for a RAIL_AMBIGUOUS one (an executor that lost the answer;
// a reconciler stopped between the proxy's resolution and paydb's). Before,
// both went through: the payout ABANDONED, its money released, and the
// rail's payment left with no ledger entry.
func TestOperatorChangesAskTheProxyFirst(t *testing.T) {
	// Abandon needs the resolution SLA passed; the stack's roles read it
	// from the environment.
	t.Setenv("PAYOUTS_RESOLUTION_SLA", "1ms")
	s := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	r := s.st.Ready
	exec := r.Tokens.Executor
	pay, err := pc.New(r.PaymentURL, exec)
	if err != nil {
		t.Fatal(err)
	}
	prx, err := proxyclient.New(r.ProxyURL, exec)
	if err != nil {
		t.Fatal(err)
	}
	lc, err := lockclient.New(r.LockURL, lockclient.WithToken(exec))
	if err != nil {
		t.Fatal(err)
	}
	sess, err := lc.Open(ctx, "writer:test")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sess.Close(context.WithoutCancel(ctx)) }()
	if _, err := s.pay.CreateAccount(ctx, pc.CreateAccountRequest{ID: "op-a", Currency: "EUR", OpeningBalance: 100_000}); err != nil {
		t.Fatal(err)
	}
	mk := func(t *testing.T, id string) pc.Payout {
		t.Helper()
		p, err := s.pay.CreatePayout(ctx, pc.CreatePayoutRequest{ID: id, AccountID: "op-a", Amount: 500, Currency: "EUR", BeneficiaryRef: "BEN-" + id})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// under runs fn under a grant of op-a's key, released before the
	// operator's command takes it.
	under := func(t *testing.T, fn func(g *lockclient.Grant)) {
		t.Helper()
		g, err := sess.Acquire(ctx, fencing.Key("op-a"), 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		fn(g)
		if err := sess.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	submit := func(g *lockclient.Grant, p pc.Payout, tok fencing.Token) (proxyclient.Record, error) {
		return prx.Submit(ctx, proxyclient.Submission{PayoutID: p.ID, AccountID: p.AccountID, ClientRef: p.ClientRef,
			Amount: p.Amount, Currency: p.Currency, BeneficiaryRef: p.BeneficiaryRef}, tok, g.Holder())
	}
	// ambiguous drives p to RAIL_AMBIGUOUS as an executor that lost the
	// proxy's answer does, and returns the proxy's record.
	ambiguous := func(t *testing.T, p pc.Payout) proxyclient.Record {
		t.Helper()
		var rec proxyclient.Record
		under(t, func(g *lockclient.Grant) {
			if _, err := pay.Claim(ctx, p.ID, g.Token, g.Holder()); err != nil {
				t.Fatal(err)
			}
			if _, err := pay.Submitting(ctx, p.ID, g.Token, g.Holder()); err != nil {
				t.Fatal(err)
			}
			if rec, err = submit(g, p, g.Token); err != nil {
				t.Fatal(err)
			}
			if _, err := pay.ReportOutcome(ctx, p.ID, g.Token, g.Holder(), pc.OutcomeTimeout, "", ""); err != nil {
				t.Fatal(err)
			}
		})
		return rec
	}
	op, err := NewOperator(OperatorConfig{Owner: "operator:test", LockURL: r.LockURL, PaymentURL: r.PaymentURL, ProxyURL: r.ProxyURL,
		Token: r.Tokens.Operator, Wait: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	refused := func(t *testing.T, what string, err error, id string, want pc.State, says string) {
		t.Helper()
		if !problem.Has(err, problem.Conflict) || !strings.Contains(err.Error(), says) {
			t.Fatalf("%s: %v, want conflict saying %q", what, err, says)
		}
		if got := s.state(t, id); got != want {
			t.Fatalf("%s: payout %s is %s after the refusal, want %s (unchanged)", what, id, got, want)
		}
	}

	t.Run("cancel of a PENDING payout the proxy sent to the rail", func(t *testing.T) {
		// paydb lost the claim (a restore); the proxy and the rail did not.
		p := mk(t, "op-1")
		under(t, func(g *lockclient.Grant) {
			rec, err := submit(g, p, g.Token)
			if err != nil || rec.Outcome != proxyclient.OutcomeAcked {
				t.Fatalf("submission: %+v, %v", rec, err)
			}
		})
		_, err := op.Cancel(ctx, p.ID, "customer withdrew")
		refused(t, "cancel", err, p.ID, pc.Pending, "forwarded it to the rail")
	})

	t.Run("cancel of a payout past PENDING is still an invalid transition", func(t *testing.T) {
		p := mk(t, "op-7")
		rec := ambiguous(t, p) // the rail answered at once: ACKED
		if rec.Outcome != proxyclient.OutcomeAcked {
			t.Fatalf("proxy record %+v, want ACKED", rec)
		}
		// The payment resource refuses it, and records the defect signal.
		if _, err := op.Cancel(ctx, p.ID, "cleanup job"); !problem.Has(err, problem.InvalidTransition) {
			t.Fatalf("cancel of a RAIL_AMBIGUOUS payout: %v, want invalid_transition", err)
		}
		page, err := s.pay.SafetyEvents(ctx, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		seen := false
		for _, e := range page.Items {
			seen = seen || (e.PayoutID == p.ID && e.Kind == pc.KindRejectedTransition)
		}
		if !seen {
			t.Fatal("no rejected_transition event for the refused cancel")
		}
	})

	t.Run("cancel of a payout whose only attempt was fenced out", func(t *testing.T) {
		p := mk(t, "op-2")
		under(t, func(g *lockclient.Grant) {
			// A token below the account's high-water: never forwarded.
			if _, err := submit(g, p, 1); !problem.Has(err, problem.FencedOut) {
				t.Fatalf("stale submission: %v, want fenced_out", err)
			}
		})
		if rec, err := s.prx.Get(ctx, p.ID); err != nil || rec.Outcome != proxyclient.OutcomeFenced {
			t.Fatalf("proxy record: %+v, %v; want the FENCED attempt", rec, err)
		}
		got, err := op.Cancel(ctx, p.ID, "customer withdrew")
		if err != nil || got.State != pc.Abandoned {
			t.Fatalf("cancel: %+v, %v; want ABANDONED", got, err)
		}
	})

	t.Run("cancel when the proxy cannot be asked", func(t *testing.T) {
		p := mk(t, "op-3")
		blind, err := NewOperator(OperatorConfig{Owner: "operator:test", LockURL: r.LockURL, PaymentURL: r.PaymentURL,
			ProxyURL: "http://127.0.0.1:1", Token: r.Tokens.Operator, Wait: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := blind.Cancel(ctx, p.ID, "customer withdrew"); err == nil || !strings.Contains(err.Error(), "nothing was changed") {
			t.Fatalf("cancel without the proxy: %v, want an error saying nothing was changed", err)
		}
		// A --proxy-url naming another role answers 404 "no route": that is
		// no proxy saying it holds no submission.
		wrong, err := NewOperator(OperatorConfig{Owner: "operator:test", LockURL: r.LockURL, PaymentURL: r.PaymentURL,
			ProxyURL: r.PaymentURL, Token: r.Tokens.Operator, Wait: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := wrong.Cancel(ctx, p.ID, "customer withdrew"); err == nil || !strings.Contains(err.Error(), "nothing was changed") {
			t.Fatalf("cancel with the payment resource's URL as --proxy-url: %v, want an error saying nothing was changed", err)
		}
		if got := s.state(t, p.ID); got != pc.Pending {
			t.Fatalf("payout %s is %s, want PENDING", p.ID, got)
		}
	})

	t.Run("abandon of an ambiguous payout the rail acknowledged", func(t *testing.T) {
		p := mk(t, "op-4")
		if rec := ambiguous(t, p); rec.Outcome != proxyclient.OutcomeAcked {
			t.Fatalf("proxy record %+v, want ACKED", rec)
		}
		_, err := op.Abandon(ctx, p.ID, "past SLA")
		refused(t, "abandon", err, p.ID, pc.RailAmbiguous, "outcome ACKED")
		// A human who has found the rail contradicting that answer decides.
		got, err := op.AbandonDespiteRailAnswer(ctx, p.ID, "rail lookup says no payment; rail ticket R-1")
		if err != nil || got.State != pc.Abandoned {
			t.Fatalf("abandon despite the rail's answer: %+v, %v; want ABANDONED", got, err)
		}
	})

	t.Run("abandon of ambiguous payouts the rail never answered", func(t *testing.T) {
		one, zero := 1.0, 0.0
		if _, err := s.rail.SetFaults(ctx, railclient.FaultsUpdate{TimeoutAfterAccept: &one}); err != nil {
			t.Fatal(err)
		}
		p5, p6 := mk(t, "op-5"), mk(t, "op-6")
		recs := []proxyclient.Record{ambiguous(t, p5), ambiguous(t, p6)}
		if _, err := s.rail.SetFaults(ctx, railclient.FaultsUpdate{TimeoutAfterAccept: &zero}); err != nil {
			t.Fatal(err)
		}
		for _, rec := range recs {
			if rec.Outcome != proxyclient.OutcomeTimeout {
				t.Fatalf("proxy record %+v, want TIMEOUT", rec)
			}
		}
		// No answer from the rail at all: the operator's decision stands.
		got, err := op.Abandon(ctx, p5.ID, "past SLA; finance ticket FIN-1")
		if err != nil || got.State != pc.Abandoned {
			t.Fatalf("abandon without the rail's answer: %+v, %v; want ABANDONED", got, err)
		}
		// The rail's answer, by lookup once the payment settled, is written
		// at the proxy before the payout changes (a reconciler stopped
		// between the two leaves exactly this).
		var lr proxyclient.LookupResult
		waitFor(t, 2*time.Minute, "a final lookup of op-6", func() bool {
			if lr, err = s.prx.Lookup(ctx, p6.ID); err != nil {
				t.Fatal(err)
			}
			return lr.Resolution != proxyclient.ResolutionNone
		})
		if lr.Resolution != proxyclient.ResolutionSettled {
			t.Fatalf("lookup of op-6: %+v, want SETTLED (the rail accepted it)", lr)
		}
		_, err = op.Abandon(ctx, p6.ID, "past SLA")
		refused(t, "abandon", err, p6.ID, pc.RailAmbiguous, "resolution SETTLED")
		_, err = op.AbandonDespiteRailAnswer(ctx, p6.ID, "past SLA")
		refused(t, "abandon despite the rail's answer", err, p6.ID, pc.RailAmbiguous, "resolution SETTLED")
	})
}

// An operator's cancel or abandon reads the payout and asks the proxy
// under the account's grant before it changes anything, and those calls
// can outlive the grant or put its session in jeopardy: the grant is
// checked again right before the change (D-11). A grant lost meanwhile
// changes nothing, and the command says so.
func TestOperatorChecksTheGrantBeforeItsChange(t *testing.T) {
	t.Parallel() // owns its stack and databases
	s := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	r := s.st.Ready
	ids := s.fundedPage(t, "opgrant", 1)
	var p poison
	var asked atomic.Bool
	proxyURL := frontOf(t, r.ProxyURL, func(req *http.Request) {
		if req.Method == http.MethodGet && req.URL.Path == "/v1/submissions/"+ids[0] {
			asked.Store(true)
			p.arm() // the grant is lost while the proxy answers
		}
	})
	op, err := NewOperator(OperatorConfig{Owner: "operator:test", LockURL: r.LockURL, PaymentURL: r.PaymentURL, ProxyURL: proxyURL,
		Token: r.Tokens.Operator, Wait: 30 * time.Second,
		locker: poisoned(t, Config{LockURL: r.LockURL, Token: r.Tokens.Operator, SessionTTL: 15 * time.Second, Logger: slog.New(slog.DiscardHandler)}, &p)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = op.Cancel(ctx, ids[0], "customer withdrew")
	if !asked.Load() {
		t.Fatal("the proxy was not asked about the payout: the test exercised nothing")
	}
	if err == nil || !strings.Contains(err.Error(), "nothing was changed") {
		t.Errorf("cancel under a grant lost while the proxy answered: %v; want an error saying nothing was changed", err)
	}
	if got := s.state(t, ids[0]); got != pc.Pending {
		t.Errorf("the payout is %s, want PENDING (unchanged)", got)
	}
}
