package railproxy

import (
	"testing"

	"github.com/payouts/payouts/dev/querytest"
)

// TestReadsRefuseUnknownAndRepeatedQueryParameters: every read of the rail
// proxy refuses a query parameter it does not take (limt=5, a typo that
// was read as "the default page") and one given twice (limit=5&limit=500,
// read as whichever one the parser kept), with 400 invalid_request naming
// the parameter in field.
func TestReadsRefuseUnknownAndRepeatedQueryParameters(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	if _, err := b.pc.Submit(ctxFor(t), sub("p-1", "acc-1"), 3, holder(1)); err != nil {
		t.Fatal(err)
	}
	limit := querytest.Param{Name: "limit", A: "5", B: "500"}
	afterID := querytest.Param{Name: "after", A: "0", B: "1"}
	querytest.Check(t, b.url, reconcilerBearer, []querytest.Read{
		{Path: "/v1/submissions", Params: []querytest.Param{afterID, limit}},
		{Path: "/v1/submissions/p-1", Params: []querytest.Param{{Name: "all", A: "true", B: "false"}}},
		{Path: "/v1/submission-digests", Params: []querytest.Param{{Name: "after", A: "p-0:0", B: "p-1:1"}, {Name: "limit", A: "5", B: "5000"}}},
		{Path: "/v1/submission-order", Params: []querytest.Param{afterID, {Name: "limit", A: "5", B: "5000"}}},
		{Path: "/v1/safety-events", Params: []querytest.Param{afterID, limit}},
		{Path: "/v1/fences/high"},
		{Path: "/v1/high-water", Params: []querytest.Param{{Name: "after", A: "a", B: "b"}, limit}},
	})
}
