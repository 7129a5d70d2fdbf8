package payment

import (
	"testing"

	"github.com/payouts/payouts/dev/querytest"
)

// TestReadsRefuseUnknownAndRepeatedQueryParameters: every read of the
// payment resource refuses a query parameter it does not take (limt=5, a
// typo that was read as "the default page") and one given twice
// (limit=5&limit=500, read as whichever one the parser kept), with 400
// invalid_request naming the parameter in field; skip, given once per
// account, is the one parameter that repeats.
func TestReadsRefuseUnknownAndRepeatedQueryParameters(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 100)
	limit := querytest.Param{Name: "limit", A: "5", B: "500"}
	bulkLimit := querytest.Param{Name: "limit", A: "5", B: "5000"}
	afterKey := querytest.Param{Name: "after", A: "a", B: "b"}
	afterID := querytest.Param{Name: "after", A: "0", B: "1"}
	querytest.Check(t, e.url, operatorBearer, []querytest.Read{
		{Path: "/v1/accounts", Params: []querytest.Param{afterKey, limit}},
		{Path: "/v1/accounts/acc-1"},
		{Path: "/v1/accounts/acc-1/ledger-sum"},
		{Path: "/v1/payouts", Params: []querytest.Param{afterKey, limit,
			{Name: "state", A: "PENDING", B: "POSTED,FAILED"}, {Name: "account_id", A: "acc-1", B: "acc-2"}}},
		{Path: "/v1/payouts/po-1"},
		{Path: "/v1/payouts/po-1/events", Params: []querytest.Param{afterID, limit}},
		{Path: "/v1/payout-digests", Params: []querytest.Param{afterKey, bulkLimit}},
		{Path: "/v1/work", Params: []querytest.Param{limit, {Name: "wait_ms", A: "0", B: "1"}, {Name: "payouts", A: "0", B: "10"}},
			Repeatable: []querytest.Param{{Name: "skip", A: "acc-2", B: "acc-3"}}},
		{Path: "/v1/ledger", Params: []querytest.Param{afterID, bulkLimit}},
		{Path: "/v1/safety-events", Params: []querytest.Param{afterID, limit}},
		{Path: "/v1/terminal-exits", Params: []querytest.Param{afterID, limit}},
		{Path: "/v1/fences/high"},
	})
}
