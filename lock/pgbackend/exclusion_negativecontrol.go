//go:build negativecontrol

package pgbackend

// takeoverSQL in the negative-control build (tests only, never released):
// another session's entry is taken over whether or not that session is
// live, so two live holders can exist and a test can show the
// linearizability check catch it.
const takeoverSQL = `cur.session_id <> sess.id`

// exclusionEnabled reports whether this build carries the condition.
const exclusionEnabled = false
