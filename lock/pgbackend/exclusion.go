//go:build !negativecontrol

package pgbackend

// takeoverSQL is the mutual-exclusion condition of the acquire (INV-06's
// primary on this backend): an existing entry is taken over only when its
// session is no longer live and is ended by this statement (lapsed), or
// had already ended; in the same compare-and-swap on its token.
// exclusion_negativecontrol.go holds the negative-control variant.
const takeoverSQL = `NOT cur.live AND (cur.state <> 'ACTIVE' OR EXISTS (SELECT 1 FROM lapsed))`

// exclusionEnabled reports whether this build carries the condition.
const exclusionEnabled = true
