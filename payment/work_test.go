package payment

import (
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

// GET /work reads about as many payouts as it returns accounts, not one
// index probe per account with work: with 60 accounts waiting, three asked
// for read at most workScanFactor payouts each.
func TestWorkReadsAboutAsManyPayoutsAsItReturnsAccounts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const accounts, limit = 60, 3
	for i := range accounts {
		acc := fmt.Sprintf("acc-%02d", i)
		e.account(t, acc, 1_000)
		e.payout(t, "po-"+acc, acc, 1)
	}
	page, err := e.exec.Work(tctx(t), limit)
	if err != nil || len(page) != limit {
		t.Fatalf("work: %+v %v", page, err)
	}
	for i, w := range page {
		if want := fmt.Sprintf("acc-%02d", i); w.AccountID != want || w.Payouts != 1 {
			t.Fatalf("work[%d] = %+v, want %s with 1 payout (the longest-waiting first)", i, w, want)
		}
	}
	// The bounded read, then each returned account's one payout counted.
	budget := limit * workScanFactor
	if n := payoutRowsRead(t, e.svc.pool, workSQL, limit, budget); n > budget+limit {
		t.Fatalf("GET /work read %d payout index entries for %d accounts, want at most %d", n, limit, budget+limit)
	}
	// Carrying each account's payouts reads them, and no more.
	if n := rowsReadGeneric(t, e.svc.pool, workSQL, fmt.Sprintf("%d, '{}', %d, %d", limit, budget, 10)); n > budget+2*limit {
		t.Fatalf("GET /work?payouts=10 read %d payout index entries for %d accounts of one payout each, want at most %d", n, limit, budget+2*limit)
	}
	// The measure itself: walking every account reads one entry per account.
	if n := payoutRowsRead(t, e.svc.pool, workSkipSQL, limit, budget); n < accounts {
		t.Fatalf("the full walk read %d payout index entries, want at least %d (one per account)", n, accounts)
	}
}

// When the longest-waiting payouts all belong to a few accounts with long
// queues, the bounded read names too few accounts: GET /work then walks
// every account with work, and still answers the longest-waiting first.
func TestWorkFallsBackWhenLongQueuesAreInFront(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-long", 1_000)
	for i := range 3 * workScanFactor {
		e.payout(t, fmt.Sprintf("po-long-%02d", i), "acc-long", 1)
	}
	for _, acc := range []string{"acc-b", "acc-c"} {
		e.account(t, acc, 1_000)
		e.payout(t, "po-"+acc, acc, 1)
	}
	walks := func() float64 { return counterValue(e.svc.m.workFallbacks) }
	ids := func(page []pc.WorkItem) string {
		var s []string
		for _, w := range page {
			s = append(s, w.AccountID+":"+strconv.Itoa(w.Payouts))
		}
		return strings.Join(s, ",")
	}
	for _, c := range []struct {
		limit int
		skip  []string
		want  string
		walk  bool
	}{
		{1, nil, "acc-long:24", false},
		{2, nil, "acc-long:24,acc-b:1", true},
		{3, nil, "acc-long:24,acc-b:1,acc-c:1", true},
		{4, nil, "acc-long:24,acc-b:1,acc-c:1", false}, // read all 26: nothing left out
		{2, []string{"acc-long"}, "acc-b:1,acc-c:1", true},
		{1, []string{"acc-b"}, "acc-long:24", false},
	} {
		before := walks()
		page, err := e.exec.WorkSkipping(tctx(t), c.limit, c.skip)
		if err != nil || ids(page) != c.want {
			t.Fatalf("work(limit %d, skip %v) = %s %v, want %s", c.limit, c.skip, ids(page), err, c.want)
		}
		if walked := walks() > before; walked != c.walk {
			t.Fatalf("work(limit %d, skip %v) walked every account: %v, want %v", c.limit, c.skip, walked, c.walk)
		}
	}
	if page, err := e.exec.WorkSkipping(tctx(t), 5, []string{"acc-long", "acc-b", "acc-c"}); err != nil || len(page) != 0 {
		t.Fatalf("work skipping every account: %+v %v, want none", page, err)
	}
}

var (
	actualRows = regexp.MustCompile(`actual rows=(\d+) loops=(\d+)`)
	removedBy  = regexp.MustCompile(`Rows Removed by (?:Filter|Index Recheck): (\d+)`)
)

// payoutRowsRead runs sql (a GET /work statement, no accounts skipped)
// under EXPLAIN ANALYZE with a generic plan and returns how many rows its
// scans of payout read (returned or filtered out), over all their loops.
func payoutRowsRead(t *testing.T, pool *pgxpool.Pool, sql string, limit, budget int) int {
	t.Helper()
	args := fmt.Sprintf("%d, '{}'", limit)
	if strings.Contains(sql, "$4") { // workSQL: its budget, then payouts
		args += fmt.Sprintf(", %d", budget)
	}
	args += ", 0"
	return rowsReadGeneric(t, pool, sql, args)
}

