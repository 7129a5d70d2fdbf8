package payment

import (
	"fmt"
	"sync"
	"testing"

	dto "github.com/prometheus/client_model/go"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

// Creations that arrive while others are being written go out together,
// in one statement, and each gets its own answer.
func TestCreationsArrivingDuringAWriteShareAStatement(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000_000)
	ctx := tctx(t)
	req := func(id string) pc.CreatePayoutRequest {
		return pc.CreatePayoutRequest{ID: id, AccountID: "acc-1", Amount: 7, Currency: "EUR", BeneficiaryRef: "b-" + id}
	}
	// An open transaction holding two payout ids makes the creates of
	// those ids wait: both batch slots are then busy writing.
	block, err := e.svc.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer block.Rollback(ctx) //nolint:errcheck // rolled back below
	var wg sync.WaitGroup
	create := func(id string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, created, err := e.svc.CreatePayout(ctx, req(id), "operator:alice")
			if err != nil || !created || p.ID != id || p.State != pc.Pending || p.Amount != 7 || p.BeneficiaryRef != "b-"+id {
				t.Errorf("create %s: %+v %v %v", id, p, created, err)
			}
		}()
	}
	for i := range createBatchesInFlight {
		id := fmt.Sprintf("po-block-%d", i)
		if _, err := block.Exec(ctx, `INSERT INTO payout (id, account_id, amount, currency, beneficiary_ref, client_ref)
			VALUES ($1, 'acc-1', 7, 'EUR', $2, $3)`, id, "b-"+id, pc.ClientRef(id)); err != nil {
			t.Fatal(err)
		}
		create(id)
		waitFor(t, "the create of "+id+" to wait on the open transaction", func() bool {
			var waiting int
			err := e.svc.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'WITH r AS%'`).Scan(&waiting)
			return err == nil && waiting == i+1
		})
	}
	const queued = 20
	for i := range queued {
		create(fmt.Sprintf("po-%02d", i))
	}
	waitFor(t, "the creates to queue", func() bool { return e.svc.creates.Waiting() == queued })
	if err := block.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	var m dto.Metric
	if err := e.svc.m.createBatch.Write(&m); err != nil {
		t.Fatal(err)
	}
	h := m.GetHistogram()
	if want := createBatchesInFlight + 1; int(h.GetSampleCount()) != want || int(h.GetSampleSum()) != createBatchesInFlight+queued {
		t.Fatalf("%d statements for %v payouts, want %d statements for %d", h.GetSampleCount(), h.GetSampleSum(), want, createBatchesInFlight+queued)
	}
	if n := e.counts(t)["payout"]; n != createBatchesInFlight+queued {
		t.Fatalf("%d payouts stored, want %d", n, createBatchesInFlight+queued)
	}
}

// In one batch, a repeated id is answered as the replay of its first
// create, and a payout the database refuses fails alone.
func TestOneBatchReplaysRepeatedIdsAndIsolatesARefusedPayout(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	ok := pc.CreatePayoutRequest{ID: "po-1", AccountID: "acc-1", Amount: 5, Currency: "EUR", BeneficiaryRef: "b"}
	other := ok
	other.ID = "po-2"
	bad := ok
	bad.ID, bad.Amount = "po-bad", 0 // refused by the payout table's CHECK
	unknown := ok
	unknown.ID, unknown.AccountID = "po-3", "acc-none"
	reqs := []createRequest{{ok, "a"}, {ok, "b"}, {bad, "a"}, {other, "a"}, {unknown, "a"}}
	ans, err := e.svc.createPayouts(tctx(t), reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"created", "exists", "", "created", "none"} {
		a := ans[i]
		if (a.err != nil) != (want == "") || a.err == nil && a.outcome != want {
			t.Fatalf("answer %d (%s): %q %v, want %q", i, reqs[i].req.ID, a.outcome, a.err, want)
		}
	}
	if ans[1].payout.ID != "po-1" || ans[1].payout.State != pc.Pending || ans[4].currency != nil {
		t.Fatalf("replay %+v, unknown account's currency %v", ans[1].payout, ans[4].currency)
	}
	if n := e.counts(t)["payout"]; n != 2 {
		t.Fatalf("%d payouts stored, want 2", n)
	}
	var events int
	if err := e.svc.pool.QueryRow(tctx(t), `SELECT count(*) FROM payout_event WHERE reason = 'created'`).Scan(&events); err != nil || events != 2 {
		t.Fatalf("%d creation events, %v; want 2", events, err)
	}
}
