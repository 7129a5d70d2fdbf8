package reconcile

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/payouts/payouts/internal/problem"

	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// The rail's evidence fits a payout only when the proxy's submission is
// the payout's and every payment the rail settled for it is of its amount
// and currency; declined payments say nothing of the amount paid.
func TestMismatchSaysWhatDoesNotFitThePayout(t *testing.T) {
	cur := pc.Payout{ID: "p-1", Amount: 100, Currency: "EUR", ClientRef: "ref-p-1"}
	sub := proxyclient.Record{ID: 7, PayoutID: "p-1", Amount: 100, Currency: "EUR", ClientRef: "ref-p-1"}
	paid := proxyclient.RailPayment{RailRef: "r-1", ClientRef: "ref-p-1", Amount: 100, Currency: "EUR", Status: railclient.StatusSettled}
	declined := proxyclient.RailPayment{RailRef: "r-2", ClientRef: "ref-p-1", Amount: 900, Currency: "EUR", Status: railclient.StatusDeclined}
	with := func(change func(*proxyclient.LookupResult)) proxyclient.LookupResult {
		lk := proxyclient.LookupResult{Submission: sub, RailItems: []proxyclient.RailPayment{paid, declined}}
		change(&lk)
		return lk
	}
	for _, c := range []struct {
		name string
		lk   proxyclient.LookupResult
		want string // "" fits
	}{
		{"fits", with(func(*proxyclient.LookupResult) {}), ""},
		{"no rail payment", with(func(lk *proxyclient.LookupResult) { lk.RailItems = nil }), ""},
		{"submission amount", with(func(lk *proxyclient.LookupResult) { lk.Submission.Amount = 500 }), "is not the payout's"},
		{"submission currency", with(func(lk *proxyclient.LookupResult) { lk.Submission.Currency = "USD" }), "is not the payout's"},
		{"submission reference", with(func(lk *proxyclient.LookupResult) { lk.Submission.ClientRef = "ref-other" }), "is not the payout's"},
		{"submission payout", with(func(lk *proxyclient.LookupResult) { lk.Submission.PayoutID = "p-2" }), "is not the payout's"},
		{"settled amount", with(func(lk *proxyclient.LookupResult) { lk.RailItems[0].Amount = 500 }), "the rail settled 500 EUR"},
		{"settled currency", with(func(lk *proxyclient.LookupResult) { lk.RailItems[0].Currency = "USD" }), "the rail settled 100 USD"},
	} {
		got := mismatch(cur, c.lk)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: mismatch = %q, want %q", c.name, got, c.want)
		}
	}
}

// The payment resource's verdict on a resolution leaves the payout; an
// answer that is none (a proxy's 429 or 503 in front of it, a 5xx, no
// answer) or a refused credential is a failure the run reports (exit 2).
func TestRefusedIsTheResourcesVerdictOnly(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"conflict", problem.New(problem.Conflict, "no"), true},
		{"invalid transition", problem.New(problem.InvalidTransition, "no"), true},
		{"a proxy's 429", problem.DecodeBody(http.StatusTooManyRequests, []byte("slow down")), false},
		{"unavailable", problem.New(problem.Unavailable, "down"), false},
		{"no answer", errors.New("connection reset"), false},
		{"forbidden", problem.New(problem.Forbidden, "role"), false},
		{"unauthorized", problem.New(problem.Unauthorized, "token"), false},
	} {
		if got := refused(c.err); got != c.want {
			t.Errorf("%s: refused = %v, want %v", c.name, got, c.want)
		}
	}
}
