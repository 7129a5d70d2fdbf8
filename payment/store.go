package payment

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/payouts/payouts/internal/batcher"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/safetylog"
	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// querier is a pool, a connection or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// heldStates are the states whose amounts are held back from available (D-7).
var heldStates = []string{string(pc.Claimed), string(pc.RailSubmitted), string(pc.RailAcked), string(pc.RailAmbiguous)}

const payoutCols = `id, account_id, amount, currency, beneficiary_ref, state, client_ref,
	COALESCE(claimed_by, ''), COALESCE(token, 0), COALESCE(failure_reason, ''),
	COALESCE(rail_ref, ''), COALESCE(rail_error_code, ''),
	created_at, claimed_at, submitted_at, settled_at`

func scanPayout(row pgx.Row) (pc.Payout, error) {
	var p pc.Payout
	var state, claimedBy string
	var token int64
	err := row.Scan(&p.ID, &p.AccountID, &p.Amount, &p.Currency, &p.BeneficiaryRef, &state, &p.ClientRef,
		&claimedBy, &token, &p.FailureReason, &p.RailRef, &p.ErrorCode,
		&p.CreatedAt, &p.ClaimedAt, &p.SubmittedAt, &p.SettledAt)
	p.State, p.ClaimedBy, p.Token = pc.State(state), fencing.Holder(claimedBy), fencing.Token(token)
	p.CreatedAt = p.CreatedAt.UTC()
	for _, t := range []*time.Time{p.ClaimedAt, p.SubmittedAt, p.SettledAt} {
		if t != nil {
			*t = t.UTC()
		}
	}
	return p, err
}

