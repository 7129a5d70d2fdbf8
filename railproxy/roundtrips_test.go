package railproxy

import (
	"testing"

	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/migrations"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// A submission's transaction is two round trips: BEGIN, guard 2 and the
// intents in one batch, then COMMIT — or ROLLBACK when the guard refused
// the token or no intent was written, leaving the high-water mark as it was.
func TestIntentTransactionRoundTrips(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t, migrations.ProxyDB)
	rt := &pgtest.RoundTrips{}
	st := &store{pool: rt.Pool(t, url)}
	check := pgtest.Conn(t, url)
	ctx := ctxFor(t)
	req := func(id string, token fencing.Token, h fencing.Holder) proxyclient.SubmitRequest {
		s := sub(id, "acc-rt")
		return proxyclient.SubmitRequest{PayoutID: s.PayoutID, AccountID: s.AccountID, Token: token, Holder: h,
			ClientRef: s.ClientRef, Amount: s.Amount, Currency: s.Currency, BeneficiaryRef: s.BeneficiaryRef}
	}
	rows := func() (n int, hwToken int64) {
		t.Helper()
		if err := check.QueryRow(ctx, `SELECT (SELECT count(*) FROM rail_submission),
			COALESCE((SELECT token FROM account_high_water WHERE account_id = 'acc-rt'), 0)`).Scan(&n, &hwToken); err != nil {
			t.Fatal(err)
		}
		return n, hwToken
	}
	step := func(name string, r proxyclient.SubmitRequest, want intentResult, wantRows int, wantHW int64) {
		t.Helper()
		rt.Reset()
		_, _, got, err := st.writeIntent(ctx, r)
		if err != nil || got != want {
			t.Fatalf("%s: result %v %v, want %v", name, got, err, want)
		}
		if n := rt.Count(); n != 2 {
			t.Fatalf("%s: %d round trips, want 2", name, n)
		}
		if n, hw := rows(); n != wantRows || hw != wantHW {
			t.Fatalf("%s: %d rows, high-water %d; want %d, %d", name, n, hw, wantRows, wantHW)
		}
	}
	step("first submission", req("p-1", 5, holder(5)), intentWritten, 1, 5)
	step("a stale token", req("p-2", 4, holder(4)), intentFenced, 1, 5)
	step("already forwarded, higher token", req("p-1", 7, holder(7)), intentExists, 1, 5)

	rt.Reset()
	recs, res, _, fenced, err := st.writeIntents(ctx, []proxyclient.SubmitRequest{req("p-1", 8, holder(8)), req("p-3", 8, holder(8)), req("p-4", 8, holder(8))})
	if err != nil || fenced || res[0] != intentExists || res[1] != intentWritten || res[2] != intentWritten || recs[2].PayoutID != "p-4" {
		t.Fatalf("batch: %v %v %v %v", res, recs, fenced, err)
	}
	if n := rt.Count(); n != 2 {
		t.Fatalf("batch: %d round trips, want 2", n)
	}
	if n, hw := rows(); n != 3 || hw != 8 {
		t.Fatalf("batch: %d rows, high-water %d; want 3, 8", n, hw)
	}
	if s := st.pool.Stat(); s.AcquiredConns() != 0 {
		t.Fatalf("%d connections not given back", s.AcquiredConns())
	}
}
