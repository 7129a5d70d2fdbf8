package payment

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/internal/obs"
)

// AccountDrift is an account whose cached balance differs from the sum of
// its ledger entries.
type AccountDrift struct {
	AccountID  string
	Balance    int64
	LedgerSum  int64
	Difference int64 // Balance - LedgerSum
}

// GroupDrift is a ledger group whose entries do not sum to zero.
type GroupDrift struct {
	GroupID string
	Sum     int64
}

// LedgerReport is the result of one ledger check.
type LedgerReport struct {
	Accounts []AccountDrift
	Groups   []GroupDrift
}

// Clean reports whether the check found nothing.
func (r LedgerReport) Clean() bool { return len(r.Accounts) == 0 && len(r.Groups) == 0 }

// noJITSQL turns JIT compilation off for the ledger check's transaction.
// driftAccountsSQL's estimate grows with the ledger (a sum of entries per
// account it might read): with a million payouts it passed
// jit_above_cost, and PostgreSQL spent 0.50 s compiling it, on every run,
// for 7 ms of execution. (The reconciler's long scans gain from JIT: it
// stays on elsewhere.)
const noJITSQL = "SET LOCAL jit = off"

// driftAccountsSQL lists the accounts changed since $1 (or named in $2)
// whose balance differs from the sum of their entries.
const driftAccountsSQL = `
	SELECT a.id, b.balance, s.total::bigint
	  FROM ` + accountFrom + `
	  CROSS JOIN LATERAL (SELECT COALESCE(sum(e.amount), 0) AS total FROM ledger_entry e WHERE e.account_id = a.id) s
	 WHERE (a.updated_at >= $1 OR a.id = ANY($2)
	        OR a.id IN (SELECT bp.account_id FROM account_balance_part bp WHERE bp.updated_at >= $1))
	   AND b.balance <> s.total
	 ORDER BY a.id`

// driftGroupsSQL lists the groups with an entry created since $1 (or named
// in $2: those need no lookup, and an OR of the two would leave the planner
// no index for the pair) that do not sum to zero. The recent entries are
// found through ledger_entry_created_brin: the statement is planned for its
// since on every call (perCallPlan), so a run reads the newest pages only.
const driftGroupsSQL = `
	SELECT group_id, sum(amount)::bigint
	  FROM ledger_entry
	 WHERE group_id IN (SELECT group_id FROM ledger_entry WHERE created_at >= $1 UNION ALL SELECT unnest($2::text[]))
	 GROUP BY group_id
	HAVING sum(amount) <> 0
	 ORDER BY group_id`

// A full sweep (since zero) reads the whole ledger once, in one aggregate
// per statement. Asked through the incremental statements, it summed each
// account's entries in a loop over the accounts and joined the ledger with
// itself: with a million payouts 3.1 s and 15.2 s, where these take 0.6 s
// and 1.4 s; past about 1.6 million payouts the sweep outgrew its 30 s
// budget and failed every time.
const (
	allAccountsDriftSQL = `
	SELECT a.id, b.balance, COALESCE(s.total, 0)::bigint
	  FROM ` + accountFrom + `
	  LEFT JOIN (SELECT e.account_id, sum(e.amount) AS total FROM ledger_entry e GROUP BY e.account_id) s ON s.account_id = a.id
	 WHERE b.balance <> COALESCE(s.total, 0)
	 ORDER BY a.id`
	allGroupsDriftSQL = `
	SELECT group_id, sum(amount)::bigint
	  FROM ledger_entry
	 GROUP BY group_id
	HAVING sum(amount) <> 0
	 ORDER BY group_id`
)

// ledgerQuery is one statement of a ledger check and its arguments.
type ledgerQuery struct {
	sql  string
	args []any
}

// ledgerQueries are the two statements CheckLedger runs: a full sweep's
// when since is zero, else the incremental ones, planned for since.
func ledgerQueries(since time.Time, extraAccounts, extraGroups []string) (accounts, groups ledgerQuery) {
	if since.IsZero() {
		return ledgerQuery{sql: allAccountsDriftSQL}, ledgerQuery{sql: allGroupsDriftSQL}
	}
	return ledgerQuery{driftAccountsSQL, []any{perCallPlan, since, extraAccounts}},
		ledgerQuery{driftGroupsSQL, []any{perCallPlan, since, extraGroups}}
}

