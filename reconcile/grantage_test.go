package reconcile_test

import (
	"testing"
	"time"

	"github.com/payouts/payouts/reconcile"
)

// A submission is dated by when it was written, not by when its payout
// became RAIL_SUBMITTED: a resubmission by a later holder (D-4) comes long
// after, and one forwarded now under a token the lock service never
// granted is a submission_without_grant finding (INV-07) even when the
// payout became RAIL_SUBMITTED before the grant log's retention. Before,
// it was taken for a write older than the retention and left unchecked.
func TestSubmissionIsDatedByItsOwnWrite(t *testing.T) {
	t.Parallel()
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.newPayout(t, acc, 10)
	const never = 4_400_000_000_000
	e.exec(t, "paydb", true, `UPDATE payout SET state = 'RAIL_SUBMITTED', submitted_at = now() - interval '8 days' WHERE id = $1`, p.ID)
	e.exec(t, "proxydb", false, `INSERT INTO rail_submission (payout_id, account_id, fence_token, holder, client_ref, amount, currency, beneficiary_ref)
		VALUES ($1, $2, $3, 'ungranted', $4, $5, 'EUR', $6)`, p.ID, acc, never, p.ClientRef, p.Amount, p.BeneficiaryRef)
	rep := pass(t, e.reconciler(t, reconcile.Options{GrantRetention: 7 * 24 * time.Hour}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV07, reconcile.CheckSubmissionWithoutGrant, map[string]any{"payout_id": p.ID, "token": never})
}
