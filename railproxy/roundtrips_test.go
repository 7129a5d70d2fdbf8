package railproxy

import (
	"fmt"
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

// A batch's intents are one INSERT statement behind the guard; each item is
// mapped back to its own row by payout id, whatever order the rows come in,
// and an item whose payout already has a forwarded submission is
// intentExists.
func TestBatchIntentsInOneStatement(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t, migrations.ProxyDB)
	l := &statementLog{}
	st := &store{pool: l.pool(t, url)}
	ctx := ctxFor(t)
	recs, res, _, fenced, err := st.writeIntents(ctx, batchReqs("acc-i", 3, "p-1", "p-2", "p-3", "p-4", "p-5"))
	if err != nil || fenced {
		t.Fatalf("first batch: %v %v", fenced, err)
	}
	for i, r := range recs {
		if res[i] != intentWritten || r.PayoutID != fmt.Sprintf("p-%d", i+1) || r.AccountID != "acc-i" || r.FenceToken != 3 || r.Holder != holder(3) {
			t.Fatalf("item %d: %v %+v", i, res[i], r)
		}
	}
	if n := l.count("INSERT INTO rail_submission"); n != 1 {
		t.Fatalf("%d intent statements for 5 intents, want 1", n)
	}
	l.reset()
	reqs := batchReqs("acc-i", 4, "p-9", "p-2", "p-7", "p-5", "p-6")
	recs, res, _, fenced, err = st.writeIntents(ctx, reqs)
	if err != nil || fenced {
		t.Fatalf("second batch: %v %v", fenced, err)
	}
	want := []intentResult{intentWritten, intentExists, intentWritten, intentExists, intentWritten}
	for i := range reqs {
		if res[i] != want[i] || (res[i] == intentWritten && recs[i].PayoutID != reqs[i].PayoutID) {
			t.Fatalf("item %d (%s): %v %+v, want %v", i, reqs[i].PayoutID, res[i], recs[i], want[i])
		}
	}
	if n := l.count("INSERT INTO rail_submission"); n != 1 {
		t.Fatalf("%d intent statements for 5 intents, want 1", n)
	}
	if n := l.count("account_high_water"); n != 1 {
		t.Fatalf("%d guard statements, want 1", n)
	}
}