func getPayout(ctx context.Context, q querier, id string, forUpdate bool) (pc.Payout, error) {
	sql := `SELECT ` + payoutCols + ` FROM payout WHERE id = $1`
	if forUpdate {
		sql += ` FOR UPDATE`
	}
	p, err := scanPayout(q.QueryRow(ctx, sql, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return p, problem.New(problem.NotFound, "no payout %q", id)
	}
	return p, err
}

// heldAmount is the sum of the account's payouts whose money is committed
// or possibly gone (D-7).
func heldAmount(ctx context.Context, q querier, accountID string) (int64, error) {
	var held int64
	err := q.QueryRow(ctx, heldSQL, accountID, heldStates).Scan(&held)
	return held, err
}

const heldSQL = `SELECT COALESCE(sum(amount), 0)::bigint FROM payout WHERE account_id = $1 AND state = ANY($2)`

// isHeld reports whether a payout in st holds its amount back (D-7).
func isHeld(st pc.State) bool { return slices.Contains(heldStates, string(st)) }

// accountCols are an account's columns, read FROM accountFrom.
const accountCols = `a.id, a.currency, b.balance,
	b.balance - COALESCE((SELECT sum(p.amount) FROM payout p WHERE p.account_id = a.id AND p.state = ANY($1)), 0)::bigint,
	a.fence_token, a.fence_holder`

func scanAccount(row pgx.Row) (pc.Account, error) {
	var a pc.Account
	var token int64
	var holder string
	err := row.Scan(&a.ID, &a.Currency, &a.Balance, &a.Available, &token, &holder)
	a.FenceToken, a.FenceHolder = fencing.Token(token), fencing.Holder(holder)
	return a, err
}

func getAccount(ctx context.Context, q querier, id string) (pc.Account, error) {
	a, err := scanAccount(q.QueryRow(ctx, `SELECT `+accountCols+` FROM `+accountFrom+` WHERE a.id = $2`, heldStates, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return a, problem.New(problem.NotFound, "no account %q", id)
	}
	return a, err
}

func collect[T any](rows pgx.Rows, err error, scan func(pgx.Row) (T, error)) ([]T, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []T{}
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// LedgerSum returns account id's balance beside the sum and count of its
// ledger entries, in one statement: one snapshot, so a posting is in both
// or in neither (the reconciler's check of a busy account, INV-03).
func (s *Service) LedgerSum(ctx context.Context, id string) (pc.LedgerSum, error) {
	l := pc.LedgerSum{AccountID: id}
	err := s.pool.QueryRow(ctx, `SELECT b.balance, COALESCE(sum(e.amount), 0)::bigint, count(e.id)
		FROM `+accountFrom+` LEFT JOIN ledger_entry e ON e.account_id = a.id
		WHERE a.id = $1 GROUP BY b.balance`, id).Scan(&l.Balance, &l.LedgerSum, &l.Entries)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, problem.New(problem.NotFound, "no account %q", id)
	}
	return l, err
}

// Account returns one account with its available funds.
func (s *Service) Account(ctx context.Context, id string) (pc.Account, error) {
	return getAccount(ctx, s.pool, id)
}

// Accounts lists accounts by id after the cursor.
func (s *Service) Accounts(ctx context.Context, after string, limit int) ([]pc.Account, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+accountCols+` FROM `+accountFrom+` WHERE a.id > $2 ORDER BY a.id LIMIT $3`, heldStates, after, limit)
	return collect(rows, err, scanAccount)
}

// Payout returns one payout.
func (s *Service) Payout(ctx context.Context, id string) (pc.Payout, error) {
	return getPayout(ctx, s.pool, id, false)
}

// Payouts lists payouts by id after the cursor, optionally by states and
// account. Each shape of filter is its own statement, so every prepared
// plan can use the index that fits it (an "any or this" predicate in one
// statement leaves the generic plan walking the primary key). Without an
// account the statement is planned for its arguments on every call: how
// many payouts a state holds decides between walking the primary key and
// reading an index on state, and no one plan is right for both a state
// most payouts are in and one that is nearly empty.
func (s *Service) Payouts(ctx context.Context, states []pc.State, accountID, after string, limit int) ([]pc.Payout, error) {
	sql, args := payoutsQuery(states, accountID, after, limit)
	rows, err := s.pool.Query(ctx, sql, args...)
	return collect(rows, err, scanPayout)
}

// perCallPlan sends a statement with its arguments written into it (pgx
// escapes them), so PostgreSQL plans it for those values on every call
// whatever the session's plan_cache_mode.
const perCallPlan = pgx.QueryExecModeSimpleProtocol

// payoutsQuery is the statement and arguments of Payouts; without an
// account the arguments start with perCallPlan. An account's
// payouts are read through an index on the account (for actionable states
// only, payout_actionable_idx: the account's queue, not its history) and
// then ordered: OFFSET 0 keeps the planner from walking the primary key in
// id order until it has a page, which reads every payout of every account
// whose ids sort before the account's.
func payoutsQuery(states []pc.State, accountID, after string, limit int) (string, []any) {
	args := []any{after}
	where := "id > $1"
	if accountID != "" {
		args = append(args, accountID)
		where += fmt.Sprintf(" AND account_id = $%d", len(args))
	}
	switch len(states) {
	case 0:
	case 1:
		args = append(args, string(states[0]))
		where += fmt.Sprintf(" AND state = $%d", len(args))
	default:
		list := make([]string, len(states))
		for i, st := range states {
			list[i] = string(st)
		}
		args = append(args, list)
		where += fmt.Sprintf(" AND state = ANY($%d)", len(args))
	}
	args = append(args, limit)
	if accountID == "" {
		return fmt.Sprintf(`SELECT %s FROM payout WHERE %s ORDER BY id LIMIT $%d`, payoutCols, where, len(args)),
			append([]any{perCallPlan}, args...)
	}
	if len(states) > 0 && !slices.ContainsFunc(states, func(st pc.State) bool { return !st.Actionable() }) {
		where += " AND " + actionableSQL
	}
	return fmt.Sprintf(`SELECT %s FROM (SELECT * FROM payout WHERE %s OFFSET 0) p ORDER BY id LIMIT $%d`, payoutCols, where, len(args)), args
}

func scanEvent(row pgx.Row) (pc.PayoutEvent, error) {
	var e pc.PayoutEvent
	var from, to, holder string
	var token int64
	err := row.Scan(&e.ID, &e.PayoutID, &from, &to, &token, &holder, &e.Actor, &e.Reason, &e.At)
	e.FromState, e.ToState, e.Token, e.Holder = pc.State(from), pc.State(to), fencing.Token(token), fencing.Holder(holder)
	e.At = e.At.UTC()
	return e, err
}

// PayoutEvents lists a payout's accepted state changes after event id after.
func (s *Service) PayoutEvents(ctx context.Context, payoutID string, after int64, limit int) ([]pc.PayoutEvent, error) {
	if _, err := getPayout(ctx, s.pool, payoutID, false); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, payoutEventsSQL, payoutID, after, limit)
	return collect(rows, err, scanEvent)
}

