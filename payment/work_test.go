package payment

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

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

var actualRows = regexp.MustCompile(`actual rows=(\d+) loops=(\d+)`)

// payoutRowsRead runs sql (a GET /work statement, no accounts skipped)
// under EXPLAIN ANALYZE with a generic plan and returns how many entries
// its scans of payout's indexes returned, over all their loops.
func payoutRowsRead(t *testing.T, pool *pgxpool.Pool, sql string, limit, budget int) int {
	t.Helper()
	ctx := tctx(t)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("work_rows_%d", len(sql))
	if _, err := conn.Exec(ctx, "PREPARE "+name+" AS "+sql); err != nil {
		t.Fatal(err)
	}
	args := fmt.Sprintf("%d, '{}'", limit)
	if strings.Contains(sql, "$3") {
		args += fmt.Sprintf(", %d", budget)
	}
	rows, err := conn.Query(ctx, "EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF) EXECUTE "+name+"("+args+")")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	read := 0
	var plan strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
		if !strings.Contains(line, "Index") || !strings.Contains(line, " on payout ") && !strings.Contains(line, " on payout p") {
			continue
		}
		if m := actualRows.FindStringSubmatch(line); m != nil {
			r, _ := strconv.Atoi(m[1])
			l, _ := strconv.Atoi(m[2])
			read += r * l
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d payout index entries read:\n%s", read, plan.String())
	return read
}
