//go:build !negativecontrol

package railproxy

// intentSQL writes the intent rows of a submission or a batch in one
// statement (INV-02's primary, with the partial unique index
// rail_submission_one_forwarded_per_payout): a payout that already has a
// forwarded submission inserts nothing, returns no row and is refused as a
// duplicate attempt. intent_negativecontrol.go holds the negative-control
// variant.
const intentSQL = intentRows + `ON CONFLICT (payout_id) WHERE outcome IS DISTINCT FROM 'FENCED' DO NOTHING
RETURNING `

// uniqueIntentEnabled reports whether the intent insert names the one
// forwarded submission per payout index as its arbiter.
const uniqueIntentEnabled = true