// payoutEventsSQL is a page of payout $1's events after event id $2. The
// payout is compared in byte order, so payout_event_digest_idx, the
// table's one index on payout_id (paydb 00006), finds them.
const payoutEventsSQL = `SELECT id, payout_id, COALESCE(from_state, ''), to_state, COALESCE(token, 0),
		COALESCE(holder, ''), actor, COALESCE(reason, ''), at
		FROM payout_event WHERE payout_id COLLATE "C" = $1 AND id > $2 ORDER BY id LIMIT $3`

// TerminalExits lists, after event id after, the accepted changes of any
// payout out of POSTED, FAILED or ABANDONED: none while the transition
// table holds (INV-08); the reconciler's terminal_state_left reads them.
func (s *Service) TerminalExits(ctx context.Context, after int64, limit int) ([]pc.PayoutEvent, error) {
	rows, err := s.pool.Query(ctx, terminalExitsSQL, after, limit)
	return collect(rows, err, scanEvent)
}

// terminalExitsSQL is a page of TerminalExits: a keyset scan of the
// partial index payout_event_terminal_exit_idx (migration 00009), empty
// while INV-08 holds. Its predicate must match the index's literally.
const terminalExitsSQL = `SELECT id, payout_id, COALESCE(from_state, ''), to_state, COALESCE(token, 0),
		COALESCE(holder, ''), actor, COALESCE(reason, ''), at
		FROM payout_event WHERE from_state IN ('POSTED', 'FAILED', 'ABANDONED') AND id > $1 ORDER BY id LIMIT $2`

// actionableSQL is the predicate of payout_actionable_idx (migration
// 00003), written out so the planner can match the partial index.
const actionableSQL = `state IN ('PENDING', 'CLAIMED', 'RAIL_SUBMITTED', 'RAIL_ACKED')`

// workScanFactor is how many waiting payouts GET /work reads per account
// it may return before it falls back to workSkipSQL.
const workScanFactor = 8

// workCountCap bounds GET /work's count of an account's actionable
// payouts (its payouts member): counting a long queue whole made every
// ask cost that queue, where it should follow the accounts asked for.
const workCountCap = 100

// workCountSQL is the count of the actionable payouts of account o, up to
// workCountCap: at most that many rows read, by the account's index.
var workCountSQL = `(SELECT count(*) FROM (SELECT 1 FROM payout p WHERE p.account_id = o.id AND p.` + actionableSQL +
	` LIMIT ` + strconv.Itoa(workCountCap) + `) c)`

// workSQL reads the payouts that have waited longest, at most $3 of them,
// in payout_waiting_idx's order (created_at, account_id), and answers the
// first $1 accounts they name, leaving out the accounts in skip ($2). An
// account's first payout in that order is its oldest waiting one, so these
// are exactly the $1 accounts whose oldest payout has waited longest —
// unless the $3 payouts named fewer accounts (a few accounts with long
// queues in front): then the last column, the number of payouts read, is
// $3, and Work asks workSkipSQL instead. The statement answers one row
// even when no account has work (id NULL). $4 is GET /work's payouts
// (withActionable).
var workSQL = withActionable(workAccountsSQL, "$4")

// workAccountsSQL is workSQL's accounts.
var workAccountsSQL = `
WITH seen AS (
	SELECT account_id, created_at FROM payout WHERE ` + actionableSQL + `
	 ORDER BY created_at, account_id LIMIT $3
), oldest AS (
	SELECT account_id AS id, min(created_at) AS oldest_at FROM seen
	 WHERE NOT (account_id = ANY($2))
	 GROUP BY account_id ORDER BY 2, 1 LIMIT $1
), read AS (
	SELECT count(*) AS n FROM seen
)
SELECT o.id, ` + workCountSQL + ` AS n,
       o.oldest_at, a.fence_token, read.n AS read
  FROM read LEFT JOIN (oldest o JOIN account a ON a.id = o.id) ON true`

// workSkipSQL answers what workSQL does by skipping from one account to
// the next in payout_actionable_idx, (account_id, created_at): one index
// probe per account with work, however many payouts wait, lands on the
// account's oldest waiting payout. It costs one probe per account with
// work, so it serves only when workSQL's bounded read was not enough. $3
// is GET /work's payouts (withActionable).
var workSkipSQL = withActionable(workSkipAccountsSQL, "$3")

