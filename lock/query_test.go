package lock_test

import (
	"testing"

	"github.com/payouts/payouts/dev/querytest"
	"github.com/payouts/payouts/lock/lockclient"
)

// TestReadsRefuseUnknownAndRepeatedQueryParameters: every read of the lock
// service refuses a query parameter it does not take (limt=5, a typo that
// was read as "the default page") and one given twice (limit=5&limit=500,
// read as whichever one the parser kept), with 400 invalid_request naming
// the parameter in field.
func TestReadsRefuseUnknownAndRepeatedQueryParameters(t *testing.T) {
	forEachBackend(t, func(t *testing.T, kind string) {
		svc := setup(t, kind).svc
		ctx := testCtx(t)
		s, err := lockclient.Open(ctx, svc.URL, "reader", lockclient.WithToken(executorToken))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		if _, err := s.TryAcquire(ctx, "payout:acc-1"); err != nil {
			t.Fatal(err)
		}
		limit := querytest.Param{Name: "limit", A: "5", B: "500"}
		querytest.Check(t, svc.URL, executorToken, []querytest.Read{
			{Path: "/v1/sessions/" + s.ID()},
			{Path: "/v1/locks", Params: []querytest.Param{{Name: "prefix", A: "payout:", B: ""}, limit}},
			{Path: "/v1/locks/payout:acc-1"},
			{Path: "/v1/grants", Params: []querytest.Param{{Name: "after_token", A: "0", B: "1"}, limit}},
			{Path: "/v1/tokens/high"},
		})
	})
}
