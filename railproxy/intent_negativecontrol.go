//go:build negativecontrol

package railproxy

// intentSQL in the negative-control build (tests only, never released): the
// insert (of every intent of a submission or a batch, in one statement)
// no longer names the one forwarded submission per payout index, so
// it behaves as in a release build while the index exists, and lets a
// second forwarded submission land once a test drops the index from its
// own database.
const intentSQL = intentRows + `ON CONFLICT DO NOTHING
RETURNING `

// uniqueIntentEnabled reports whether the intent insert names the one
// forwarded submission per payout index as its arbiter.
const uniqueIntentEnabled = false
