package payment

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestLedgerCheckDetectsDrift: the continuous INV-03 check finds a balance
// that no longer equals its entries and a group that does not sum to zero,
// exports both as gauges and logs them at ERROR.
func TestLedgerCheckDetectsDrift(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.account(t, "acc-2", 1_000)
	e.payout(t, "po-1", "acc-1", 100)
	e.drive(t, "po-1", "POSTED", 1, "h")
	ctx := tctx(t)
	rep, err := e.svc.CheckLedger(ctx, time.Time{}, nil, nil)
	if err != nil || !rep.Clean() {
		t.Fatalf("clean ledger reported %+v %v", rep, err)
	}
	// Break INV-03 behind the service's back: a balance edit, and (with the
	// commit-time trigger disabled, as only a superuser could) a lone entry.
	if _, err := e.svc.pool.Exec(ctx, `UPDATE account SET balance = balance + 7 WHERE id = 'acc-1'`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.pool.Exec(ctx, `ALTER TABLE ledger_entry DISABLE TRIGGER ledger_entry_group_sums_to_zero`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.pool.Exec(ctx, `INSERT INTO ledger_entry (group_id, account_id, amount, counterparty_account_id) VALUES ('rogue', 'acc-2', 5, 'funding')`); err != nil {
		t.Fatal(err)
	}
	since := time.Now().Add(-time.Hour)
	rep, err = e.svc.CheckLedger(ctx, since, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Accounts) != 2 || rep.Accounts[0].AccountID != "acc-1" || rep.Accounts[0].Difference != 7 ||
		rep.Accounts[1].AccountID != "acc-2" || rep.Accounts[1].Difference != -5 {
		t.Fatalf("account drift %+v", rep.Accounts)
	}
	if len(rep.Groups) != 1 || rep.Groups[0].GroupID != "rogue" || rep.Groups[0].Sum != 5 {
		t.Fatalf("group drift %+v", rep.Groups)
	}
	// A full sweep finds the same.
	full, err := e.svc.CheckLedger(ctx, time.Time{}, nil, nil)
	if err != nil || !reflect.DeepEqual(full, rep) {
		t.Fatalf("full sweep %+v %v, want %+v", full, err, rep)
	}
	// A window that excludes them still sees the ones named as drifting.
	rep2, err := e.svc.CheckLedger(ctx, time.Now().Add(time.Hour), []string{"acc-1"}, []string{"rogue"})
	if err != nil || len(rep2.Accounts) != 1 || len(rep2.Groups) != 1 {
		t.Fatalf("named re-check %+v %v", rep2, err)
	}
	e.svc.reportLedger(rep)
	if g := counterValue(e.svc.m.driftAccounts); g != 2 {
		t.Fatalf("drift gauge %v, want 2", g)
	}
	if g := counterValue(e.svc.m.driftGroups); g != 1 {
		t.Fatalf("unbalanced group gauge %v, want 1", g)
	}
	logs := e.logs.String()
	if !strings.Contains(logs, `"level":"ERROR"`) || !strings.Contains(logs, `"event":"ledger_drift"`) || !strings.Contains(logs, `"account_id":"acc-1"`) {
		t.Fatalf("no ERROR drift line in the log")
	}
}

// TestRunLedgerCheck: the background loop runs, stops with its context,
// and reports a clean ledger as clean.
func TestRunLedgerCheck(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.svc.interval = 10 * time.Millisecond
	e.account(t, "acc-1", 1_000)
	ctx, cancel := context.WithCancel(tctx(t))
	done := make(chan error, 1)
	go func() { done <- e.svc.RunLedgerCheck(ctx) }()
	deadline := time.Now().Add(time.Minute)
	for counterValue(e.svc.m.driftChecks.WithLabelValues("clean")) < 3 {
		if time.Now().After(deadline) {
			t.Fatal("ledger check did not run three times within a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if g := counterValue(e.svc.m.driftAccounts); g != 0 {
		t.Fatalf("drift gauge %v on a clean ledger", g)
	}
}

// An incremental run of the ledger check sums the groups of the recent
// entries and reads only the newest part of the ledger, not every entry
// ever posted; a full sweep still reads it all.
func TestLedgerCheckReadsRecentEntriesOnly(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := tctx(t)
	e.account(t, "acc-1", 1_000_000)
	const history = 100_000 // groups of two entries of a payout, a day old
	e.payout(t, "po-old", "acc-1", 1)
	for _, sql := range []string{
		`ALTER TABLE ledger_entry DISABLE TRIGGER ledger_entry_group_sums_to_zero`,
		`INSERT INTO ledger_entry (group_id, account_id, amount, counterparty_account_id, payout_id, created_at)
		 SELECT 'hist-' || g, CASE WHEN side THEN 'acc-1' ELSE 'funding' END, CASE WHEN side THEN -1 ELSE 1 END,
		        CASE WHEN side THEN 'funding' ELSE 'acc-1' END, 'po-old', now() - interval '1 day'
		   FROM generate_series(1, ` + strconv.Itoa(history) + `) g, (VALUES (true), (false)) v(side)
		  ORDER BY g`,
		`ALTER TABLE ledger_entry ENABLE TRIGGER ledger_entry_group_sums_to_zero`,
		`UPDATE account SET balance = balance - ` + strconv.Itoa(history) + ` WHERE id = 'acc-1'`,
		`UPDATE account SET balance = balance + ` + strconv.Itoa(history) + ` WHERE id = 'funding'`,
	} {
		if _, err := e.svc.pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	e.payout(t, "po-1", "acc-1", 100)
	e.drive(t, "po-1", "POSTED", 1, "h")
	if _, err := e.svc.pool.Exec(ctx, "VACUUM ANALYZE ledger_entry"); err != nil {
		t.Fatal(err)
	}
	since := time.Now().Add(-time.Hour)
	rep, err := e.svc.CheckLedger(ctx, since, nil, nil)
	if err != nil || !rep.Clean() {
		t.Fatalf("incremental check of a clean ledger: %+v %v", rep, err)
	}
	groups := func(since time.Time, named []string) int {
		_, q := ledgerQueries(since, nil, named)
		return rowsIn(t, e.explainLedger(t, explainAnalyze, q), "ledger_entry")
	}
	for _, named := range [][]string{nil, {"hist-7", "hist-70000"}} {
		if n := groups(since, named); n > history/10 {
			t.Errorf("an incremental run (named groups %v) read %d of %d ledger entries, want at most a tenth", named, n, 2*history)
		}
	}
	rep, err = e.svc.CheckLedger(ctx, since, nil, []string{"hist-7"})
	if err != nil || !rep.Clean() {
		t.Fatalf("incremental check naming an old group: %+v %v", rep, err)
	}
	if rep, err := e.svc.CheckLedger(ctx, time.Time{}, nil, nil); err != nil || !rep.Clean() {
		t.Fatalf("full sweep of a clean ledger: %+v %v", rep, err)
	}
	// A full sweep reads every entry, once.
	if n := groups(time.Time{}, nil); n < 2*history || n > 2*history+10 {
		t.Errorf("a full sweep of the groups read %d ledger entries, want each of the %d once", n, 2*history+4)
	}
}

// explainLedger is the plan of EXPLAIN opts of q, run as CheckLedger runs
// it: in the ledger check's transaction, with the same arguments and mode.
func (e *testBundle) explainLedger(t *testing.T, opts string, q ledgerQuery, before ...string) string {
	t.Helper()
	var lines []string
	err := e.svc.inLedgerTx(tctx(t), func(tx pgx.Tx) error {
		for _, b := range before {
			if _, err := tx.Exec(tctx(t), b); err != nil {
				return err
			}
		}
		rows, err := tx.Query(tctx(t), "EXPLAIN "+opts+" "+q.sql, q.args...)
		if err != nil {
			return err
		}
		lines, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		t.Fatalf("explain %s: %v", q.sql, err)
	}
	return strings.Join(lines, "\n") + "\n"
}

// The ledger check's statements are not JIT-compiled: its transaction turns
// JIT off, so even with every statement's estimate over jit_above_cost no
// compilation is paid. Without that setting the same plan is compiled.
func TestLedgerCheckIsNotJITCompiled(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	accounts, _ := ledgerQueries(time.Now().Add(-time.Hour), []string{"acc-1"}, nil)
	compileAll := []string{"SET LOCAL jit_above_cost = 0", "SET LOCAL jit_inline_above_cost = -1", "SET LOCAL jit_optimize_above_cost = -1"}
	// The same statement outside the check's transaction is compiled.
	// (EXPLAIN prints its JIT section only with costs.)
	sql := strings.NewReplacer("$1", "now() - interval '1 hour'", "$2", "'{acc-1}'::text[]").Replace(accounts.sql)
	if p := explain(t, e.svc.pool, "(ANALYZE)", sql, compileAll...); !strings.Contains(p, "JIT:") {
		t.Fatalf("no JIT section with jit_above_cost 0: this PostgreSQL cannot show what the setting prevents:\n%s", p)
	}
	if p := e.explainLedger(t, "(ANALYZE)", accounts, compileAll...); strings.Contains(p, "JIT:") {
		t.Fatalf("the ledger check's statement was JIT-compiled in its transaction:\n%s", p)
	}
}

// TestLedgerCheckGoesOnWhenFullSweepsFail: every full sweep fails (here
// refused; on a large ledger, one over its time budget), and the check
// still finds drift where the ledger changes: after a failed sweep the
// next run is an incremental one from the last run that succeeded, and
// each failure is counted. Before, a failed full sweep left its window at
// the start of time, so every later run was a full sweep, each failing:
// the continuous check had stopped and its gauges said 0.
func TestLedgerCheckGoesOnWhenFullSweepsFail(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.svc.interval = 10 * time.Millisecond
	e.account(t, "acc-1", 1_000)
	var sweeps atomic.Int32
	e.svc.checkLedger = func(ctx context.Context, since time.Time, accounts, groups []string) (LedgerReport, error) {
		if since.IsZero() {
			sweeps.Add(1)
			return LedgerReport{}, errors.New("the full sweep ran out of its time budget")
		}
		return e.svc.CheckLedger(ctx, since, accounts, groups)
	}
	ctx, cancel := context.WithCancel(tctx(t))
	done := make(chan error, 1)
	go func() { done <- e.svc.RunLedgerCheck(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	if _, err := e.svc.pool.Exec(tctx(t), `UPDATE account SET balance = balance + 7, updated_at = now() WHERE id = 'acc-1'`); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for counterValue(e.svc.m.driftAccounts) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("a drift on a changed account went unreported for a minute while full sweeps failed (%d sweeps, %v errors)",
				sweeps.Load(), counterValue(e.svc.m.driftChecks.WithLabelValues("error")))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := counterValue(e.svc.m.driftChecks.WithLabelValues("error")); n < 1 || float64(sweeps.Load()) < n {
		t.Fatalf("%v check errors counted for %d failed sweeps", n, sweeps.Load())
	}
}
