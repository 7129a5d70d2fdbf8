package payment

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/internal/problem"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// An operator may abandon an ambiguous payout only once the resolution SLA
// has passed: before, the refusal names the age and the SLA and changes
// nothing (the fence included); a reason is always required.
func TestAbandonWaitsForTheResolutionSLA(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *Config) { c.ResolutionSLA = time.Hour })
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 300)
	e.drive(t, "po-1", pc.RailAmbiguous, 5, "holder-a")
	before, err := e.oper.Account(tctx(t), "acc-1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.oper.Abandon(tctx(t), "po-1", 6, "holder-op", "rail silent")
	pe := wantCode(t, err, problem.Conflict)
	var age, sla int64
	if !pe.Extension("ambiguous_for_seconds", &age) || !pe.Extension("resolution_sla_seconds", &sla) || sla != 3600 || age < 0 || age > 600 {
		t.Fatalf("refusal without age and SLA: %v (age %d, sla %d)", err, age, sla)
	}
	if !strings.Contains(pe.Message, "1h0m0s") {
		t.Errorf("refusal does not say the SLA: %q", pe.Message)
	}
	after, err := e.oper.Account(tctx(t), "acc-1")
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("a refused abandon changed the account: %+v -> %+v", before, after)
	}
	if p, _ := e.oper.Payout(tctx(t), "po-1"); p.State != pc.RailAmbiguous {
		t.Fatalf("payout %s after a refused abandon", p.State)
	}
	// Two hours later (the entry into RAIL_AMBIGUOUS moved back in time).
	backdate(t, e, `UPDATE payout_event SET at = at - interval '2 hours' WHERE payout_id = 'po-1' AND to_state = 'RAIL_AMBIGUOUS'`)
	_, err = e.oper.Abandon(tctx(t), "po-1", 6, "holder-op", "  ")
	wantCode(t, err, problem.InvalidRequest)
	p, err := e.oper.Abandon(tctx(t), "po-1", 6, "holder-op", "rail silent past the SLA; finance ticket FIN-7")
	if err != nil || p.State != pc.Abandoned {
		t.Fatalf("abandon after the SLA: %+v %v", p, err)
	}
	if a, _ := e.oper.Account(tctx(t), "acc-1"); a.Available != 1_000 {
		t.Fatalf("available %d after abandon, want the held 300 released", a.Available)
	}
}

// backdate runs sql with the append-only triggers off (how a test moves
// recorded time).
func backdate(t *testing.T, e *testBundle, sql string) {
	t.Helper()
	err := pgx.BeginFunc(tctx(t), e.svc.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(context.Background(), "SET LOCAL session_replication_role = replica"); err != nil {
			return err
		}
		_, err := tx.Exec(context.Background(), sql)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A submission the proxy refused without forwarding ends the payout under
// the grant: RAIL_SUBMITTED -> FAILED, failure_reason rail_refused, the
// proxy's error code kept, the held amount released — instead of staying in
// flight for ever with its money held.
func TestRefusedSubmissionEndsThePayout(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 400)
	e.drive(t, "po-1", pc.RailSubmitted, 5, "holder-a")
	if a, _ := e.exec.Account(tctx(t), "acc-1"); a.Available != 600 {
		t.Fatalf("available %d while in flight, want 600", a.Available)
	}
	_, err := e.exec.Refuse(tctx(t), "po-1", 5, "holder-a", "", "proxy 400")
	wantCode(t, err, problem.InvalidRequest)
	_, err = e.exec.Refuse(tctx(t), "po-1", 4, "holder-old", "invalid_request:beneficiary_ref", "proxy 400")
	wantCode(t, err, problem.FencedOut)
	p, err := e.exec.Refuse(tctx(t), "po-1", 5, "holder-a", "invalid_request:beneficiary_ref", "proxy 400, forwarded=false: beneficiary_ref: longer than 200 bytes")
	if err != nil {
		t.Fatal(err)
	}
	if p.State != pc.Failed || p.FailureReason != pc.FailureRailRefused || p.ErrorCode != "invalid_request:beneficiary_ref" {
		t.Fatalf("refused payout: %+v", p)
	}
	if a, _ := e.exec.Account(tctx(t), "acc-1"); a.Available != 1_000 || a.Balance != 1_000 {
		t.Fatalf("account after the refusal: %+v, want the held 400 released and nothing posted", a)
	}
	// Only a RAIL_SUBMITTED payout can be refused.
	e.payout(t, "po-2", "acc-1", 1)
	_, err = e.exec.Refuse(tctx(t), "po-2", 5, "holder-a", "invalid_request:x", "proxy 400")
	wantCode(t, err, problem.InvalidTransition)
	e.assertLedger(t)
}

// The payment resource accepts at creation only what every later role
// accepts (one set of field limits): a beneficiary reference the proxy and
// the rail refuse is refused here, before the payout exists.
func TestCreationUsesTheSharedFieldLimits(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	_, err := e.oper.CreatePayout(tctx(t), pc.CreatePayoutRequest{ID: "po-long", AccountID: "acc-1", Amount: 1, Currency: "EUR", BeneficiaryRef: strings.Repeat("b", 201)})
	if pe := wantCode(t, err, problem.InvalidRequest); !strings.Contains(pe.Message, "beneficiary_ref") {
		t.Fatalf("refusal does not name the field: %v", err)
	}
	if _, err := e.oper.CreatePayout(tctx(t), pc.CreatePayoutRequest{ID: "po-200", AccountID: "acc-1", Amount: 1, Currency: "EUR", BeneficiaryRef: strings.Repeat("b", 200)}); err != nil {
		t.Fatalf("a 200-byte beneficiary_ref: %v", err)
	}
}

// GET /work leaves out the accounts an executor asks it to skip, so
// accounts that cannot progress never fill the page and starve the rest.
func TestWorkSkipsAccountsThatCannotProgress(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var stuck []string
	for i := range 6 {
		acc := "acc-stuck-" + string(rune('a'+i))
		e.account(t, acc, 1_000)
		e.payout(t, "po-"+acc, acc, 1)
		e.drive(t, "po-"+acc, pc.RailSubmitted, 5, "holder-a")
		stuck = append(stuck, acc)
	}
	e.account(t, "acc-fresh", 1_000)
	e.payout(t, "po-fresh", "acc-fresh", 1)
	page, err := e.exec.Work(tctx(t), 4)
	if err != nil || len(page) != 4 {
		t.Fatalf("work: %+v %v", page, err)
	}
	for _, w := range page {
		if w.AccountID == "acc-fresh" {
			t.Fatalf("the newest account came before the oldest stuck ones: %+v", page)
		}
	}
	page, err = e.exec.WorkSkipping(tctx(t), 4, stuck)
	if err != nil || len(page) != 1 || page[0].AccountID != "acc-fresh" {
		t.Fatalf("work skipping the stuck accounts: %+v %v, want acc-fresh", page, err)
	}
	if _, err := e.exec.WorkSkipping(tctx(t), 4, []string{"a\x00b"}); !problem.Has(err, problem.InvalidRequest) {
		t.Fatalf("skip with a NUL: %v, want invalid_request", err)
	}
}