// workSkipAccountsSQL is workSkipSQL's accounts.
var workSkipAccountsSQL = `
WITH RECURSIVE accts(id, oldest_at) AS (
	(SELECT account_id, created_at FROM payout WHERE ` + actionableSQL + ` ORDER BY account_id, created_at LIMIT 1)
	UNION ALL
	SELECT n.account_id, n.created_at FROM accts CROSS JOIN LATERAL (
		SELECT p.account_id, p.created_at FROM payout p WHERE p.` + actionableSQL + ` AND p.account_id > accts.id
		 ORDER BY p.account_id, p.created_at LIMIT 1) n
), oldest AS (
	SELECT id, oldest_at FROM accts WHERE NOT (id = ANY($2))
	 ORDER BY 2, 1 LIMIT $1
)
SELECT o.id, ` + workCountSQL + ` AS n,
       o.oldest_at, a.fence_token, 0::bigint AS read
  FROM oldest o JOIN account a ON a.id = o.id`

// withActionable ends a GET /work statement, work, whose rows are the
// accounts (id, n: its actionable payouts, oldest_at, fence_token, read):
// each account with at most param actionable payouts comes with them, one
// row per payout in id order (payoutCols), read in the same statement and
// so the same snapshot as the account's fence; any other account comes
// once, with NULL payout columns. The account's payouts are read by its
// own index and then sorted: OFFSET 0 keeps the planner from walking the
// primary key in id order to find them (under a generic plan, with most
// of the table actionable, it did: every payout read to answer one).
func withActionable(work, param string) string {
	return `SELECT w.id, w.n, w.oldest_at, w.fence_token, w.read, p.* FROM (` + work + `) w
	LEFT JOIN LATERAL (SELECT * FROM (SELECT ` + payoutCols + ` FROM payout p
		WHERE p.account_id = w.id AND p.` + actionableSQL + ` AND w.n <= ` + param + ` OFFSET 0) q
		ORDER BY q.id LIMIT ` + param + `) p ON true
	ORDER BY w.oldest_at, w.id, p.id`
}

// Work lists accounts with actionable payouts, the longest-waiting first,
// one item per account, leaving out the accounts in skip. An account with
// at most payouts actionable payouts comes with them (WorkItem.Actionable).
// It reads about workScanFactor payouts per account asked for (workSQL);
// only when those name too few accounts does it walk every account with
// work (workSkipSQL).
func (s *Service) Work(ctx context.Context, limit int, skip []string, payouts int) ([]pc.WorkItem, error) {
	if skip == nil {
		skip = []string{}
	}
	budget := int64(limit) * workScanFactor
	items, read, err := s.work(ctx, workSQL, limit, skip, budget, payouts)
	if err != nil || len(items) >= limit || read < budget {
		return items, err
	}
	s.m.workFallbacks.Inc()
	items, _, err = s.work(ctx, workSkipSQL, limit, skip, payouts)
	return items, err
}

// work runs workSQL or workSkipSQL with args and returns the accounts,
// with their actionable payouts where the statement read them, and the
// payouts workSQL read.
func (s *Service) work(ctx context.Context, sql string, args ...any) ([]pc.WorkItem, int64, error) {
	var read int64
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	items := []pc.WorkItem{}
	for rows.Next() {
		var (
			id     *string
			n      *int
			oldest *time.Time
			token  *int64
			p      *pc.Payout
		)
		head := []any{&id, &n, &oldest, &token, &read}
		if raw := rows.RawValues(); raw[len(head)] == nil {
			err = rows.Scan(append(head, make([]any, len(raw)-len(head))...)...) // nil: not scanned
		} else {
			var one pc.Payout
			one, err = scanPayout(tailRow{rows, head})
			p = &one
		}
		if err != nil {
			return nil, 0, err
		}
		if id == nil {
			continue // workSQL's one row with no account stands for "no work"
		}
		if last := len(items) - 1; p != nil && last >= 0 && items[last].AccountID == *id {
			items[last].Actionable = append(items[last].Actionable, *p)
			continue
		}
		w := pc.WorkItem{AccountID: *id, Payouts: *n, OldestAt: oldest.UTC(), FenceToken: fencing.Token(*token)}
		if p != nil {
			w.Actionable = []pc.Payout{*p}
		}
		items = append(items, w)
	}
	return items, read, rows.Err()
}

// tailRow scans a row whose first columns go to head and the rest to the
// destinations its Scan is given.
type tailRow struct {
	rows pgx.Rows
	head []any
}

