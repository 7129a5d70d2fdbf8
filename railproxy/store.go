package railproxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/payouts/payouts/internal/batcher"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/payouts/payouts/internal/safetylog"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// store is the proxy's access to proxydb. Every write path is here.
type store struct {
	pool     *pgxpool.Pool
	outcomes *batcher.Batcher[outcomeRequest, outcomeAnswer] // recordOutcome's groups (outcomes.go)
	// resolvable is written with each intent: how long after it this
	// proxy may still send it (its send window and rail timeout).
	resolvable time.Duration
}

// intentResult is how the intent transaction ended.
type intentResult int

const (
	intentWritten intentResult = iota // high-water advanced, intent committed: forward it
	intentFenced                      // the guard refused the token: nothing written
	intentExists                      // the payout already has a forwarded submission: nothing written
)

const recordCols = `id, payout_id, account_id, fence_token, holder, client_ref, amount, currency,
	beneficiary_ref, coalesce(outcome, ''), coalesce(rail_ref, ''), coalesce(error_code, ''),
	coalesce(resolution, ''), resolution_evidence, created_at, outcome_at, resolution_at`

func scanRecord(row pgx.Row) (proxyclient.Record, error) {
	var (
		r        proxyclient.Record
		token    int64
		holder   string
		outcome  string
		res      string
		evidence *string
	)
	err := row.Scan(&r.ID, &r.PayoutID, &r.AccountID, &token, &holder, &r.ClientRef, &r.Amount, &r.Currency,
		&r.BeneficiaryRef, &outcome, &r.RailRef, &r.ErrorCode, &res, &evidence, &r.CreatedAt, &r.OutcomeAt, &r.ResolutionAt)
	if err != nil {
		return r, err
	}
	r.FenceToken, r.Holder = fencing.Token(token), fencing.Holder(holder)
	r.Outcome, r.Resolution = proxyclient.Outcome(outcome), proxyclient.Resolution(res)
	if evidence != nil {
		if json.Valid([]byte(*evidence)) {
			r.ResolutionEvidence = json.RawMessage(*evidence)
		} else {
			r.ResolutionEvidence, _ = json.Marshal(*evidence)
		}
	}
	return r, nil
}

