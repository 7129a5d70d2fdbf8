package payment

import (
	"strings"
	"testing"

	"github.com/payouts/payouts/internal/problem"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// GET /payouts?state= takes several states at once, so a worker learns an
// account's in-flight payouts in one call instead of one call per state.
func TestListPayoutsInSeveralStates(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.account(t, "acc-2", 1_000)
	for _, id := range []string{"po-1", "po-2", "po-3"} {
		e.payout(t, id, "acc-1", 10)
	}
	e.payout(t, "po-other", "acc-2", 10)
	e.drive(t, "po-2", pc.Claimed, 5, "holder-a")
	e.drive(t, "po-3", pc.RailSubmitted, 5, "holder-a")

	ids := func(f pc.PayoutFilter) string {
		t.Helper()
		page, err := e.exec.Payouts(tctx(t), f)
		if err != nil {
			t.Fatalf("list %+v: %v", f, err)
		}
		var out []string
		for _, p := range page.Items {
			out = append(out, p.ID)
		}
		return strings.Join(out, ",")
	}
	inFlight := []pc.State{pc.RailAcked, pc.RailSubmitted, pc.Claimed}
	if got := ids(pc.PayoutFilter{States: inFlight, AccountID: "acc-1", Limit: 10}); got != "po-2,po-3" {
		t.Errorf("in-flight payouts of acc-1 = %q, want po-2,po-3", got)
	}
	if got := ids(pc.PayoutFilter{State: pc.Pending, AccountID: "acc-1", Limit: 10}); got != "po-1" {
		t.Errorf("PENDING payouts of acc-1 = %q, want po-1", got)
	}
	if got := ids(pc.PayoutFilter{States: []pc.State{pc.Pending, pc.Claimed}, Limit: 10}); got != "po-1,po-2,po-other" {
		t.Errorf("PENDING or CLAIMED payouts = %q, want po-1,po-2,po-other", got)
	}
	if got := ids(pc.PayoutFilter{AccountID: "acc-1", After: "po-1", Limit: 1}); got != "po-2" {
		t.Errorf("acc-1 after po-1, one = %q, want po-2", got)
	}
	_, err := e.exec.Payouts(tctx(t), pc.PayoutFilter{States: []pc.State{pc.Pending, "SETTLED"}})
	if !problem.Has(err, problem.InvalidRequest) {
		t.Errorf("an unknown state in the list: %v, want invalid_request", err)
	}
}

// The executor's list and GET /work must cost what the accounts with work
// cost, not the whole payout table: their prepared (generic) plans read an
// index on the account (and on actionable payouts), never walk every payout.
func TestWorkAndAccountListUseTheirIndexes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := tctx(t)
	plan := func(sql string, args ...string) string {
		t.Helper()
		return explainGeneric(t, e.svc.pool, "", sql, strings.Join(args, ", "), genericPlans...)
	}
	// The pool's own sessions plan each statement once (pgpool.PlanCacheMode).
	var mode string
	if err := e.svc.pool.QueryRow(ctx, "SHOW plan_cache_mode").Scan(&mode); err != nil || mode != "force_generic_plan" {
		t.Fatalf("the pool's plan_cache_mode is %q (%v), want force_generic_plan", mode, err)
	}
	sql, _ := payoutsQuery([]pc.State{pc.RailAcked, pc.RailSubmitted, pc.Claimed}, "acc-1", "", 50)
	if p := plan(sql, "''", "'acc-1'", "'{RAIL_ACKED,RAIL_SUBMITTED,CLAIMED}'", "50"); !indexedOn(p, "account_id = $2") {
		t.Errorf("the account's payout list does not look up the account in an index:\n%s", p)
	}
	if p := plan(workSQL, "10", "'{}'", "80"); !strings.Contains(p, "payout_waiting_idx") || strings.Contains(p, "payout_state_idx") {
		t.Errorf("GET /work does not read the longest-waiting payouts from payout_waiting_idx:\n%s", p)
	}
	if p := plan(workSkipSQL, "10", "'{}'"); !strings.Contains(p, "payout_actionable_idx") || strings.Contains(p, "payout_state_idx") {
		t.Errorf("GET /work's full walk does not skip through payout_actionable_idx:\n%s", p)
	}
	for name, q := range map[string]string{"events": payoutEventsSQL, "ambiguous_since": ambiguousSinceSQL} {
		args := []string{"'po-1'", "0", "50"}
		if name == "ambiguous_since" {
			args = []string{"'po-1'", "'RAIL_AMBIGUOUS'"}
		}
		if p := plan(q, args...); !strings.Contains(p, "payout_event_payout_bytes_idx") {
			t.Errorf("%s does not look the payout's events up in payout_event_payout_bytes_idx:\n%s", name, p)
		}
	}
}

// indexedOn reports whether a plan looks cond up in an index.
func indexedOn(plan, cond string) bool {
	for _, line := range strings.Split(plan, "\n") {
		if strings.Contains(line, "Index Cond:") && strings.Contains(line, cond) {
			return true
		}
	}
	return false
}
