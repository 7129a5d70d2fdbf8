package railproxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// unknownStatusRail is a rail whose final lookup of any client reference
// holds one payment of it with status "pending": neither settled nor
// declined. Its POST /payments answers 500 (money may have moved) and
// counts the calls.
func unknownStatusRail(t *testing.T, clientRef string) (string, *atomic.Int32) {
	t.Helper()
	var pays atomic.Int32
	rail := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Method == http.MethodPost {
			pays.Add(1)
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"items":[{"rail_ref":"r-1","client_ref":"` + clientRef +
			`","amount":1250,"currency":"EUR","beneficiary_ref":"ben","status":"pending","at":"2026-12-07T00:00:00Z"}],"final":true}`))
	}))
	t.Cleanup(rail.Close)
	return rail.URL, &pays
}

// A resubmission (proxydb lost the payout's row) whose client reference
// the rail holds a payment of in a status the proxy does not know is
// neither sent again nor recorded from that payment: it is answered 503
// with forwarded: false, as when the rail's answer is not final.
func TestResubmissionIsNotSentWhileTheRailHoldsAPaymentOfUnknownStatus(t *testing.T) {
	t.Parallel()
	s := sub("p-unknown", "acc-unknown")
	url, pays := unknownStatusRail(t, s.ClientRef)
	b := setup(t, options{railURL: url, railTimeout: 5 * time.Second})
	s.Resubmission = true
	rec, err := b.pc.Submit(ctxFor(t), s, 3, holder(1))
	if pays.Load() != 0 {
		t.Fatalf("the resubmission was sent to the rail (%d call(s)) while the rail holds a pending payment of its reference; answer %+v, %v", pays.Load(), rec, err)
	}
	if !proxyclient.PausedUnforwarded(err) || !strings.Contains(err.Error(), "neither settled nor declined") {
		t.Fatalf("answer %+v, %v; want 503 unavailable, forwarded false, saying the rail's payment is neither settled nor declined", rec, err)
	}
	if all, err := b.pc.GetAll(ctxFor(t), s.PayoutID); len(all) > 0 || (err != nil && !problem.Has(err, problem.NotFound)) {
		t.Fatalf("the resubmission was recorded: %+v, %v", all, err)
	}
}

// A TIMEOUT submission whose client reference the rail holds a payment of
// in a status the proxy does not know is not resolved ABSENT on the rail's
// final answer: that payment may still settle.
func TestLookupDoesNotResolveAPaymentOfUnknownStatus(t *testing.T) {
	t.Parallel()
	s := sub("p-unknown", "acc-unknown")
	url, _ := unknownStatusRail(t, s.ClientRef)
	b := setup(t, options{railURL: url, railTimeout: 5 * time.Second})
	rec, err := b.pc.Submit(ctxFor(t), s, 3, holder(1))
	if err != nil || rec.Outcome != proxyclient.OutcomeTimeout {
		t.Fatalf("submit: %+v %v, want TIMEOUT", rec, err)
	}
	l, err := b.recon.Lookup(ctxFor(t), s.PayoutID)
	if err != nil {
		t.Fatal(err)
	}
	if l.Recorded || l.Resolution != proxyclient.ResolutionNone || !strings.Contains(l.Detail, "neither settled nor declined") {
		t.Fatalf("lookup %+v: want nothing recorded and no resolution while the rail's payment is pending", l)
	}
	got, err := b.pc.Get(ctxFor(t), s.PayoutID)
	if err != nil || got.Resolution != proxyclient.ResolutionNone {
		t.Fatalf("submission %+v %v: want no resolution recorded", got, err)
	}
}
