package rail

import (
	"testing"

	"github.com/payouts/payouts/dev/querytest"
)

// TestReadsRefuseUnknownAndRepeatedQueryParameters: the rail stub's reads
// refuse a query parameter they do not take and one given twice
// (client_ref=a&client_ref=b was read as a), with 400 invalid_request
// naming the parameter in field.
func TestReadsRefuseUnknownAndRepeatedQueryParameters(t *testing.T) {
	t.Parallel()
	_, url, _ := serveRail(t, Config{})
	querytest.Check(t, url, operatorToken, []querytest.Read{
		{Path: "/v1/settlement-report", Params: []querytest.Param{{Name: "after", A: "", B: "r-1"}, {Name: "limit", A: "5", B: "500"}}},
		{Path: "/v1/faults"},
	})
	querytest.Check(t, url, reconcilerToken, []querytest.Read{
		{Path: "/v1/payments", Params: []querytest.Param{{Name: "client_ref", A: "r-1", B: "r-2"}}},
	})
}