func collectRecords(rows pgx.Rows) ([]proxyclient.Record, error) {
	defer rows.Close()
	out := []proxyclient.Record{}
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// mark is an account's high-water mark as guard 2's statement returned it.
type mark struct {
	token  fencing.Token
	holder fencing.Holder
}

// writeIntent runs a single submission's one transaction (writeIntents
// with one item): for intentFenced it returns the mark that refused the
// token; intentExists wrote nothing.
func (st *store) writeIntent(ctx context.Context, req proxyclient.SubmitRequest) (proxyclient.Record, mark, intentResult, error) {
	recs, res, m, fenced, err := st.writeIntents(ctx, []proxyclient.SubmitRequest{req})
	switch {
	case err != nil:
		return proxyclient.Record{}, m, 0, err
	case fenced:
		return proxyclient.Record{}, m, intentFenced, nil
	}
	return recs[0], m, res[0], nil
}

// queueGuard queues guard 2 (highWaterSQL, guard.go) on b; the caller sends
// b as the transaction's first statements, so the guard runs first. Its
// answer is read with scanGuard.
func queueGuard(b *pgx.Batch, account string, token fencing.Token, holder fencing.Holder) {
	b.Queue(highWaterSQL, account, int64(token), string(holder))
}

// scanGuard reads guard 2's answer: accepted reports whether the account's
// fence admits the token; m is the mark the statement judged against.
func scanGuard(row pgx.Row) (m mark, accepted bool, err error) {
	var (
		t int64
		h string
	)
	if err := row.Scan(&t, &h, &accepted); err != nil {
		return m, false, fmt.Errorf("advance high-water: %w", err)
	}
	return mark{token: fencing.Token(t), holder: fencing.Holder(h)}, accepted, nil
}

// Submission rows from intentArgs: one row per element of the arrays $4..$8
// (payout id, client reference, amount, currency, beneficiary), all under
// the batch's account ($1), token ($2) and holder ($3), resolvable after $9
// seconds.
const (
	submissionCols   = `payout_id, account_id, fence_token, holder, client_ref, amount, currency, beneficiary_ref, resolvable_after`
	submissionVals   = `u.payout_id, $1::text, $2::bigint, $3::text, u.client_ref, u.amount, u.currency, u.beneficiary_ref, make_interval(secs => $9::float8)`
	submissionArrays = `FROM unnest($4::text[], $5::text[], $6::bigint[], $7::text[], $8::text[]) AS u(payout_id, client_ref, amount, currency, beneficiary_ref)`
)

// intentRows inserts a batch's intents (the rest of the statement, in
// intent.go and intent_negativecontrol.go, is the ON CONFLICT clause and
// RETURNING).
const intentRows = `
INSERT INTO rail_submission (` + submissionCols + `)
SELECT ` + submissionVals + `
  ` + submissionArrays + `
`

// fencedRowsSQL inserts the FENCED rows of refused submissions (D-5; the
// uniqueness of forwarded submissions leaves FENCED rows out).
const fencedRowsSQL = `
INSERT INTO rail_submission (` + submissionCols + `, outcome, error_code)
SELECT ` + submissionVals + `, 'FENCED', 'fenced_out'
  ` + submissionArrays + `
RETURNING ` + recordCols

// intentArgs are the parameters of intentSQL for reqs, one submission's
// or a batch's (one account, token and holder: reqs[0]'s).
func (st *store) intentArgs(reqs []proxyclient.SubmitRequest) []any {
	n := len(reqs)
	payouts, refs, amounts, currencies, beneficiaries := make([]string, n), make([]string, n), make([]int64, n), make([]string, n), make([]string, n)
	for i, r := range reqs {
		payouts[i], refs[i], amounts[i], currencies[i], beneficiaries[i] = r.PayoutID, r.ClientRef, r.Amount, r.Currency, r.BeneficiaryRef
	}
	first := reqs[0]
	return []any{first.AccountID, int64(first.Token), string(first.Holder), payouts, refs, amounts, currencies, beneficiaries, st.resolvable.Seconds()}
}

// fencedEvidence is what recordFenced wrote.
type fencedEvidence struct {
	Record       proxyclient.Record
	StoredToken  fencing.Token
	StoredHolder fencing.Holder
	Regression   bool // equal token, different holder: a token was re-issued
}

// recordFenced writes, in a transaction of its own, the FENCED row (D-5)
// of each refused submission — one, or each item of a refused batch — and
// the safety event(s) of the refusal, once, for the first: one request, one
// refusal. It is judged from refusedBy, the mark guard 2's statement
// refused the token against. The evidence returned carries the first's row.
func (st *store) recordFenced(ctx context.Context, reqs []proxyclient.SubmitRequest, refusedBy mark, detail string) (fencedEvidence, error) {
	first := reqs[0]
	ev := fencedEvidence{StoredToken: refusedBy.token, StoredHolder: refusedBy.holder}
	ev.Regression = ev.StoredToken == first.Token && ev.StoredHolder != first.Holder
	err := pgx.BeginFunc(ctx, st.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, fencedRowsSQL, st.intentArgs(reqs)...)
		if err != nil {
			return fmt.Errorf("insert FENCED rows: %w", err)
		}
		recs, err := collectRecords(rows)
		if err != nil {
			return fmt.Errorf("insert FENCED rows: %w", err)
		}
		for _, rec := range recs {
			if rec.PayoutID == first.PayoutID {
				ev.Record = rec
			}
		}
		events := []safetylog.Event{safetyEvent(proxyclient.KindFencedOut, first, ev.StoredToken, ev.StoredHolder, detail)}
		if ev.Regression {
			events = append(events, safetyEvent(proxyclient.KindTokenRegression, first, ev.StoredToken, ev.StoredHolder,
				fmt.Sprintf("token %d presented at the proxy by holder %q but already accepted from holder %q: a token was re-issued (INV-04)", first.Token, first.Holder, ev.StoredHolder)))
		}
		return safetylog.Insert(ctx, tx, events...)
	})
	return ev, err
}