// rowsReadGeneric prepares sql, runs it with args (SQL literals) under
// EXPLAIN ANALYZE with a generic plan, as the pool's sessions plan it, and
// returns how many rows its scans of payout read: returned or removed by a
// filter, over all their loops.
func rowsReadGeneric(t *testing.T, pool *pgxpool.Pool, sql, args string) int {
	t.Helper()
	return payoutRowsIn(t, explainGeneric(t, pool, explainAnalyze, sql, args))
}

// rowsRead runs sql under EXPLAIN ANALYZE, planned for the values written
// into it, and returns how many rows its scans of payout read.
func rowsRead(t *testing.T, pool *pgxpool.Pool, sql string) int {
	t.Helper()
	return payoutRowsIn(t, explain(t, pool, explainAnalyze, sql))
}

const explainAnalyze = "(ANALYZE, TIMING OFF, COSTS OFF)"

// payoutRowsIn is how many rows an analyzed plan's scans of payout read:
// returned or removed by a filter, over all their loops.
func payoutRowsIn(t *testing.T, plan string) int {
	t.Helper()
	return rowsIn(t, plan, "payout")
}

// rowsIn is how many rows an analyzed plan's scans of table read: returned
// or removed by a filter or an index recheck, over all their loops.
func rowsIn(t *testing.T, plan, table string) int {
	t.Helper()
	read, loops := 0, 0 // loops: of the table scan the lines below belong to (0: another node)
	for _, line := range strings.Split(plan, "\n") {
		if m := removedBy.FindStringSubmatch(line); m != nil && loops > 0 {
			n, _ := strconv.Atoi(m[1])
			read += n * loops
			continue
		}
		if !strings.Contains(line, "->") && !strings.Contains(line, "(actual") {
			continue
		}
		loops = 0
		if !strings.Contains(line, "Scan") || !strings.Contains(line, " on "+table+" ") {
			continue
		}
		if m := actualRows.FindStringSubmatch(line); m != nil {
			r, _ := strconv.Atoi(m[1])
			loops, _ = strconv.Atoi(m[2])
			read += r * loops
		}
	}
	t.Logf("%d %s rows read:\n%s", read, table, plan)
	return read
}

// An executor's list of one account's actionable payouts reads that
// account's waiting payouts, not the table: with many payouts of other
// accounts whose ids sort first, a generic plan that walks the primary key
// in id order until it has a page would read all of them.
func TestAccountListReadsTheAccountsPayoutsOnly(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := tctx(t)
	e.account(t, "acc-busy", 1_000_000)
	e.account(t, "acc-1", 1_000)
	const history = 3000
	if _, err := e.svc.pool.Exec(ctx, `INSERT INTO payout (id, account_id, amount, currency, beneficiary_ref, client_ref, state)
		SELECT 'po-a-' || g, 'acc-busy', 1, 'EUR', 'b', 'po-po-a-' || g, CASE WHEN g % 10 = 0 THEN 'PENDING' ELSE 'POSTED' END
		  FROM generate_series(1, $1::int) g`, history); err != nil {
		t.Fatal(err)
	}
	e.payout(t, "po-z-1", "acc-1", 10)
	if _, err := e.svc.pool.Exec(ctx, "ANALYZE payout"); err != nil {
		t.Fatal(err)
	}
	page, err := e.exec.Payouts(ctx, pc.PayoutFilter{AccountID: "acc-1", States: []pc.State{pc.Pending, pc.Claimed, pc.RailSubmitted, pc.RailAcked}, Limit: 50})
	if err != nil || len(page.Items) != 1 || page.Items[0].ID != "po-z-1" {
		t.Fatalf("acc-1's actionable payouts: %+v %v", page.Items, err)
	}
	for _, c := range []struct {
		name   string
		states []pc.State
	}{
		{"actionable", []pc.State{pc.Pending, pc.Claimed, pc.RailSubmitted, pc.RailAcked}},
		{"pending", []pc.State{pc.Pending}},
	} {
		sql, args := payoutsQuery(c.states, "acc-1", "", 50)
		var lits []string
		for _, a := range args {
			switch a := a.(type) {
			case string:
				lits = append(lits, "'"+a+"'")
			case []string:
				lits = append(lits, "'{"+strings.Join(a, ",")+"}'")
			default:
				lits = append(lits, fmt.Sprint(a))
			}
		}
		if n := rowsReadGeneric(t, e.svc.pool, sql, strings.Join(lits, ", ")); n > 10 {
			t.Errorf("listing acc-1's payouts (%s) read %d payout rows, want at most 10", c.name, n)
		}
	}
}

