package railproxy

import (
	"fmt"
	"testing"

	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/migrations"
)

// A batch's intents are one INSERT statement behind the guard; each item is
// mapped back to its own row by payout id, whatever order the rows come in,
// and an item whose payout already has a forwarded submission is
// intentExists.
func TestBatchIntentsInOneStatement(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t, migrations.ProxyDB)
	l := &statementLog{}
	st := newStore(l.pool(t, url), nil)
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
