package reconcile

import (
	"strings"
	"testing"

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