// inLedgerTx runs fn in a ledger check's transaction: one read-only
// snapshot, without JIT (noJITSQL).
func (s *Service) inLedgerTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, noJITSQL); err != nil {
			return err
		}
		return fn(tx)
	})
}

// CheckLedger is the detective control of INV-03: it compares the balance
// of every account changed since since (and of the extra accounts named)
// with the sum of its entries, and sums every group with an entry created
// since since (and the extra groups named). A zero since checks everything.
// Both queries read one snapshot, so a posting in flight is never half-seen.
func (s *Service) CheckLedger(ctx context.Context, since time.Time, extraAccounts, extraGroups []string) (LedgerReport, error) {
	var rep LedgerReport
	accounts, groups := ledgerQueries(since, extraAccounts, extraGroups)
	err := s.inLedgerTx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, accounts.sql, accounts.args...)
		rep.Accounts, err = collect(rows, err, func(row pgx.Row) (AccountDrift, error) {
			var d AccountDrift
			err := row.Scan(&d.AccountID, &d.Balance, &d.LedgerSum)
			d.Difference = d.Balance - d.LedgerSum
			return d, err
		})
		if err != nil {
			return err
		}
		rows, err = tx.Query(ctx, groups.sql, groups.args...)
		rep.Groups, err = collect(rows, err, func(row pgx.Row) (GroupDrift, error) {
			var g GroupDrift
			return g, row.Scan(&g.GroupID, &g.Sum)
		})
		return err
	})
	return rep, err
}

// fullSweepEvery is how many incremental checks run between full sweeps.
const fullSweepEvery = 20

// RunLedgerCheck runs CheckLedger every interval until ctx is done: each
// run covers what changed since shortly before the previous one (updated_at
// is a transaction's start time, so the window overlaps generously), plus
// everything still drifting, plus a full sweep every fullSweepEvery runs.
// Drift is exported as gauges and logged at ERROR, once per account or group
// per run, until it is gone.
//
// A run that fails leaves the window where it was: the next run covers what
// changed since the last run that succeeded, and after a failed full sweep
// it is an incremental run, so that a ledger whose full sweep no longer
// fits its budget is still checked where it changes (the sweep is tried
// again fullSweepEvery runs later, and each failure counted and logged).
func (s *Service) RunLedgerCheck(ctx context.Context) error {
	var (
		since     time.Time // the window of the next incremental run
		drifting  []string
		unbalance []string
	)
	check := s.CheckLedger
	if s.checkLedger != nil {
		check = s.checkLedger
	}
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for run := 0; ; run++ {
		start := time.Now()
		if since.IsZero() {
			since = start.Add(-2*s.interval - time.Minute)
		}
		from := since
		if run%fullSweepEvery == 0 {
			from = time.Time{} // a full sweep, the first run among them
		}
		cctx, cancel := context.WithTimeout(ctx, max(s.interval, 30*time.Second))
		rep, err := check(cctx, from, drifting, unbalance)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			s.m.driftChecks.WithLabelValues("error").Inc()
			s.log.Warn("ledger check failed; the next run checks from the last run that succeeded", obs.KeyError, err.Error(), "full_sweep", from.IsZero())
		default:
			s.reportLedger(rep)
			drifting, unbalance = drifting[:0], unbalance[:0]
			for _, d := range rep.Accounts {
				drifting = append(drifting, d.AccountID)
			}
			for _, g := range rep.Groups {
				unbalance = append(unbalance, g.GroupID)
			}
			since = start.Add(-2*s.interval - time.Minute)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (s *Service) reportLedger(rep LedgerReport) {
	s.m.driftAccounts.Set(float64(len(rep.Accounts)))
	s.m.driftGroups.Set(float64(len(rep.Groups)))
	if rep.Clean() {
		s.m.driftChecks.WithLabelValues("clean").Inc()
		return
	}
	s.m.driftChecks.WithLabelValues("drift").Inc()
	for _, d := range rep.Accounts {
		s.log.Error("ledger drift: account balance differs from the sum of its entries (INV-03)",
			obs.KeyEvent, "ledger_drift", obs.KeyAccountID, d.AccountID,
			"balance", d.Balance, "ledger_sum", d.LedgerSum, "difference", d.Difference)
	}
	for _, g := range rep.Groups {
		s.log.Error("ledger drift: group does not sum to zero (INV-03)",
			obs.KeyEvent, "ledger_unbalanced_group", "group_id", g.GroupID, "sum", g.Sum)
	}
}