// recordDuplicate writes the duplicate_attempt safety event, in a
// transaction of its own, and returns the existing forwarded record.
func (st *store) recordDuplicate(ctx context.Context, req proxyclient.SubmitRequest) (proxyclient.Record, error) {
	var existing proxyclient.Record
	err := pgx.BeginFunc(ctx, st.pool, func(tx pgx.Tx) error {
		var err error
		existing, err = scanRecord(tx.QueryRow(ctx, `SELECT `+recordCols+` FROM rail_submission
			WHERE payout_id = $1 AND outcome IS DISTINCT FROM 'FENCED'`, req.PayoutID))
		if err != nil {
			return fmt.Errorf("read existing submission: %w", err)
		}
		detail := fmt.Sprintf("payout %s already has forwarded submission %d (token %d, holder %s, outcome %s)",
			req.PayoutID, existing.ID, existing.FenceToken, existing.Holder, outcomeText(existing.Outcome))
		return safetylog.Insert(ctx, tx, safetyEvent(proxyclient.KindDuplicateAttempt, req, existing.FenceToken, existing.Holder, detail))
	})
	return existing, err
}

// recordEvents writes safety events in a transaction of their own.
func (st *store) recordEvents(ctx context.Context, events ...safetylog.Event) error {
	return pgx.BeginFunc(ctx, st.pool, func(tx pgx.Tx) error { return safetylog.Insert(ctx, tx, events...) })
}

func outcomeText(o proxyclient.Outcome) string {
	if o == proxyclient.OutcomeNone {
		return "not yet recorded"
	}
	return string(o)
}

