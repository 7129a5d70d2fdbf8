//go:build !negativecontrol

package railproxy

// intentSQL writes a submission's intent row (INV-02's primary, with the
// partial unique index rail_submission_one_forwarded_per_payout): a payout
// that already has a forwarded submission inserts nothing and is refused as
// a duplicate attempt. intent_negativecontrol.go holds the negative-control
// variant.
const intentSQL = `
INSERT INTO rail_submission (payout_id, account_id, fence_token, holder, client_ref, amount, currency, beneficiary_ref)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (payout_id) WHERE outcome IS DISTINCT FROM 'FENCED' DO NOTHING
RETURNING `

// uniqueIntentEnabled reports whether the intent insert names the one
// forwarded submission per payout index as its arbiter.
const uniqueIntentEnabled = true
