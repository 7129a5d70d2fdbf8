package railproxy

import (
	"context"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

const submissionDigestsSQL = `SELECT id, payout_id, account_id, fence_token, holder, coalesce(outcome, ''), coalesce(resolution, ''), created_at
	FROM rail_submission WHERE (payout_id COLLATE "C", id) > ($1, $2) ORDER BY payout_id COLLATE "C", id LIMIT $3`

// submissionDigests lists up to limit attempts ordered by (payout_id in
// byte order, id) after the attempt (afterPayout, afterID): an index-only
// keyset scan of rail_submission_digest_idx (migration 00004). Byte
// order, not the database's collation: the reconciler merges this stream
// with the payment resource's and the rail's, which use it too.
func (st *store) submissionDigests(ctx context.Context, afterPayout string, afterID int64, limit int) ([]proxyclient.SubmissionDigest, error) {
	rows, err := st.pool.Query(ctx, submissionDigestsSQL, afterPayout, afterID, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (proxyclient.SubmissionDigest, error) {
		var (
			d                      proxyclient.SubmissionDigest
			token                  int64
			holder, outcome, resol string
		)
		err := row.Scan(&d.ID, &d.PayoutID, &d.AccountID, &token, &holder, &outcome, &resol, &d.CreatedAt)
		d.CreatedAt = d.CreatedAt.UTC()
		d.FenceToken, d.Holder = fencing.Token(token), fencing.Holder(holder)
		d.Outcome, d.Resolution = proxyclient.Outcome(outcome), proxyclient.Resolution(resol)
		return d, err
	})
}

func (s *Server) submissionDigestsHandler(w http.ResponseWriter, r *http.Request) error {
	q, err := wire.Query(r.URL.RawQuery, "after", "limit")
	if err != nil {
		return err
	}
	limit, err := wire.ParseBulkLimit(q)
	if err != nil {
		return err
	}
	payoutID, id, err := proxyclient.ParseSubmissionDigestCursor(q.Get("after"))
	if err != nil {
		return err
	}
	items, err := s.st.submissionDigests(r.Context(), payoutID, id, limit)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, wire.NewPage(items, limit, proxyclient.SubmissionDigestCursor))
	return nil
}
