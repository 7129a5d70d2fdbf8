//go:build !negativecontrol

package railproxy

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/migrations"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// The tests here need guard 2's fence condition, which the negativecontrol
// build compiles out (negativecontrol_test.go covers that build).

// A submission refused for its input says so, with the evidence the
// executor needs to end the payout: invalid_request, "forwarded": false,
// the payout and the field — and nothing reached the proxy's store or the
// rail. Other refusals are never mistaken for it.
func TestRefusalWithoutForwardingSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := ctxFor(t)
	long := sub("p-long", "acc-1")
	long.BeneficiaryRef = strings.Repeat("b", 201)
	_, err := b.pc.Submit(ctx, long, 5, holder(1))
	var pe *problem.Error
	if !proxyclient.RefusedUnforwarded(err) || !errors.As(err, &pe) {
		t.Fatalf("over-long beneficiary_ref: %v, want invalid_request with forwarded=false", err)
	}
	var payout, field string
	if !pe.Extension("payout_id", &payout) || payout != "p-long" || !pe.Extension("field", &field) || field != "beneficiary_ref" {
		t.Fatalf("refusal evidence: payout %q field %q, want p-long and beneficiary_ref", payout, field)
	}
	if _, err := b.pc.Get(ctx, "p-long"); !problem.Has(err, problem.NotFound) {
		t.Fatalf("GET after the refusal: %v, want not_found (never forwarded)", err)
	}
	if got := b.atRail(t, "po-p-long"); len(got) != 0 {
		t.Fatalf("a refused submission reached the rail: %+v", got)
	}
	// A payout id no payout can have is refused and not echoed back whole.
	huge := sub(strings.Repeat("p", 100_000), "acc-1")
	_, err = b.pc.Submit(ctx, huge, 5, holder(1))
	if !proxyclient.RefusedUnforwarded(err) || !errors.As(err, &pe) {
		t.Fatalf("100 kB payout_id: %v, want invalid_request with forwarded=false", err)
	}
	if pe.Extension("payout_id", &payout) || len(err.Error()) > 2000 {
		t.Fatalf("100 kB payout_id: the refusal echoes it (%d bytes, payout_id member %d bytes)", len(err.Error()), len(payout))
	}
	if _, err := b.pc.Submit(ctx, sub("p-ok", "acc-1"), 5, holder(1)); err != nil {
		t.Fatal(err)
	}
	_, err = b.pc.Submit(ctx, sub("p-stale", "acc-1"), 4, holder(2))
	if !problem.Has(err, problem.FencedOut) || proxyclient.RefusedUnforwarded(err) {
		t.Fatalf("stale token: %v; fenced_out must not read as a refusal of the input", err)
	}
	_, err = b.pc.Submit(ctx, sub("p-ok", "acc-1"), 5, holder(1))
	if !problem.Has(err, problem.SubmissionExists) || proxyclient.RefusedUnforwarded(err) {
		t.Fatalf("duplicate: %v; submission_exists must not read as a refusal of the input", err)
	}
}

// A submission's transaction is two round trips: BEGIN, guard 2 and the
// intents in one batch, then COMMIT — or ROLLBACK when the guard refused
// the token or no intent was written, leaving the high-water mark as it was.
func TestIntentTransactionRoundTrips(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t, migrations.ProxyDB)
	rt := &pgtest.RoundTrips{}
	st := newStore(rt.Pool(t, url), nil)
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