// safetyEvent is the evidence of a refused submission.
func safetyEvent(kind string, req proxyclient.SubmitRequest, storedToken fencing.Token, storedHolder fencing.Holder, detail string) safetylog.Event {
	return safetylog.Event{Kind: kind, Key: fencing.Key(req.AccountID), Presented: req.Token, Stored: storedToken,
		Holder: req.Holder, StoredHolder: storedHolder, PayoutID: req.PayoutID, Detail: detail}
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// recordResolution writes the resolution of an ambiguous submission, once
// (D-6), only if its outcome is still read (the outcome the evidence was
// gathered against). A row with no outcome is only resolved once it is older
// than minAge: younger, its forwarding may still be under way. It returns
// false when nothing was written.
func (st *store) recordResolution(ctx context.Context, id int64, read proxyclient.Outcome, res proxyclient.Resolution, evidence []byte, minAge time.Duration) (proxyclient.Record, bool, error) {
	rec, err := scanRecord(st.pool.QueryRow(ctx, `
		UPDATE rail_submission SET resolution = $2, resolution_evidence = $3
		 WHERE id = $1 AND resolution IS NULL
		   AND outcome IS NOT DISTINCT FROM $5
		   AND (outcome = 'TIMEOUT' OR (outcome IS NULL AND `+resolvableSQL("$4")+`))
		RETURNING `+recordCols, id, string(res), string(evidence), minAge.Seconds(), nullIfEmpty(string(read))))
	if errors.Is(err, pgx.ErrNoRows) {
		return proxyclient.Record{}, false, nil
	}
	return rec, err == nil, err
}

// resolvableSQL is true for a submission row no proxy may still send: older
// than the window its writer recorded (resolvable_after) and than age, the
// parameter param, in seconds — this proxy's own, by the database's clock
// (the one that dated it). GREATEST ignores a NULL resolvable_after (a row
// written before it was recorded).
func resolvableSQL(param string) string {
	return `created_at + GREATEST(resolvable_after, make_interval(secs => ` + param + `)) < now()`
}

// olderThan reports whether no proxy may still send submission id: it was
// written more than age (this proxy's window) and more than its writer's
// window ago.
func (st *store) olderThan(ctx context.Context, id int64, age time.Duration) (bool, error) {
	var old bool
	err := st.pool.QueryRow(ctx, `SELECT `+resolvableSQL("$2")+` FROM rail_submission WHERE id = $1`,
		id, age.Seconds()).Scan(&old)
	return old, err
}

// forwarded returns the payout's forwarded submission (pgx.ErrNoRows if none).
func (st *store) forwarded(ctx context.Context, payoutID string) (proxyclient.Record, error) {
	return scanRecord(st.pool.QueryRow(ctx, `SELECT `+recordCols+` FROM rail_submission
		WHERE payout_id = $1 AND outcome IS DISTINCT FROM 'FENCED'`, payoutID))
}

// current returns the forwarded submission, else the newest FENCED attempt.
func (st *store) current(ctx context.Context, payoutID string) (proxyclient.Record, error) {
	return scanRecord(st.pool.QueryRow(ctx, `SELECT `+recordCols+` FROM rail_submission
		WHERE payout_id = $1
		ORDER BY (outcome IS DISTINCT FROM 'FENCED') DESC, id DESC LIMIT 1`, payoutID))
}

func (st *store) all(ctx context.Context, payoutID string) ([]proxyclient.Record, error) {
	rows, err := st.pool.Query(ctx, `SELECT `+recordCols+` FROM rail_submission WHERE payout_id = $1 ORDER BY id`, payoutID)
	if err != nil {
		return nil, err
	}
	return collectRecords(rows)
}

func (st *store) list(ctx context.Context, after int64, limit int) ([]proxyclient.Record, error) {
	rows, err := st.pool.Query(ctx, `SELECT `+recordCols+` FROM rail_submission WHERE id > $1 ORDER BY id LIMIT $2`, after, limit)
	if err != nil {
		return nil, err
	}
	return collectRecords(rows)
}

// submissionOrder lists the forwarded submissions after id after, in id
// order: per account, the order in which they committed (an intent's id
// is drawn after the guard has taken the account's high-water row, which
// it holds until the commit). A keyset scan of the primary key.
func (st *store) submissionOrder(ctx context.Context, after int64, limit int) ([]proxyclient.SubmissionOrder, error) {
	rows, err := st.pool.Query(ctx, submissionOrderSQL, after, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (proxyclient.SubmissionOrder, error) {
		var o proxyclient.SubmissionOrder
		var token int64
		err := row.Scan(&o.ID, &o.PayoutID, &o.AccountID, &token)
		o.FenceToken = fencing.Token(token)
		return o, err
	})
}

// submissionOrderSQL is submissionOrder's statement.
const submissionOrderSQL = `SELECT id, payout_id, account_id, fence_token FROM rail_submission
	WHERE id > $1 AND outcome IS DISTINCT FROM 'FENCED' ORDER BY id LIMIT $2`

// safetyEvents lists safety events after id after; no event can later
// appear behind the last one listed (internal/safetylog).
func (st *store) safetyEvents(ctx context.Context, after int64, limit int) ([]proxyclient.SafetyEvent, error) {
	return safetylog.List(ctx, st.pool, after, limit)
}

func (st *store) highFence(ctx context.Context) (fencing.Token, error) {
	var t int64
	err := st.pool.QueryRow(ctx, `SELECT coalesce(max(token), 0) FROM account_high_water`).Scan(&t)
	return fencing.Token(t), err
}

func (st *store) highWater(ctx context.Context, after string, limit int) ([]proxyclient.HighWater, error) {
	rows, err := st.pool.Query(ctx, `SELECT account_id, token, holder, updated_at FROM account_high_water
		WHERE account_id > $1 ORDER BY account_id LIMIT $2`, after, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (proxyclient.HighWater, error) {
		var h proxyclient.HighWater
		var t int64
		var holder string
		err := row.Scan(&h.AccountID, &t, &holder, &h.UpdatedAt)
		h.Token, h.Holder = fencing.Token(t), fencing.Holder(holder)
		return h, err
	})
}

// unresolvedCounts counts forwarded rows with no outcome older than age
// (forwarding died or is stuck), and TIMEOUT rows with no resolution.
func (st *store) unresolvedCounts(ctx context.Context, age time.Duration) (noOutcome, timeoutUnresolved int64, err error) {
	err = st.pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE outcome IS NULL AND `+resolvableSQL("$1")+`),
		       count(*) FILTER (WHERE outcome = 'TIMEOUT')
		  FROM rail_submission
		 WHERE (outcome IS NULL OR outcome = 'TIMEOUT') AND resolution IS NULL`, age.Seconds()).Scan(&noOutcome, &timeoutUnresolved)
	return noOutcome, timeoutUnresolved, err
}
