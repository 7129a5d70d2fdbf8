package reconcile_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
	"github.com/payouts/payouts/reconcile"
)

// leftUntil runs passes until the payout is left for the given reason,
// failing after a generous timeout or if it is resolved.
func leftUntil(t *testing.T, r *reconcile.Reconciler, payoutID, reason string) *reconcile.Report {
	t.Helper()
	return passUntil(t, r, fmt.Sprintf("payout %s left for %q", payoutID, reason), func(rep *reconcile.Report) bool {
		if x, ok := resolved(rep, payoutID); ok {
			t.Fatalf("payout %s resolved %s -> %s, want it left (%q); evidence %s", payoutID, x.Resolution, x.State, reason, x.Evidence)
		}
		return leftWith(rep, payoutID, reason)
	})
}

// A payout the executor reported ambiguous because the proxy's submission
// is not the payout's (here 500 where the payout is 100: the executor's
// submission_mismatch) is left for a human, however final the rail's
// answer: resolved SETTLED, the executor would post 100 where the rail
// paid 500. The pass reports it at once (ambiguous_evidence_conflict), not
// a day later as over the ambiguity SLA.
func TestResolveLeavesAPayoutWhoseSubmissionIsNotIt(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.newPayout(t, acc, 100)
	g := e.grant(t, acc)
	ctx := ctxT(t)
	if _, err := e.pay.Claim(ctx, p.ID, g.Token, g.Holder()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pay.Submitting(ctx, p.ID, g.Token, g.Holder()); err != nil {
		t.Fatal(err)
	}
	rec, err := e.proxy.Submit(ctx, proxyclient.Submission{PayoutID: p.ID, AccountID: acc, ClientRef: p.ClientRef,
		Amount: 500, Currency: p.Currency, BeneficiaryRef: p.BeneficiaryRef}, g.Token, g.Holder())
	if err != nil || rec.Outcome != proxyclient.OutcomeAcked {
		t.Fatalf("submit: %v %+v", err, rec)
	}
	if _, err := e.pay.ReportOutcome(ctx, p.ID, g.Token, g.Holder(), pc.OutcomeTimeout, "", "submission_mismatch"); err != nil {
		t.Fatal(err)
	}
	e.release(t, g)
	r := e.reconciler(t, reconcile.Options{Resolve: true}, e.st.Ready.Tokens.Operator)
	rep := leftUntil(t, r, p.ID, "is not the payout's")
	mustFind(t, rep, reconcile.INV02, reconcile.CheckAmbiguousConflict, map[string]any{"payout_id": p.ID, "amount": 100, "resolution": "SETTLED"})
	e.wantStillAmbiguous(t, p.ID)
}

// reportedAmbiguous takes a payout to RAIL_AMBIGUOUS without a failing
// rail (which would pause the shared proxy for the tests after): the rail
// takes the payment and answers, and the holder reports a timeout, as one
// whose answer was lost on the way back does.
func (e *testBundle) reportedAmbiguous(t *testing.T, p pc.Payout) pc.Payout {
	t.Helper()
	g := e.grant(t, p.AccountID)
	defer e.release(t, g)
	ctx := ctxT(t)
	if _, err := e.pay.Claim(ctx, p.ID, g.Token, g.Holder()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pay.Submitting(ctx, p.ID, g.Token, g.Holder()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.proxy.Submit(ctx, proxyclient.Submission{PayoutID: p.ID, AccountID: p.AccountID, ClientRef: p.ClientRef,
		Amount: p.Amount, Currency: p.Currency, BeneficiaryRef: p.BeneficiaryRef}, g.Token, g.Holder()); err != nil {
		t.Fatal(err)
	}
	got, err := e.pay.ReportOutcome(ctx, p.ID, g.Token, g.Holder(), pc.OutcomeTimeout, "", "rail_timeout")
	if err != nil || got.State != pc.RailAmbiguous {
		t.Fatalf("payout %s: %v %s, want RAIL_AMBIGUOUS", p.ID, err, got.State)
	}
	return got
}

// proxyFront stands in front of the stack's proxy: down(req) says which
// requests it answers 503 unavailable itself; the others go through.
func (e *testBundle) proxyFront(t *testing.T, down func(*http.Request) bool) *httptest.Server {
	t.Helper()
	target, err := url.Parse(e.st.Ready.ProxyURL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if down(req) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"type":"about:blank","title":"Service Unavailable","status":503,"code":"unavailable","detail":"down"}`))
			return
		}
		rp.ServeHTTP(w, req)
	}))
	t.Cleanup(front.Close)
	return front
}

// runOnce runs `payouts reconcile --once --json` as the command does, with
// the proxy at proxyURL; it returns the exit code, stdout, the log and the
// error.
func (e *testBundle) runOnce(t *testing.T, proxyURL string, opts reconcile.Options) (int, *bytes.Buffer, *lockedBuffer, error) {
	t.Helper()
	r := e.st.Ready
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, logs := &bytes.Buffer{}, &lockedBuffer{}
	code, err := reconcile.Run(ctx, reconcile.Config{LockURL: r.LockURL, PaymentURL: r.PaymentURL, ProxyURL: proxyURL, RailURL: r.RailURL,
		Token: r.Tokens.Reconciler, RailToken: r.Tokens.Reconciler, RailReportToken: r.Tokens.Operator,
		Once: true, JSON: true, Out: out, Logger: slog.New(slog.NewJSONHandler(logs, nil)), Options: opts})
	return code, out, logs, err
}

// wantStillAmbiguous requires payout id to be RAIL_AMBIGUOUS still.
func (e *testBundle) wantStillAmbiguous(t *testing.T, id string) {
	t.Helper()
	got, err := e.pay.Payout(ctxT(t), id)
	if err != nil || got.State != pc.RailAmbiguous {
		t.Fatalf("payout %s: %v %s, want still RAIL_AMBIGUOUS", id, err, got.State)
	}
}

// An ambiguous payout the pass could not look at (the proxy cannot reach
// the rail) does not make a clean pass: its money stays held while a
// working system would release or post it. The checks still run and the
// report is printed; the run exits 2.
func TestAResolutionThatCouldNotRunIsNotClean(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.reportedAmbiguous(t, e.newPayout(t, acc, 43))
	front := e.proxyFront(t, func(req *http.Request) bool { return strings.HasSuffix(req.URL.Path, "/lookup") })
	code, out, logs, err := e.runOnce(t, front.URL, reconcile.Options{Owner: "lookup-down", Resolve: true})
	if code != reconcile.ExitCannotRun || !errors.Is(err, reconcile.ErrCannotRun) || !strings.Contains(err.Error(), "ambiguous payout") {
		t.Fatalf("exit %d, %v; want exit 2 saying ambiguous payouts could not be resolved", code, err)
	}
	var rep struct {
		Unresolved []reconcile.Pending `json:"unresolved"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("the report was not printed: %v\n%s", err, out.String())
	}
	left := false
	for _, u := range rep.Unresolved {
		left = left || (u.PayoutID == p.ID && strings.Contains(u.Reason, "the rail could not be asked"))
	}
	if !left {
		t.Fatalf("payout %s not in the report as left because the rail could not be asked: %+v", p.ID, rep.Unresolved)
	}
	if !strings.Contains(logs.String(), "checked everything, but part of it failed") {
		t.Fatalf("no ERROR saying the resolution failed:\n%s", logs.String())
	}
	e.wantStillAmbiguous(t, p.ID)
}

// A pass that stops partway still logs what it found before it stopped: a
// finding of one half of the pass is not lost when the other half fails.
// Here the books find a balance drift, and then the proxy's submissions
// cannot be read (held until the books have moved on to the high-water
// marks, after their finding).
func TestAPassThatStopsLogsWhatItFound(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 500)
	e.exec(t, "paydb", false, `UPDATE account SET balance = balance + 100 WHERE id = $1`, acc)
	// The submissions are held until the books have asked for the
	// high-water marks, after their finding, and then refused.
	booksDone := make(chan struct{})
	var once sync.Once
	front := e.proxyFront(t, func(req *http.Request) bool {
		switch req.URL.Path {
		case "/v1/high-water":
			once.Do(func() { close(booksDone) })
		case "/v1/submission-digests":
			select {
			case <-booksDone:
			case <-time.After(time.Minute):
			}
			return true
		}
		return false
	})
	code, out, logs, err := e.runOnce(t, front.URL, reconcile.Options{Owner: "submissions-down"})
	if code != reconcile.ExitCannotRun || !errors.Is(err, reconcile.ErrCannotRun) {
		t.Fatalf("exit %d, %v; want exit 2", code, err)
	}
	if out.Len() != 0 {
		t.Fatalf("an incomplete pass printed a report, which would read as complete: %s", out.String())
	}
	l := logs.String()
	if !strings.Contains(l, "reconciliation pass could not run") {
		t.Fatalf("no ERROR saying the pass could not run:\n%s", l)
	}
	if logs.lines(`"msg":"reconcile finding"`, reconcile.CheckBalanceDrift, acc) == 0 {
		t.Fatalf("the balance drift the pass found before it stopped was not logged:\n%s", l)
	}
}

// A payout's ambiguity is as old as its entry into RAIL_AMBIGUOUS, as the
// payment resource's abandon gate measures it, not as its submission: a
// payout submitted 25 hours ago (a later holder resubmitted it, D-4) and
// ambiguous for seconds is neither past the SLA (an abandon would be
// refused) nor past the settlement window.
func TestAmbiguityIsMeasuredFromItsEntryIntoRailAmbiguous(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.reportedAmbiguous(t, e.newPayout(t, acc, 42))
	e.exec(t, "paydb", true, `UPDATE payout SET submitted_at = now() - interval '25 hours' WHERE id = $1`, p.ID)
	rep := pass(t, e.reconciler(t, reconcile.Options{Resolve: true, AmbiguitySLA: 24 * time.Hour, SettlementWindow: time.Hour}, e.st.Ready.Tokens.Operator))
	mustNotFind(t, rep, reconcile.CheckAmbiguousOverSLA, map[string]any{"payout_id": p.ID})
	if !leftWith(rep, p.ID, "less than the settlement window") {
		t.Fatalf("payout %s ambiguous for seconds was not left for the settlement window: %+v", p.ID, rep.Unresolved)
	}
	g := e.grant(t, acc)
	_, err := e.pay.Abandon(ctxT(t), p.ID, g.Token, g.Holder(), "test: within the SLA")
	e.release(t, g)
	if err == nil {
		t.Fatal("the payment resource abandoned a payout ambiguous for seconds")
	}

	e.exec(t, "paydb", true, `UPDATE payout_event SET at = now() - interval '25 hours' WHERE payout_id = $1 AND to_state = 'RAIL_AMBIGUOUS'`, p.ID)
	rep = pass(t, e.reconciler(t, reconcile.Options{AmbiguitySLA: 24 * time.Hour}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV02, reconcile.CheckAmbiguousOverSLA, map[string]any{"payout_id": p.ID})
}

// sickLock hands out leases whose session is in jeopardy (a keepalive
// failed): no new step may start under them (D-11).
type sickLock struct{ reconcile.LockService }

func (l sickLock) Acquire(ctx context.Context, key string, wait time.Duration) (reconcile.Lease, bool, error) {
	lease, held, err := l.LockService.Acquire(ctx, key, wait)
	lease.Healthy = func() bool { return false }
	return lease, held, err
}

// A resolution is not written under a grant whose session is in jeopardy:
// the session may expire before the write lands and another holder take
// the account, which would fence the write out (a fenced_out page for a
// benign race). The payout is left for a later pass.
func TestNoResolutionUnderAGrantInJeopardy(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.reportedAmbiguous(t, e.newPayout(t, acc, 45))
	r := e.reconcilerWith(t, reconcile.Options{Resolve: true}, e.st.Ready.Tokens.Operator,
		func(l reconcile.LockService) reconcile.LockService { return sickLock{l} })
	leftUntil(t, r, p.ID, "is no longer healthy")
	e.wantStillAmbiguous(t, p.ID)
}