// A list by state alone is planned for its state on every call: a state
// almost no payout is in is read through the index on state, where a
// generic plan, made for any state, walks every payout in id order.
func TestStateListIsPlannedForItsState(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := tctx(t)
	e.account(t, "acc-busy", 1_000_000)
	if _, err := e.svc.pool.Exec(ctx, `INSERT INTO payout (id, account_id, amount, currency, beneficiary_ref, client_ref, state)
		SELECT 'po-a-' || g, 'acc-busy', 1, 'EUR', 'b', 'po-po-a-' || g, CASE WHEN g = 3000 THEN 'RAIL_AMBIGUOUS' ELSE 'POSTED' END
		  FROM generate_series(1, 3000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.pool.Exec(ctx, "ANALYZE payout"); err != nil {
		t.Fatal(err)
	}
	page, err := e.svc.Payouts(ctx, []pc.State{pc.RailAmbiguous}, "", "", 50)
	if err != nil || len(page) != 1 || page[0].ID != "po-a-3000" {
		t.Fatalf("ambiguous payouts: %+v %v", page, err)
	}
	sql, args := payoutsQuery([]pc.State{pc.RailAmbiguous}, "", "", 50)
	if len(args) == 0 || args[0] != pgx.QueryExecModeSimpleProtocol {
		t.Fatalf("a list by state is sent with arguments %v: not planned for its state on each call", args)
	}
	custom := strings.NewReplacer("$1", "''", "$2", "'RAIL_AMBIGUOUS'", "$3", "50").Replace(sql)
	if n := rowsRead(t, e.svc.pool, custom); n > 10 {
		t.Errorf("planned for RAIL_AMBIGUOUS, the list read %d payout rows, want at most 10", n)
	}
	// What a generic plan does, the reason for planning per call.
	if n := rowsReadGeneric(t, e.svc.pool, sql, "'', 'RAIL_AMBIGUOUS', 50"); n < 1000 {
		t.Errorf("the generic plan read only %d payout rows: planning per call would not be needed", n)
	}
}

// GET /work?payouts=N brings, with each account that has at most N
// actionable payouts, those payouts in id order, as the account's payout
// list shows them; an account with more comes without, and so does every
// account when N is 0. The full walk answers the same way.
func TestWorkCarriesTheActionablePayoutsOfAccountsWithFew(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := tctx(t)
	e.account(t, "acc-a", 1_000)
	e.account(t, "acc-b", 1_000)
	e.account(t, "acc-c", 1_000)
	e.payout(t, "po-a2", "acc-a", 1)
	e.payout(t, "po-a1", "acc-a", 2)
	for i := range 3 {
		e.payout(t, fmt.Sprintf("po-b%d", i), "acc-b", 1)
	}
	e.payout(t, "po-c1", "acc-c", 1)
	e.payout(t, "po-c2", "acc-c", 1)
	e.drive(t, "po-c1", pc.Posted, 7, "h-7") // terminal: not actionable
	e.drive(t, "po-c2", pc.RailSubmitted, 7, "h-7")
	ids := func(ps []pc.Payout) string {
		var s []string
		for _, p := range ps {
			s = append(s, p.ID+":"+string(p.State))
		}
		return strings.Join(s, ",")
	}
	for _, c := range []struct {
		q    pc.WorkQuery
		want map[string]string // account: its actionable payouts, "-" for none carried
	}{
		{pc.WorkQuery{Limit: 10}, map[string]string{"acc-a": "-", "acc-b": "-", "acc-c": "-"}},
		{pc.WorkQuery{Limit: 10, Payouts: 2}, map[string]string{"acc-a": "po-a1:PENDING,po-a2:PENDING", "acc-b": "-", "acc-c": "po-c2:RAIL_SUBMITTED"}},
		{pc.WorkQuery{Limit: 10, Payouts: 3}, map[string]string{"acc-a": "po-a1:PENDING,po-a2:PENDING", "acc-b": "po-b0:PENDING,po-b1:PENDING,po-b2:PENDING", "acc-c": "po-c2:RAIL_SUBMITTED"}},
		{pc.WorkQuery{Limit: 10, Payouts: 1, Skip: []string{"acc-a"}}, map[string]string{"acc-b": "-", "acc-c": "po-c2:RAIL_SUBMITTED"}},
	} {
		page, err := e.exec.WorkFor(ctx, c.q)
		if err != nil || len(page) != len(c.want) {
			t.Fatalf("work %+v: %+v %v, want %d accounts", c.q, page, err, len(c.want))
		}
		for _, w := range page {
			got := ids(w.Actionable)
			if w.Actionable == nil {
				got = "-"
			}
			if got != c.want[w.AccountID] {
				t.Errorf("work %+v: %s carries %s, want %s", c.q, w.AccountID, got, c.want[w.AccountID])
			}
			if w.Actionable == nil {
				continue
			}
			// As the account's own list shows them, to the last field.
			list, err := e.exec.Payouts(ctx, pc.PayoutFilter{AccountID: w.AccountID, States: []pc.State{pc.Pending, pc.Claimed, pc.RailSubmitted, pc.RailAcked}, Limit: 10})
			if err != nil || !reflect.DeepEqual(list.Items, w.Actionable) {
				t.Errorf("work %+v: %s carries %+v, its list says %+v (%v)", c.q, w.AccountID, w.Actionable, list.Items, err)
			}
		}
	}
}

// The full walk (workSkipSQL) carries the payouts the same way.
func TestWorkFullWalkCarriesTheActionablePayouts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-long", 1_000)
	for i := range 3 * workScanFactor {
		e.payout(t, fmt.Sprintf("po-long-%02d", i), "acc-long", 1)
	}
	e.account(t, "acc-b", 1_000)
	e.payout(t, "po-b", "acc-b", 1)
	walks := counterValue(e.svc.m.workFallbacks)
	page, err := e.exec.WorkFor(tctx(t), pc.WorkQuery{Limit: 2, Payouts: 1})
	if err != nil || len(page) != 2 || counterValue(e.svc.m.workFallbacks) != walks+1 {
		t.Fatalf("work: %+v %v, want two accounts from a full walk", page, err)
	}
	if page[0].AccountID != "acc-long" || page[0].Actionable != nil || page[0].Payouts != 3*workScanFactor {
		t.Errorf("first: %+v, want acc-long with %d payouts and none carried", page[0], 3*workScanFactor)
	}
	if page[1].AccountID != "acc-b" || len(page[1].Actionable) != 1 || page[1].Actionable[0].ID != "po-b" {
		t.Errorf("second: %+v, want acc-b carrying po-b", page[1])
	}
}

// GET /work counts an account's actionable payouts only up to
// workCountCap: an account with a long queue (a bulk load) made every ask
// that returned it read the whole queue, where an ask should cost about
// the accounts it answers.
func TestWorkCountsALongQueueOnlyUpToItsCap(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := tctx(t)
	e.account(t, "acc-long", 1_000_000)
	const queue = 3 * workCountCap
	if _, err := e.svc.pool.Exec(ctx, `INSERT INTO payout (id, account_id, amount, currency, beneficiary_ref, client_ref, state)
		SELECT 'po-l-' || g, 'acc-long', 1, 'EUR', 'b', 'po-po-l-' || g, 'PENDING' FROM generate_series(1, $1::int) g`, queue); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.pool.Exec(ctx, "VACUUM ANALYZE payout"); err != nil {
		t.Fatal(err)
	}
	page, err := e.exec.Work(ctx, 1)
	if err != nil || len(page) != 1 || page[0].AccountID != "acc-long" || page[0].Payouts != workCountCap {
		t.Fatalf("work: %+v %v; want acc-long with %d (the cap) payouts", page, err, workCountCap)
	}
	budget := workScanFactor
	if n := payoutRowsRead(t, e.svc.pool, workSQL, 1, budget); n > budget+workCountCap+1 {
		t.Fatalf("GET /work?limit=1 read %d payout index entries for an account of %d payouts, want at most %d", n, queue, budget+workCountCap+1)
	}
}

// The payouts GET /work carries (payouts=N) are read by their account's
// index, never by walking the primary key in id order: with most of the
// table actionable, a generic plan did, reading every payout whose id
// sorts before the account's to answer one.
func TestWorkCarriesAnAccountsPayoutsWithoutWalkingThePrimaryKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := tctx(t)
	e.account(t, "acc-z", 1_000)
	e.payout(t, "z-1", "acc-z", 1) // the oldest, its id sorting last
	const accounts, each = 100, 50
	for i := range accounts {
		e.account(t, fmt.Sprintf("acc-%03d", i), 1_000)
	}
	if _, err := e.svc.pool.Exec(ctx, `INSERT INTO payout (id, account_id, amount, currency, beneficiary_ref, client_ref, state)
		SELECT 'a-' || lpad(a::text, 3, '0') || '-' || g, 'acc-' || lpad(a::text, 3, '0'), 1, 'EUR', 'b', 'po-a-' || a || '-' || g, 'PENDING'
		  FROM generate_series(0, $1::int - 1) a, generate_series(1, $2::int) g`, accounts, each); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.pool.Exec(ctx, "VACUUM ANALYZE payout"); err != nil {
		t.Fatal(err)
	}
	budget := workScanFactor
	if n := rowsReadGeneric(t, e.svc.pool, workSQL, fmt.Sprintf("1, '{}', %d, 10", budget)); n > budget+2+2 {
		t.Fatalf("GET /work?limit=1&payouts=10 read %d payout index entries to answer one account of one payout, want at most %d", n, budget+4)
	}
}
