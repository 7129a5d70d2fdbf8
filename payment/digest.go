package payment

import (
	"context"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/internal/wire"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// payoutDigestsSQL reads one page of payouts in byte order of their ids
// ($1: after, $2: limit) with the tokens of each one's history, the state
// its last event moved it to and whether an event starts from a state the
// one before it did not end in (each event's from_state against the
// to_state before it), in one statement (one snapshot): a
// keyset scan of payout_id_bytes_idx, then one index-only range scan of
// payout_event_digest_idx over the page's ids, merged by payout id
// (migrations 00004, 00010). Byte order, not the
// database's collation: the reconciler merges this stream with the
// proxy's and the rail's, which use it too. Each payout's ledger entries
// are summed in the same statement through ledger_entry_payout_idx: a
// posting commits with its payout's move to POSTED, so the two are read
// consistently ($3: the clearing account).
const payoutDigestsSQL = `
WITH p AS (
	SELECT id, account_id, amount, currency, state, client_ref, created_at, claimed_at, submitted_at
	  FROM payout WHERE id COLLATE "C" > $1 ORDER BY id COLLATE "C" LIMIT $2
), e AS (
	SELECT payout_id COLLATE "C" AS payout_id, array_agg(COALESCE(token, 0) ORDER BY id) AS tokens,
	       array_agg(from_state ORDER BY id) AS froms, array_agg(to_state ORDER BY id) AS tos
	  FROM payout_event
	 WHERE payout_id COLLATE "C" > $1 AND payout_id COLLATE "C" <= (SELECT max(id COLLATE "C") FROM p)
	 GROUP BY 1
)
SELECT p.id, p.account_id, p.amount, p.currency, p.state, p.client_ref, p.created_at, p.claimed_at, p.submitted_at,
       COALESCE(e.tokens, '{}'), COALESCE(e.tos[cardinality(e.tos)], ''),
       COALESCE(e.froms[2:] IS DISTINCT FROM e.tos[:cardinality(e.tos) - 1], false), COALESCE(l.entries, 0), COALESCE(l.groups, 0), COALESCE(l.own, 0), COALESCE(l.clearing, 0)
  FROM p LEFT JOIN e ON e.payout_id = p.id COLLATE "C"
  LEFT JOIN (
	SELECT le.payout_id, count(*) AS entries, count(DISTINCT le.group_id) AS groups,
	       sum(le.amount) FILTER (WHERE le.account_id = pp.account_id)::bigint AS own,
	       sum(le.amount) FILTER (WHERE le.account_id = $3)::bigint AS clearing
	  FROM ledger_entry le JOIN p pp ON pp.id = le.payout_id
	 WHERE le.payout_id = ANY (ARRAY(SELECT id FROM p))
	 GROUP BY le.payout_id
 ) l ON l.payout_id = p.id
 ORDER BY p.id COLLATE "C"`

// PayoutDigests lists up to limit payout digests after payout id after.
func (s *Service) PayoutDigests(ctx context.Context, after string, limit int) ([]pc.PayoutDigest, error) {
	rows, err := s.pool.Query(ctx, payoutDigestsSQL, after, limit, pc.ClearingAccount)
	return collect(rows, err, func(row pgx.Row) (pc.PayoutDigest, error) {
		d := pc.PayoutDigest{Ledger: &pc.LedgerDigest{}}
		var state, last string
		err := row.Scan(&d.ID, &d.AccountID, &d.Amount, &d.Currency, &state, &d.ClientRef, &d.CreatedAt, &d.ClaimedAt, &d.SubmittedAt, &d.EventTokens,
			&last, &d.HistoryJumps, &d.Ledger.Entries, &d.Ledger.Groups, &d.Ledger.Account, &d.Ledger.Clearing)
		d.State, d.HistoryState, d.CreatedAt = pc.State(state), pc.State(last), d.CreatedAt.UTC()
		for _, t := range []*time.Time{d.ClaimedAt, d.SubmittedAt} {
			if t != nil {
				*t = t.UTC()
			}
		}
		return d, err
	})
}

func (s *Service) handlePayoutDigests(w http.ResponseWriter, r *http.Request) error {
	q, err := wire.Query(r.URL.RawQuery, "after", "limit")
	if err != nil {
		return err
	}
	limit, err := wire.ParseBulkLimit(q)
	if err != nil {
		return err
	}
	after, err := wire.ParseKeyCursor(q)
	if err != nil {
		return err
	}
	items, err := s.PayoutDigests(r.Context(), after, limit)
	if err != nil {
		return err
	}
	writeList(w, items, limit, func(d pc.PayoutDigest) string { return d.ID })
	return nil
}