func (t tailRow) Scan(dest ...any) error { return t.rows.Scan(append(slices.Clip(t.head), dest...)...) }

// Ledger lists ledger entries after entry id after.
func (s *Service) Ledger(ctx context.Context, after int64, limit int) ([]pc.LedgerEntry, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, group_id, account_id, amount, counterparty_account_id,
		COALESCE(payout_id, ''), COALESCE(token, 0), created_at
		FROM ledger_entry WHERE id > $1 ORDER BY id LIMIT $2`, after, limit)
	return collect(rows, err, func(row pgx.Row) (pc.LedgerEntry, error) {
		var e pc.LedgerEntry
		var token int64
		err := row.Scan(&e.ID, &e.GroupID, &e.AccountID, &e.Amount, &e.CounterpartyAccountID, &e.PayoutID, &token, &e.CreatedAt)
		e.Token, e.CreatedAt = fencing.Token(token), e.CreatedAt.UTC()
		return e, err
	})
}

// SafetyEvents lists safety events after event id after. No event can
// later appear behind the last one listed (internal/safetylog).
func (s *Service) SafetyEvents(ctx context.Context, after int64, limit int) ([]pc.SafetyEvent, error) {
	return safetylog.List(ctx, s.pool, after, limit)
}

// HighFence is the highest fence any account stores.
func (s *Service) HighFence(ctx context.Context) (fencing.Token, error) {
	var t int64
	err := s.pool.QueryRow(ctx, `SELECT COALESCE(max(fence_token), 0) FROM account`).Scan(&t)
	return fencing.Token(t), err
}

// insertAccountSQL inserts account $1 in currency $2 with balance $3 unless
// an account of that id exists or is being inserted by a transaction that
// commits. The ON CONFLICT has no target on purpose: account has a second
// unique index, (id, currency), the payouts' foreign key's target, and a
// conflict target of (id) alone would let two concurrent inserts of one id
// fail on that index (23505) instead of one of them doing nothing.
const insertAccountSQL = `INSERT INTO account (id, currency, balance) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`

// CreateAccount creates a customer account with its opening ledger group
// (credit the account, debit funding), so balance equals the sum of its
// entries from the first moment. Idempotent on id; created reports whether
// this call created it.
func (s *Service) CreateAccount(ctx context.Context, req pc.CreateAccountRequest) (acct pc.Account, created bool, err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return acct, false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	tag, err := tx.Exec(ctx, insertAccountSQL, req.ID, req.Currency, req.OpeningBalance)
	if err != nil {
		return acct, false, err
	}
	if tag.RowsAffected() == 0 {
		_ = tx.Rollback(ctx)
		return s.existingAccount(ctx, req)
	}
	if req.OpeningBalance != 0 {
		group := "open:" + req.ID
		if _, err := tx.Exec(ctx, `INSERT INTO ledger_entry (group_id, account_id, amount, counterparty_account_id)
			VALUES ($1, $2, $3, $4), ($1, $4, -$3::bigint, $2)`, group, req.ID, req.OpeningBalance, pc.FundingAccount); err != nil {
			return acct, false, err
		}
		if _, err := tx.Exec(ctx, `UPDATE account SET balance = balance - $2, version = version + 1, updated_at = now() WHERE id = $1`,
			pc.FundingAccount, req.OpeningBalance); err != nil {
			if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "22003" /* numeric_value_out_of_range */ {
				return acct, false, problem.Wrap(problem.Conflict, err,
					"the %s account's balance (minus every opening balance so far) cannot go below -2^63 minor units; "+
						"this opening balance of %d would take it there", pc.FundingAccount, req.OpeningBalance)
			}
			return acct, false, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return acct, false, err
	}
	acct, err = getAccount(ctx, s.pool, req.ID)
	return acct, true, err
}

func (s *Service) existingAccount(ctx context.Context, req pc.CreateAccountRequest) (pc.Account, bool, error) {
	var cur string
	var opening int64
	err := s.pool.QueryRow(ctx, `SELECT a.currency, COALESCE((SELECT sum(e.amount) FROM ledger_entry e
		WHERE e.group_id = 'open:' || a.id AND e.account_id = a.id), 0)::bigint FROM account a WHERE a.id = $1`, req.ID).Scan(&cur, &opening)
	if err != nil {
		return pc.Account{}, false, err
	}
	if cur != req.Currency || opening != req.OpeningBalance {
		return pc.Account{}, false, problem.New(problem.Conflict,
			"account %q already exists with currency %s and opening_balance %d", req.ID, cur, opening)
	}
	a, err := getAccount(ctx, s.pool, req.ID)
	return a, false, err
}

// createPayoutsSQL creates PENDING payouts, each with its creation event,
// in one statement (one round trip, its own transaction): payout n of the
// arrays $1..$7 (id, account, amount, currency, beneficiary, client_ref,
// actor) only when its account exists and holds its currency. It answers
// one row per payout, in order: n; what happened — 'created'; 'exists' (a
// payout already has this id: the row is that payout); 'none' (nothing
// written, nothing under this id in the statement's snapshot: the row is
// the request itself, a stand-in) — then the account's currency (NULL: no
// such account), then the payout. The ids must be distinct.
//
// The insert yields to a conflict on any unique index, not only the
// primary key: client_ref is derived from the id (D-10), so a payout
// holding this client_ref is one with this id, and a concurrent create of
// the same id that commits between the key's check and the client_ref
// index's would otherwise fail with a unique violation instead of a replay.
// Rows are inserted in id order, so two statements creating some of the
// same ids wait for each other in one order, never in a cycle.
const createPayoutsSQL = `WITH r AS (
		SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[])
		  WITH ORDINALITY AS r(id, account_id, amount, currency, beneficiary_ref, client_ref, actor, n)
	), acct AS (
		SELECT r.n, a.currency FROM r JOIN account a ON a.id = r.account_id
	), ins AS (
		INSERT INTO payout (id, account_id, amount, currency, beneficiary_ref, client_ref)
		SELECT r.id, r.account_id, r.amount, r.currency, r.beneficiary_ref, r.client_ref
		  FROM r JOIN acct ON acct.n = r.n AND acct.currency = r.currency
		 ORDER BY r.id
		ON CONFLICT DO NOTHING
		RETURNING *
	), ev AS (
		INSERT INTO payout_event (payout_id, from_state, to_state, actor, reason)
		SELECT ins.id, NULL, ins.state, r.actor, 'created' FROM ins JOIN r ON r.id = ins.id ORDER BY r.n
	), found AS (
		SELECT 'created' AS outcome, * FROM ins
		UNION ALL
		SELECT 'exists', * FROM payout p WHERE p.id IN (SELECT id FROM r) AND p.id NOT IN (SELECT id FROM ins)
	)
	SELECT r.n, COALESCE(f.outcome, 'none'), acct.currency,
	       COALESCE(f.id, r.id), COALESCE(f.account_id, r.account_id), COALESCE(f.amount, r.amount),
	       COALESCE(f.currency, r.currency), COALESCE(f.beneficiary_ref, r.beneficiary_ref),
	       COALESCE(f.state, 'PENDING'), COALESCE(f.client_ref, r.client_ref),
	       COALESCE(f.claimed_by, ''), COALESCE(f.token, 0), COALESCE(f.failure_reason, ''),
	       COALESCE(f.rail_ref, ''), COALESCE(f.rail_error_code, ''),
	       COALESCE(f.created_at, now()), f.claimed_at, f.submitted_at, f.settled_at
	  FROM r LEFT JOIN acct ON acct.n = r.n LEFT JOIN found f ON f.id = r.id
	 ORDER BY r.n`

// createRequest is one payout to create, with who asks.
type createRequest struct {
	req   pc.CreatePayoutRequest
	actor string
}

// createAnswer is what createPayoutsSQL answered for one payout, or the
// error that kept it from answering.
type createAnswer struct {
	outcome  string
	currency *string
	payout   pc.Payout
	err      error
}

// createPayouts writes a batch of creates (the creates batcher's Func). Ids
// repeated in the batch go in a statement of their own after the first, so
// each statement's ids are distinct and the later create of an id is
// answered as its replay. When a statement of several payouts fails, each
// of them is tried alone, so one bad payout fails only its own create.
func (s *Service) createPayouts(ctx context.Context, reqs []createRequest) ([]createAnswer, error) {
	out := make([]createAnswer, len(reqs))
	// Calls of GET /v1/work waiting for work, here and in the other
	// processes on this paydb, learn of the new payouts once they are
	// committed; a batch that created none (replays, or every statement
	// failed as when paydb is down) announces nothing: there is no new
	// work, and an announcement would only fail too.
	defer func() {
		for _, a := range out {
			if a.err == nil && a.outcome == "created" {
				s.workArrived()
				return
			}
		}
	}()
	for _, round := range batcher.Distinct(len(reqs), func(i int) string { return reqs[i].req.ID }) {
		err := s.createDistinct(ctx, reqs, round, out)
		if err == nil {
			continue
		}
		if len(round) == 1 {
			out[round[0]].err = err
			continue
		}
		for _, i := range round {
			if err := s.createDistinct(ctx, reqs, []int{i}, out); err != nil {
				out[i].err = err
			}
		}
	}
	return out, nil
}

// createDistinct runs createPayoutsSQL for reqs[i], i in ix (distinct ids),
// into out[i].
func (s *Service) createDistinct(ctx context.Context, reqs []createRequest, ix []int, out []createAnswer) error {
	var (
		ids, accounts, currencies, beneficiaries, clientRefs, actors []string
		amounts                                                      []int64
	)
	for _, i := range ix {
		r := reqs[i].req
		ids, accounts, amounts = append(ids, r.ID), append(accounts, r.AccountID), append(amounts, r.Amount)
		currencies, beneficiaries = append(currencies, r.Currency), append(beneficiaries, r.BeneficiaryRef)
		clientRefs, actors = append(clientRefs, pc.ClientRef(r.ID)), append(actors, reqs[i].actor)
	}
	rows, err := s.pool.Query(ctx, createPayoutsSQL, ids, accounts, amounts, currencies, beneficiaries, clientRefs, actors)
	answers, err := collect(rows, err, func(row pgx.Row) (createAnswer, error) {
		var (
			a createAnswer
			n int64
		)
		a.payout, a.err = scanPayout(prefixedRow{row, []any{&n, &a.outcome, &a.currency}})
		return a, a.err
	})
	if err != nil {
		return fmt.Errorf("create payout: %w", err)
	}
	if len(answers) != len(ix) {
		return fmt.Errorf("create payout: %d answers for %d payouts", len(answers), len(ix))
	}
	for k, i := range ix {
		out[i] = answers[k]
	}
	return nil
}

// prefixedRow scans its first columns into dest, the rest into Scan's.
type prefixedRow struct {
	row  pgx.Row
	dest []any
}

func (r prefixedRow) Scan(dest ...any) error { return r.row.Scan(append(r.dest, dest...)...) }

// CreatePayout creates a PENDING payout with its creation event. Idempotent
// on id: the same body returns the payout as it stands, a different one is
// a conflict, whatever else is wrong with it (contract §4). created reports
// whether this call created it. A new payout's account must exist and hold
// its currency.
func (s *Service) CreatePayout(ctx context.Context, req pc.CreatePayoutRequest, actor string) (p pc.Payout, created bool, err error) {
	a, err := s.creates.Do(ctx, createRequest{req: req, actor: actor})
	if err == nil {
		err = a.err
	}
	outcome, cur := a.outcome, a.currency
	p = a.payout
	switch {
	case err != nil:
		return pc.Payout{}, false, err
	case outcome == "exists":
		return replay(req, p)
	case cur == nil:
		return pc.Payout{}, false, problem.New(problem.InvalidRequest, "account_id: no account %q", req.AccountID).With("field", "account_id")
	case *cur != req.Currency:
		return pc.Payout{}, false, problem.New(problem.InvalidRequest, "currency: account %q holds %s, not %s", req.AccountID, *cur, req.Currency).With("field", "currency")
	case outcome == "created":
		s.m.transitions.WithLabelValues("", string(pc.Pending)).Inc()
		return p, true, nil
	case outcome == "none":
		// Created by a concurrent request that committed after this
		// statement's snapshot was taken: read it as it now stands.
		if p, err = getPayout(ctx, s.pool, req.ID, false); err != nil {
			return pc.Payout{}, false, err
		}
	}
	return replay(req, p)
}

// replay answers a create of payout p's id again: p itself for the same
// body, a conflict for any other.
func replay(req pc.CreatePayoutRequest, p pc.Payout) (pc.Payout, bool, error) {
	if p.AccountID != req.AccountID || p.Amount != req.Amount || p.Currency != req.Currency || p.BeneficiaryRef != req.BeneficiaryRef {
		return pc.Payout{}, false, problem.New(problem.Conflict, "payout %q already exists with a different body", req.ID).With("payout", p)
	}
	return p, false, nil
}