// GET /submission-digests pages through every attempt ordered by payout id
// (byte order), then attempt id: a payout's FENCED attempts and its
// forwarded one come together, and a page boundary between them loses
// nothing.
func TestSubmissionDigestsPageByPayout(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := ctxFor(t)
	if _, err := b.pc.Submit(ctx, sub("p-x", "acc-1"), fencingToken(5), holder(5)); err != nil {
		t.Fatal(err)
	}
	// A stale token on acc-1: recorded FENCED, never forwarded.
	if _, err := b.pc.Submit(ctx, sub("p-a", "acc-1"), fencingToken(3), holder(3)); err == nil {
		t.Fatal("a stale token was not fenced out")
	}
	for _, s := range []struct {
		payout string
		token  int
	}{{"p-a", 6}, {"p-B", 7}} {
		if _, err := b.pc.Submit(ctx, sub(s.payout, "acc-1"), fencingToken(s.token), holder(s.token)); err != nil {
			t.Fatal(err)
		}
	}
	type row struct {
		payout  string
		outcome proxyclient.Outcome
		token   int64
	}
	var got []row
	after := ""
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatalf("paging does not end: %v", got)
		}
		page, err := b.recon.SubmissionDigests(ctx, after, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range page.Items {
			if d.AccountID != "acc-1" || d.Holder == "" || d.ID == 0 {
				t.Errorf("digest %+v does not carry the attempt", d)
			}
			out := d.Outcome
			if out != proxyclient.OutcomeFenced {
				out = "forwarded"
			}
			got = append(got, row{d.PayoutID, out, int64(d.FenceToken)})
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	want := []row{{"p-B", "forwarded", 7}, {"p-a", proxyclient.OutcomeFenced, 3}, {"p-a", "forwarded", 6}, {"p-x", "forwarded", 5}}
	if !slices.Equal(got, want) {
		t.Fatalf("digests %v, want %v", got, want)
	}
}

// GET /submission-order pages through the forwarded submissions in id
// order (per account, the order they committed in), FENCED attempts left
// out, with the token each was forwarded under.
func TestSubmissionOrderPagesForwardedInIDOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := ctxFor(t)
	for _, s := range []struct {
		payout, account string
		token           int
	}{{"p-z", "acc-1", 5}, {"p-a", "acc-2", 2}, {"p-m", "acc-1", 3}, {"p-b", "acc-1", 6}} {
		_, err := b.pc.Submit(ctx, sub(s.payout, s.account), fencingToken(s.token), holder(s.token))
		if fenced := s.token < 5 && s.account == "acc-1"; fenced != (err != nil) {
			t.Fatalf("submit %s under %d: %v", s.payout, s.token, err)
		}
	}
	var got []string
	var after int64
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatalf("paging does not end: %v", got)
		}
		page, err := b.recon.SubmissionOrder(ctx, after, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range page.Items {
			if o.ID <= after {
				t.Fatalf("id %d after cursor %d: not in id order", o.ID, after)
			}
			after = o.ID
			got = append(got, fmt.Sprintf("%s/%s/%d", o.PayoutID, o.AccountID, o.FenceToken))
		}
		if page.Next == "" {
			break
		}
	}
	if want := []string{"p-z/acc-1/5", "p-a/acc-2/2", "p-b/acc-1/6"}; !slices.Equal(got, want) {
		t.Fatalf("forwarded submissions in order %v, want %v", got, want)
	}
}

// A batch under a stale token is refused whole, as a single submission is:
// 409 fenced_out, nothing forwarded, no intent written. Its evidence: a
// FENCED row for each item (D-5: a postmortem of any of its payouts shows
// the stale holder tried to send it), and one fenced_out event for the one
// refusal.
func TestBatchFencedForwardsNothingAndLeavesEvidence(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := ctxFor(t)
	if _, err := b.pc.Submit(ctx, sub("p-0", "acc-f"), 10, holder(1)); err != nil {
		t.Fatal(err)
	}
	res, err := b.pc.SubmitBatch(ctx, "acc-f", 5, holder(2), batchItems("acc-f", "p-a", "p-b", "p-c"))
	var pe *problem.Error
	if !problem.Has(err, problem.FencedOut) || res != nil {
		t.Fatalf("stale batch: %+v %v, want fenced_out and no items", res, err)
	}
	if pe = problem.From(err); pe.Status() != http.StatusConflict || pe.StoredToken != 10 || pe.PresentedToken != 5 {
		t.Fatalf("fenced_out answer: %+v, want 409 with presented 5 and stored 10", pe)
	}
	for _, id := range []string{"p-a", "p-b", "p-c"} {
		if got := b.atRail(t, "po-"+id); len(got) != 0 {
			t.Fatalf("%s reached the rail from a fenced batch: %+v", id, got)
		}
	}
	if n := countKind(b.safetyEvents(t), proxyclient.KindFencedOut); n != 1 {
		t.Fatalf("fenced_out events: %d, want 1 for the whole batch", n)
	}
	for _, id := range []string{"p-a", "p-b", "p-c"} {
		rec, err := b.pc.Get(ctx, id)
		if err != nil || rec.Outcome != proxyclient.OutcomeFenced || rec.FenceToken != 5 || rec.Holder != holder(2) {
			t.Fatalf("evidence row of %s in the fenced batch: %+v %v, want FENCED at token 5 by %s", id, rec, err, holder(2))
		}
	}
	if hw, _ := b.highWater(t, "acc-f"); hw.Token != 10 || hw.Holder != holder(1) {
		t.Fatalf("high-water after the fenced batch: %+v, want 10 by %s", hw, holder(1))
	}
}
