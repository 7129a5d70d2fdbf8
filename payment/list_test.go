package payment

import (
	"fmt"
	"regexp"
	"slices"
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
	if p := plan(workSQL, "10", "'{}'", "80", "0"); !strings.Contains(p, "payout_waiting_idx") || strings.Contains(p, "payout_state_idx") {
		t.Errorf("GET /work does not read the longest-waiting payouts from payout_waiting_idx:\n%s", p)
	}
	if p := plan(workSkipSQL, "10", "'{}'", "0"); !strings.Contains(p, "payout_actionable_idx") || strings.Contains(p, "payout_state_idx") {
		t.Errorf("GET /work's full walk does not skip through payout_actionable_idx:\n%s", p)
	}
	for name, q := range map[string]string{"events": payoutEventsSQL, "ambiguous_since": ambiguousSinceSQL} {
		args := []string{"'po-1'", "0", "50"}
		if name == "ambiguous_since" {
			args = []string{"'po-1'", "'RAIL_AMBIGUOUS'"}
		}
		if p := plan(q, args...); !strings.Contains(p, "payout_event_digest_idx") {
			t.Errorf("%s does not look the payout's events up in payout_event_digest_idx:\n%s", name, p)
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

// A list of payouts by state without an account (the reconciler's
// ambiguous payouts, an operator's failed ones, `payouts status`) reads the
// payouts in that state, not the history around them: the rarer states
// through payout_state_idx (the open ones may use the actionable payouts'
// indexes instead), and POSTED, most of the table, by walking the primary
// key.
func TestStateListsReadTheirOwnPayouts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000_000)
	const history = 3000
	// Every 500th payout is in one of the rarer states, one more is
	// ABANDONED, the rest POSTED.
	rare := []pc.State{pc.Pending, pc.Claimed, pc.RailSubmitted, pc.RailAcked, pc.RailAmbiguous, pc.Failed}
	e.plantPayouts(t, "acc-1", history, func(g int) pc.State {
		switch {
		case g%500 == 0:
			return rare[g/500-1]
		case g == 499:
			return pc.Abandoned
		}
		return pc.Posted
	})
	const limit = 50
	for _, s := range append(rare, pc.Abandoned, pc.Posted) {
		sql, args := payoutsQuery([]pc.State{s}, "", "", limit)
		if args[0] != perCallPlan || len(args) != 4 {
			t.Fatalf("list by state: arguments %v, want perCallPlan and three", args)
		}
		// Planned for its values, as the simple protocol sends it.
		lit := strings.NewReplacer("$1", "''", "$2", "'"+string(s)+"'", "$3", fmt.Sprint(limit)).Replace(sql)
		// At most the payouts in the open states (4 actionable, 1
		// ambiguous) or a page and the row that ends it.
		want := 5
		if s == pc.Posted {
			want = limit + 1
		}
		if n := rowsRead(t, e.svc.pool, lit); n > want {
			t.Errorf("a list of %s payouts read %d payout rows of %d, want at most %d:\n%s", s, n, history, want,
				explain(t, e.svc.pool, explainAnalyze, lit))
		}
		// Rows read do not count the index entries a scan passes over: an
		// index whose first column is not state (the account's) would be
		// read whole with few rows to show for it.
		if idx, p := stateIndexOf(s), explain(t, e.svc.pool, "", lit, "SET LOCAL enable_seqscan = off"); !usesOnly(p, idx...) {
			t.Errorf("a list of %s payouts does not read %v:\n%s", s, idx, p)
		}
	}
}

// stateIndexOf is the indexes a read of the payouts in state s may use.
func stateIndexOf(s pc.State) []string {
	switch {
	case s == pc.Posted:
		return []string{"payout_pkey"}
	case s.Actionable():
		return []string{"payout_state_idx", "payout_actionable_idx", "payout_waiting_idx"}
	default:
		return []string{"payout_state_idx"}
	}
}

// payoutScan matches a scan of payout in a plan: an index scan (the
// index), a bitmap index scan (the index; its heap scan is not matched) or
// a sequential scan.
var payoutScan = regexp.MustCompile(`Index (?:Only )?Scan using (\S+) on payout\b|Bitmap Index Scan on (payout\w*)|(Seq Scan) on payout\b`)

// usesOnly reports whether plan scans payout, and only through the
// indexes idx.
func usesOnly(plan string, idx ...string) bool {
	found := payoutScan.FindAllStringSubmatch(plan, -1)
	for _, m := range found {
		if !slices.Contains(idx, m[1]+m[2]) {
			return false
		}
	}
	return len(found) > 0
}
