//go:build negativecontrol

package railproxy

// intentSQL in the negative-control build (tests only, never released): the
// insert no longer names the one forwarded submission per payout index, so
// it behaves as in a release build while the index exists, and lets a
// second forwarded submission land once a test drops the index from its
// own database.
const intentSQL = `
INSERT INTO rail_submission (payout_id, account_id, fence_token, holder, client_ref, amount, currency, beneficiary_ref)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT DO NOTHING
RETURNING `

// uniqueIntentEnabled reports whether the intent insert names the one
// forwarded submission per payout index as its arbiter.
const uniqueIntentEnabled = false
